"""Which job a person means: its id, its exact name, or a unique prefix of its id (pure).

`chamber explain` and `chamber cancel` take any of these; an ambiguous or unknown reference is
answered with the candidates (or the closest ids), never a guess.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class JobRefError(ValueError):
    pass


def resolve(ref: str, jobs: Iterable[tuple[str, str]], *, most: int = 5) -> str:
    """The job id `ref` names among (id, name) pairs; JobRefError saying why not."""
    pairs = list(jobs)
    ids = {job_id for job_id, _ in pairs}
    if ref in ids:
        return ref
    for matches, what in (
        (sorted(job_id for job_id, name in pairs if name and name == ref), "named"),
        (sorted(job_id for job_id in ids if job_id.startswith(ref)), "whose id starts with"),
    ):
        if len(matches) == 1:
            return matches[0]
        if matches:
            shown = ", ".join(matches[:most]) + (f" and {len(matches) - most} more" if len(matches) > most else "")
            raise JobRefError(f"{len(matches)} jobs {what} {ref!r}: {shown}; give the full id")
    close = difflib.get_close_matches(ref, sorted(ids), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise JobRefError(f"no job {ref!r}{hint}")
