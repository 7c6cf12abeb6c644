"""The Kubernetes API client, configured once for every service that talks to the API server."""

from __future__ import annotations

import os
from typing import Any


def client_from(kubeconfig: str | None, in_cluster: bool) -> Any:
    """A CoreV1Api from a kubeconfig file or in-cluster config; None when neither is configured.

    In a pod (KUBERNETES_SERVICE_HOST set by the kubelet) the service account is used without a flag,
    which is how the Helm chart runs discovery and health.
    """
    from kubernetes import client, config

    if kubeconfig:
        return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    if in_cluster or os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.CoreV1Api()
    return None
