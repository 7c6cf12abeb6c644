"""What the agent makes of repeated NCCL RAS queries (pure: statuses and times in, findings out).

- A hang: a RUNNING communicator whose collective counts are the same in HANG_QUERIES queries in a row
  (NCCL's RAS guide: "if the output does not change across subsequent RAS queries, it may indicate that
  the communicator is stuck"). Flagged on the third such query, i.e. within three query intervals.
- A MISMATCH (ranks at different operation counts) is normal while the counts still advance ("should not
  be a cause for concern, as long as the counts increase across repeated queries"): no finding.
- A dead peer (a DEAD section, `considered_dead`, or a MONITOR `PEER_DEAD`): reported once per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events.fabric import CommProgress, DeadPeer
from node_agent.ras import Peer, RasStatus

HANG_QUERIES = 3


@dataclass
class RasWatch:
    last_ops: dict[str, int] = field(default_factory=dict)
    frozen: dict[str, int] = field(default_factory=dict)  # comm -> queries in a row with the same counts
    reported_dead: set[tuple[str, int | None]] = field(default_factory=set)
    dead: list[DeadPeer] = field(default_factory=list)  # not yet handed to a sample
    comms: list[CommProgress] = field(default_factory=list)  # as of the latest query


def observe(w: RasWatch, status: RasStatus, t: float) -> None:
    """Fold one STATUS answer in."""
    comms = []
    for c in status.comms:
        if c.ops is not None:
            same = w.last_ops.get(c.comm) == c.ops
            w.frozen[c.comm] = w.frozen.get(c.comm, 1) + 1 if same else 1
            w.last_ops[c.comm] = c.ops
        frozen = w.frozen.get(c.comm, 0) if c.ops is not None else 0
        comms.append(
            CommProgress(
                comm=c.comm,
                ops=c.ops if c.ops is not None else -1,
                ranks=c.size,
                missing_ranks=c.missing_ranks,
                frozen_queries=frozen,
                status=c.status,
                errors=list(c.errors),
            )
        )
    live = {c.comm for c in status.comms}
    for gone in set(w.last_ops) - live:  # a communicator torn down starts over if it comes back
        w.last_ops.pop(gone, None)
        w.frozen.pop(gone, None)
    w.comms = comms
    for peer in status.dead:
        peer_dead(w, peer, t)


def peer_dead(w: RasWatch, peer: Peer, t: float) -> None:
    key = (peer.host, peer.pid)
    if key in w.reported_dead:
        return
    w.reported_dead.add(key)
    w.dead.append(DeadPeer(host=peer.host, pid=peer.pid, gpus=list(peer.gpus), seen_at=t))


def hung(c: CommProgress) -> bool:
    return c.frozen_queries >= HANG_QUERIES and c.ops >= 0 and c.status in ("RUNNING", "")


def take_dead(w: RasWatch) -> list[DeadPeer]:
    out, w.dead = w.dead, []
    return out
