"""The chart puts the gateway's reads behind the API token by default (issue 16, finding 11)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy_tools import helm_binary
from tests.integration.test_deploy_chart import render

pytestmark = pytest.mark.integration


def gateway_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    [gateway] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("gateway")]
    [container] = gateway["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_reads_need_the_token_by_default_and_the_option_turns_it_off() -> None:
    helm = helm_binary()
    assert gateway_env(render(helm, []))["CHAMBER_API_PROTECT_READS"] == "true"
    off = render(helm, [], "services.gateway.protectReads=false")
    assert gateway_env(off)["CHAMBER_API_PROTECT_READS"] == "false"
