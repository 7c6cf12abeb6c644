"""`chamber agent --vendor / --amd-nodes`: the options, and an AMD node read end to end by the Agent."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from node_agent.agent import Agent, AgentOptions
from node_agent.amd_adapter import AmdUnavailable
from node_agent.spool import Kind
from services.cli import agent as cli
from services.cli.errors import UsageError
from tests.amd_sysfs_tree import write_amd_node


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["agent", *argv])


def test_amd_nodes_are_checked_against_the_fleet() -> None:
    opts = cli.options(parse("--simulate", "--nodes", "4", "--amd-nodes", "2"))
    assert (opts.amd_nodes, opts.amd_gpu_model, opts.vendor) == (2, "MI300X-192GB", "auto")
    with pytest.raises(UsageError, match="--amd-nodes must be between 0 and --nodes"):
        cli.options(parse("--simulate", "--nodes", "4", "--amd-nodes", "5"))
    with pytest.raises(UsageError, match="is not an AMD model"):
        cli.options(parse("--simulate", "--amd-nodes", "1", "--amd-gpu-model", "H100-80GB"))


def test_auto_reads_the_amd_gpus_sysfs_shows(tmp_path: Path) -> None:
    write_amd_node(tmp_path / "root", gpus=2)
    opts = AgentOptions(nats="nats://127.0.0.1:1", node="mi300-1", spool_dir=tmp_path / "spool",
                        sysfs_root=tmp_path / "root")  # fmt: skip
    agent = Agent(opts)
    records = agent.collect(1000.0)
    kinds = [r.kind for r in records]
    assert int(Kind.INVENTORY) in kinds and int(Kind.SAMPLE) in kinds
    assert agent.runners[0].facts.driver_version == "6.12.12" and agent.runners[0].facts.cuda_version is None
    agent.spool.close()


def test_forcing_amd_where_there_is_none_is_a_clear_error(tmp_path: Path) -> None:
    opts = AgentOptions(nats="nats://127.0.0.1:1", node="n", spool_dir=tmp_path / "spool", vendor="amd",
                        sysfs_root=tmp_path)  # fmt: skip
    with pytest.raises(AmdUnavailable, match="no AMD GPU here"):
        Agent(opts)
