"""Prices per instance type and per cluster through the billing service's command, and a price table
imported with `chamber billing price import` (the CLI against a real nats-server and billing)."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import PriceSet
from services.billing import service as billing_service
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from tests.integration.test_billing_service import billing_events
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration
CHAMBER = str(Path(sys.executable).parent / "chamber")
TABLE = """
currency: EUR
gpu_models: {H100-80GB: 2.5}
instance_types:
  p5.48xlarge: {per_hour: 98.32, gpus: 8}
clusters:
  dc1: {capex: 3200000, years: 4, opex_per_year: 400000, gpus: 512}
"""


async def test_prices_by_instance_type_and_cluster_are_set_and_a_table_is_imported(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    stop = asyncio.Event()
    args = argparse.Namespace(nats=nats_server.url_for("billing"), period=3600.0, settle=0.0, tick=0.2, price=[])
    task = asyncio.create_task(billing_service.run(args, stop))
    try:
        reply = await eventually_reply(nc, {"instance_type": "a3-highgpu-8g", "price_per_gpu_hour": 11.06})
        assert reply["instance_type"] == "a3-highgpu-8g"
        for both in ({"gpu_model": "H100", "cluster": "c1"}, {}):
            with pytest.raises(CommandRefused, match="name exactly one of gpu_model"):
                await request(nc, "billing", "price", {**both, "price_per_gpu_hour": 1.0})

        (tmp_path / "prices.yaml").write_text(TABLE)
        done = await asyncio.to_thread(
            subprocess.run,
            [CHAMBER, "billing", "price", "import", str(tmp_path / "prices.yaml"), "--nats", nats_server.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "gpu_model H100-80GB: 2.5000 EUR per GPU-hour (per GPU-hour)",
            "instance_type p5.48xlarge: 12.2900 EUR per GPU-hour (98.32 per hour / 8 GPUs)",
            "cluster dc1: 0.2674 EUR per GPU-hour ((3.2e+06 / 4 years + 400000 a year) / 512 GPUs, amortised)",
        ]

        async def all_set() -> bool:
            return len([e for e in await billing_events(js) if isinstance(e, PriceSet)]) == 4

        await eventually(all_set, within=20)
        prices = [e for e in await billing_events(js) if isinstance(e, PriceSet)]
        scopes = {
            (e.gpu_model, e.instance_type, e.cluster): (round(e.price_per_gpu_hour, 4), e.currency) for e in prices
        }
        assert scopes == {
            ("", "a3-highgpu-8g", None): (11.06, "USD"),
            ("H100-80GB", None, None): (2.5, "EUR"),
            ("", "p5.48xlarge", None): (12.29, "EUR"),
            ("", None, "dc1"): (0.2674, "EUR"),
        }
    finally:
        stop.set()
        await task


async def eventually_reply(nc: Client, payload: dict[str, object]) -> dict[str, object]:
    """The first command may come before billing subscribed to its subject."""
    for _ in range(100):
        try:
            return await request(nc, "billing", "price", payload)  # type: ignore[no-any-return]
        except CommandUnavailable:  # not subscribed yet
            await asyncio.sleep(0.1)
    raise AssertionError("billing never answered")


def test_a_bad_price_table_is_refused_naming_the_entry(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("instance_types:\n  p5.48xlarge: {per_hour: 98.32}\n")
    done = subprocess.run(
        [CHAMBER, "billing", "price", "import", str(tmp_path / "bad.yaml"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "instance_types.p5.48xlarge: expected a number, {per_gpu_hour} or {per_hour, gpus}" in done.stderr
