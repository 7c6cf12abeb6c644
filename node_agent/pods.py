"""Which Kubernetes pod a GPU process belongs to: `/proc/<pid>/cgroup` names the process's cgroup, and
the kubelet puts every container in a cgroup under its pod's (both cgroup drivers):

    systemd:  0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
              (the uid's dashes written as underscores)
    cgroupfs: 0::/kubepods/burstable/pod<uid>/<container id>

Where the kernel has the cgroup v2 `dmem` controller (Linux 6.14+), a pod's cgroup also says how much
device memory it holds (`dmem.current`: one "<region> <bytes>" line per device region).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_POD = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})(?:\.slice)?$"
)
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class PodRef:
    uid: str
    container_id: str | None
    cgroup: str  # the pod's cgroup path (under the cgroup v2 mount)


def pod_of_cgroup(text: str) -> PodRef | None:
    """The pod (and container) in a `/proc/<pid>/cgroup` file's text; None for a process outside pods."""
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or parts[0] != "0":  # the cgroup v2 line: "0::<path>"
            continue
        segments = [s for s in parts[2].split("/") if s]
        for i, seg in enumerate(segments):
            match = _POD.search(seg)
            if match and "kubepods" in parts[2]:
                uid = match.group(1).replace("_", "-")
                rest = segments[i + 1] if i + 1 < len(segments) else ""
                container = _CONTAINER.match(rest)
                return PodRef(uid, container.group(1) if container else None, "/" + "/".join(segments[: i + 1]))
    return None


def pod_of_pid(pid: int, proc_root: Path = Path("/proc")) -> PodRef | None:
    """The pod of a running process (None: not in a pod, gone, or not readable)."""
    try:
        return pod_of_cgroup((proc_root / str(pid) / "cgroup").read_text())
    except OSError:
        return None


def dmem_current(pod: PodRef, cgroup_root: Path = Path("/sys/fs/cgroup")) -> dict[str, int] | None:
    """Device memory the pod's cgroup holds per region (bytes); None without the dmem controller."""
    try:
        text = (cgroup_root / pod.cgroup.lstrip("/") / "dmem.current").read_text()
    except OSError:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        region, _, value = line.strip().rpartition(" ")
        if region and value.isdigit():
            out[region] = int(value)
    return out
