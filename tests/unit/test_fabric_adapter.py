"""The fabric adapter on recorded sysfs trees the tests create: rates per interval, resets and wraps
restart the rate, missing or unreadable files give empty fields, never a crash or a negative rate."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from events.fabric import LinkState
from node_agent.fabric_adapter import (
    FabricAdapter,
    eth_speed_gbps,
    ethtool_stats,
    ib_rate_gbps,
    ib_state,
    pause_frames,
    read_nccl_ras,
)


def write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def an_ib_port(root: Path, dev: str, *, port: int = 1, state: str = "4: ACTIVE", rate: str = "400 Gb/sec (4X NDR)",
               **counters: int) -> Path:  # fmt: skip
    d = root / "sys/class/infiniband" / dev / "ports" / str(port)
    write(d / "state", state)
    write(d / "phys_state", "5: LinkUp")
    write(d / "rate", rate)
    base = {"port_xmit_data": 0, "port_rcv_data": 0, "symbol_error": 0, "port_rcv_errors": 0, "link_downed": 0,
            "link_error_recovery": 0, "port_xmit_discards": 0, "port_xmit_wait": 0}  # fmt: skip
    for name, value in {**base, **counters}.items():
        write(d / "counters" / name, value)
    return d


def an_eth(root: Path, name: str, *, operstate: str = "up", speed: int = 400000, **stats: int) -> Path:
    d = root / "sys/class/net" / name
    write(d / "operstate", operstate)
    write(d / "speed", speed)
    write(d / "carrier_changes", stats.pop("carrier_changes", 2))
    (d / "device").mkdir(parents=True, exist_ok=True)
    for k, v in {"tx_bytes": 0, "rx_bytes": 0, "rx_errors": 0, "tx_errors": 0, **stats}.items():
        write(d / "statistics" / k, v)
    return d


def adapter(root: Path, **kw: object) -> FabricAdapter:
    return FabricAdapter(root=root, ethtool=None, **kw)  # type: ignore[arg-type]


def test_ib_counters_become_rates_per_interval_in_bytes(tmp_path: Path) -> None:
    d = an_ib_port(tmp_path, "mlx5_0", port_xmit_data=1000, port_rcv_data=500)
    a = adapter(tmp_path, rails={"mlx5_0/1": 0}, labels={"leaf": "leaf-1"})
    first = a.read("c", "n", 0, 100.0, 1.0)
    assert first is not None
    nic = first.nics[0]
    assert (nic.name, nic.state, nic.rate_gbps, nic.gpu_index) == ("mlx5_0/1", LinkState.UP, 400.0, 0)
    assert nic.tx_bytes_per_s is None and nic.errors is None  # no previous reading yet
    write(d / "counters/port_xmit_data", 1000 + 2_500)  # 4-byte words
    write(d / "counters/symbol_error", 3)
    write(d / "counters/link_downed", 1)
    write(d / "counters/port_xmit_wait", 70)
    second = a.read("c", "n", 1, 102.0, 1.0)
    assert second is not None
    nic = second.nics[0]
    assert nic.tx_bytes_per_s == 2_500 * 4 / 2.0
    assert nic.rx_bytes_per_s == 0.0
    assert (nic.errors, nic.flaps, nic.pause) == (3, 1, 70)
    assert second.labels == {"leaf": "leaf-1"}


def test_a_counter_that_goes_backwards_restarts_the_rate_never_negative(tmp_path: Path) -> None:
    d = an_ib_port(tmp_path, "mlx5_0", port_xmit_data=10_000, symbol_error=50)
    a = adapter(tmp_path)
    a.read("c", "n", 0, 0.0, 1.0)
    write(d / "counters/port_xmit_data", 10)  # driver reload: counters start over
    write(d / "counters/symbol_error", 0)
    after_reset = a.read("c", "n", 1, 1.0, 1.0)
    assert after_reset is not None
    assert after_reset.nics[0].tx_bytes_per_s is None and after_reset.nics[0].errors is None
    write(d / "counters/port_xmit_data", 20)
    resumed = a.read("c", "n", 2, 2.0, 1.0)
    assert resumed is not None and resumed.nics[0].tx_bytes_per_s == 40.0


def test_a_saturated_32_bit_counter_reads_as_unknown(tmp_path: Path) -> None:
    an_ib_port(tmp_path, "mlx5_0", port_xmit_data=2**32 - 1)
    a = adapter(tmp_path)
    a.read("c", "n", 0, 0.0, 1.0)
    sample = a.read("c", "n", 1, 1.0, 1.0)
    assert sample is not None and sample.nics[0].tx_bytes_per_s is None


def test_missing_and_unreadable_files_give_empty_fields(tmp_path: Path) -> None:
    d = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    write(d / "state", "1: DOWN")  # no rate, no counters at all
    d2 = an_ib_port(tmp_path, "mlx5_1", port_xmit_data=5)
    write(d2 / "counters/symbol_error", "garbage")
    (d2 / "counters/port_rcv_data").unlink()
    if os.geteuid() != 0:  # root reads anything: the permission case needs a normal user
        (d2 / "counters/port_xmit_discards").chmod(0)
    a = adapter(tmp_path)
    a.read("c", "n", 0, 0.0, 1.0)
    sample = a.read("c", "n", 1, 1.0, 1.0)
    assert sample is not None
    down, other = sample.nics
    assert (down.state, down.rate_gbps, down.tx_bytes_per_s, down.errors) == (LinkState.DOWN, None, None, None)
    assert other.rx_bytes_per_s is None and other.tx_bytes_per_s == 0.0
    assert other.errors == 0  # the readable error counters still count
    if os.geteuid() != 0:
        assert other.discards is None


def test_ethernet_interfaces_skip_virtual_ones_and_count_flaps_from_carrier_changes(tmp_path: Path) -> None:
    d = an_eth(tmp_path, "eth0", tx_bytes=0, carrier_changes=2)
    write(tmp_path / "sys/class/net/lo/operstate", "unknown")  # no `device`: virtual
    a = adapter(tmp_path)
    a.read("c", "n", 0, 0.0, 1.0)
    write(d / "statistics/tx_bytes", 5_000)
    write(d / "carrier_changes", 6)  # two more flaps (down + up each)
    write(d / "operstate", "down")
    sample = a.read("c", "n", 1, 1.0, 1.0)
    assert sample is not None and [n.name for n in sample.nics] == ["eth0"]
    nic = sample.nics[0]
    assert (nic.kind, nic.state, nic.rate_gbps, nic.tx_bytes_per_s, nic.flaps) == (
        "eth",
        LinkState.DOWN,
        400.0,
        5000.0,
        2,
    )


def test_ports_are_ordered_naturally_and_a_node_without_nics_sends_nothing(tmp_path: Path) -> None:
    assert adapter(tmp_path).read("c", "n", 0, 0.0, 1.0) is None
    for i in (10, 2, 1):
        an_ib_port(tmp_path, f"mlx5_{i}")
    sample = adapter(tmp_path).read("c", "n", 0, 0.0, 1.0)
    assert sample is not None and [(n.index, n.name) for n in sample.nics] == [
        (0, "mlx5_1/1"), (1, "mlx5_2/1"), (2, "mlx5_10/1"),
    ]  # fmt: skip


def test_roce_pause_frames_come_from_the_netdev_driver_statistics(tmp_path: Path) -> None:
    d = an_ib_port(tmp_path, "mlx5_0", port_xmit_wait=999)
    (tmp_path / "sys/class/infiniband/mlx5_0/device/net/eth2").mkdir(parents=True)
    counts = {"rx_prio3_pause": 10, "tx_prio3_pause": 5, "rx_bytes": 1}
    a = FabricAdapter(root=tmp_path, ethtool=lambda ifname: dict(counts) if ifname == "eth2" else None)
    a.read("c", "n", 0, 0.0, 1.0)
    counts["rx_prio3_pause"] = 40
    sample = a.read("c", "n", 1, 1.0, 1.0)
    assert sample is not None and sample.nics[0].pause == 30
    assert d.exists()


def test_parsers() -> None:
    assert ib_state("4: ACTIVE") is LinkState.UP
    assert ib_state("2: INIT") is LinkState.INIT
    assert ib_state("") is LinkState.UNKNOWN
    assert ib_rate_gbps("200 Gb/sec (4X HDR)") == 200.0
    assert ib_rate_gbps("garbage") is None
    assert eth_speed_gbps("-1") is None and eth_speed_gbps("100000") == 100.0
    assert pause_frames({"rx_pause_ctrl_phy": 3, "tx_pause_ctrl_phy": 4, "rx_bytes": 9}) == 7
    assert pause_frames({"rx_bytes": 9}) is None and pause_frames(None) is None


def test_ethtool_statistics_of_an_interface_without_them_is_none() -> None:
    # The real ioctl: the loopback driver offers no statistics; a missing interface neither.
    assert ethtool_stats("lo") is None
    assert ethtool_stats("nosuchif0") is None


def test_an_unreachable_nccl_ras_is_skipped_with_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert read_nccl_ras(port=port, timeout_s=0.2) is None
    an_ib_port(tmp_path, "mlx5_0")
    a = FabricAdapter(root=tmp_path, ethtool=None, ras=lambda: read_nccl_ras(port=port, timeout_s=0.2))
    for seq in range(3):
        sample = a.read("c", "n", seq, float(seq), 1.0)
        assert sample is not None and sample.comms == []
    assert a._ras_failed


def test_an_old_nccl_ras_that_answers_in_text_is_skipped() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        import threading

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"ERROR: unknown command SET\n")

        t = threading.Thread(target=answer)
        t.start()
        assert read_nccl_ras(port=port, timeout_s=2.0) is None
        t.join()


def test_nics_that_appear_after_a_sample_found_none_are_read_from_the_next_sample(tmp_path: Path) -> None:
    """A missing NIC directory is not listed again until it exists (no failing listing every sample),
    and once it does, the same adapter reads its ports at the next sample."""
    fabric = adapter(tmp_path)
    assert fabric.read("c", "n", 0, 0.0, 1.0) is None
    assert fabric.read("c", "n", 1, 1.0, 1.0) is None
    an_ib_port(tmp_path, "mlx5_0")
    an_eth(tmp_path, "eth0")
    sample = fabric.read("c", "n", 2, 2.0, 1.0)
    assert sample is not None and [n.name for n in sample.nics] == ["mlx5_0/1", "eth0"]
