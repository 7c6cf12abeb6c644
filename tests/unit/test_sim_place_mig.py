"""`chamber sim place` with MIG: optional `mig` node and `mig_profile` arrival columns, the start slice in
the answer, and bad MIG rows refused with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.tracesim.place import PlaceInputError, read_arrivals, read_nodes, replay


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_mig_arrivals_land_on_mig_gpus_with_their_start_slice(tmp_path: Path) -> None:
    nodes = read_nodes(
        write(
            tmp_path / "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model,mig\nm1,64000,512000,1,H100-80GB,1\np1,64000,512000,1,H100-80GB,\n",
        )
    )
    pods = read_arrivals(
        write(
            tmp_path / "a.csv",
            "arrival_idx,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,mig_profile\n"
            "0,a,1000,1024,1,,,4g.40gb\n1,b,1000,1024,1,,,3g.40gb\n2,c,1000,1024,1,1000,,\n3,d,1000,1024,1,,,1g.10gb\n",
        )
    )
    assert replay(nodes, pods, "chamber").placements == [["m1", [0], 0], ["m1", [0], 4], ["p1", [0]], None]


@pytest.mark.parametrize(
    ("nodes", "arrival", "message"),
    [
        ("m1,1000,1000,1,T4,yes", "0,a,0,0,1,,,1g.10gb", "has no MIG table"),
        ("m1,1000,1000,1,H100-80GB,1", "0,a,0,0,2,,,1g.10gb", "one instance"),
        ("m1,1000,1000,1,H100-80GB,1", "0,a,0,0,1,,T4,1g.10gb", "among T4 has MIG profile"),
    ],
)
def test_bad_mig_rows_are_refused(tmp_path: Path, nodes: str, arrival: str, message: str) -> None:
    with pytest.raises(PlaceInputError, match=message):
        read_nodes(write(tmp_path / "n.csv", f"sn,cpu_milli,memory_mib,gpu,model,mig\n{nodes}\n"))
        read_arrivals(
            write(
                tmp_path / "a.csv",
                f"arrival_idx,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,mig_profile\n{arrival}\n",
            )
        )
