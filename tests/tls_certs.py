"""A throwaway CA and a server certificate for 127.0.0.1, made with openssl, for the webhook tests."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certificates(d: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"),
             "-days", "1", "-subj", "/CN=chamber-test-ca")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "tls.key"), "-out", str(d / "tls.csr"),
             "-subj", "/CN=chamber-webhook")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", str(d / "tls.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-out", str(d / "tls.crt"), "-days", "1", "-extfile", str(d / "san.ext"))  # fmt: skip
    return d / "ca.crt", d / "tls.crt", d / "tls.key"
