"""The webhook re-reads its certificate when the files change (cert-manager renewal, or the chart's
new CA on upgrade): new connections get the new certificate, signed by the new CA, without a restart."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from pathlib import Path

import pytest
from aiohttp import web

from services.webhook.service import Files, app
from tests.tls_certs import make_certificates

pytestmark = pytest.mark.integration


def _peer_certificate(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


async def test_a_rotated_certificate_is_served_to_new_connections(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    ca1, cert1, key1 = make_certificates(first)
    ca2, cert2, key2 = make_certificates(second)
    live = tmp_path / "live"
    live.mkdir()
    (live / "tls.crt").write_bytes(cert1.read_bytes())
    (live / "tls.key").write_bytes(key1.read_bytes())
    files = Files(live / "tls.crt", live / "tls.key", None)
    runner = web.AppRunner(app(files), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=files.ssl)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        before = await asyncio.to_thread(_peer_certificate, port, ca1)
        # the Secret's files are replaced, as the kubelet does when cert-manager or `helm upgrade` rewrites it
        (live / "tls.crt").write_bytes(cert2.read_bytes())
        (live / "tls.key").write_bytes(key2.read_bytes())
        stamp = os.stat(live / "tls.crt").st_mtime + 1
        os.utime(live / "tls.crt", (stamp, stamp))
        files.refresh()
        after = await asyncio.to_thread(_peer_certificate, port, ca2)  # verifies against the new CA only
        assert after != before
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.to_thread(_peer_certificate, port, ca1)
    finally:
        await runner.cleanup()
