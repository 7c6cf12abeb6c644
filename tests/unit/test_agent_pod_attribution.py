"""Per-process and per-pod GPU attribution in the NVML adapter: NVML's running processes (v3: pid, memory,
MIG instance ids) and per-process SM samples in pynvml's own structs, mapped to pods through a recorded
`/proc/<pid>/cgroup` tree (both kubelet cgroup drivers) and a recorded cgroup v2 `dmem.current`."""

from __future__ import annotations

from pathlib import Path

from node_agent.nvml_adapter import NvmlSampler
from node_agent.pods import PodRef, dmem_current, pod_of_cgroup
from tests.unit.fake_pynvml import MIB, FakeNvml

UID = "7c8d9e0f-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
CONTAINER = "3f" * 32
SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope\n"
)
CGROUPFS = f"0::/kubepods/besteffort/pod{UID}/{CONTAINER}\n"
HOST = "0::/system.slice/sshd.service\n"


def test_the_pod_is_read_from_either_cgroup_driver() -> None:
    systemd = pod_of_cgroup(SYSTEMD)
    assert systemd == PodRef(
        UID, CONTAINER, f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
    )
    cgroupfs = pod_of_cgroup(CGROUPFS)
    assert cgroupfs is not None and (cgroupfs.uid, cgroupfs.container_id) == (UID, CONTAINER)
    assert pod_of_cgroup(HOST) is None
    assert pod_of_cgroup("12:memory:/kubepods/podnot-a-uid\n") is None


def test_dmem_current_is_read_per_region_where_the_kernel_has_it(tmp_path: Path) -> None:
    pod = pod_of_cgroup(CGROUPFS)
    assert pod is not None
    assert dmem_current(pod, tmp_path) is None
    folder = tmp_path / pod.cgroup.lstrip("/")
    folder.mkdir(parents=True)
    (folder / "dmem.current").write_text("drm/0000:18:00.0/vram0 21474836480\ndrm/0000:28:00.0/vram0 0\n")
    assert dmem_current(pod, tmp_path) == {"drm/0000:18:00.0/vram0": 20 * 1024 * MIB, "drm/0000:28:00.0/vram0": 0}


def recorded_proc(root: Path) -> Path:
    for pid, text in {4242: SYSTEMD, 4243: HOST}.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return root


def test_processes_carry_their_pod_mig_instance_and_sm_share(tmp_path: Path) -> None:
    fake = FakeNvml(gpus=2)
    g0, g1 = fake.gpus
    g0.mig_ids = {4242: (1, 0)}
    g0.sm_samples = [(4242, 1_000, 35), (4242, 2_000, 41)]
    g1.processes = [(4243, 2048 * MIB, "sshd-gpu-probe")]
    sampler = NvmlSampler.open(fake, node="n1", watch_xids=False, proc_root=recorded_proc(tmp_path / "proc"))
    gpus = sampler.read("c1", 0, 0.0, 10.0).sample.gpus
    [p0] = gpus[0].processes
    assert (p0.pid, p0.used_memory_mib, p0.gpu_instance_id, p0.compute_instance_id) == (4242, 61_000, 1, 0)
    assert (p0.pod_uid, p0.container_id, p0.sm_util_pct) == (UID, CONTAINER, 41.0), "the newest sample"
    [p1] = gpus[1].processes
    assert (p1.pod_uid, p1.gpu_instance_id, p1.sm_util_pct) == (None, None, None)
    # The next read asks only for samples newer than those it has seen.
    g0.sm_samples.append((4242, 3_000, 12))
    [again] = sampler.read("c1", 1, 10.0, 10.0).sample.gpus[0].processes
    assert again.sm_util_pct == 12.0


def test_samples_carry_each_pods_device_memory_from_dmem_current(tmp_path: Path) -> None:
    """A recorded cgroupfs tree: the pod's dmem.current names two GPUs' regions; each GPU's sample carries
    what the pod holds on that GPU (its PCI address), and nothing where the kernel has no dmem."""
    fake = FakeNvml(gpus=2)
    g0, g1 = fake.gpus
    g1.processes = [(4242, 1024 * MIB, "train")]
    proc = recorded_proc(tmp_path / "proc")
    pod = pod_of_cgroup(SYSTEMD)
    assert pod is not None
    cgroups = tmp_path / "cgroup"
    without = NvmlSampler.open(fake, node="n1", watch_xids=False, proc_root=proc, cgroup_root=cgroups)
    assert [g.pod_memory for g in without.read("c1", 0, 0.0, 10.0).sample.gpus] == [[], []]
    folder = cgroups / pod.cgroup.lstrip("/")
    folder.mkdir(parents=True)
    bus0, bus1 = (g.bus_id[-12:].lower() for g in (g0, g1))
    (folder / "dmem.current").write_text(f"drm/{bus0}/vram0 {3 * 1024 * MIB}\ndrm/{bus1}/vram0 {5 * 1024 * MIB}\n")
    sampler = NvmlSampler.open(fake, node="n1", watch_xids=False, proc_root=proc, cgroup_root=cgroups)
    gpus = sampler.read("c1", 0, 0.0, 10.0).sample.gpus
    assert [(m.pod_uid, m.dmem_mib) for m in gpus[0].pod_memory] == [(UID, 3 * 1024)]
    assert [(m.pod_uid, m.dmem_mib) for m in gpus[1].pod_memory] == [(UID, 5 * 1024)]
