"""A job by its id, its exact name or a unique id prefix; ambiguity and typos answered, never guessed."""

from __future__ import annotations

import pytest

from services.scheduler.jobref import JobRefError, resolve

JOBS = [("train-1-ab12", "train-1"), ("train-2-cd34", "train-2"), ("sweep-9-ef56", "sweep"), ("sweep-10-0a0a", "sweep")]


def test_an_id_a_name_or_a_unique_prefix_names_one_job() -> None:
    assert resolve("train-1-ab12", JOBS) == "train-1-ab12"
    assert resolve("train-2", JOBS) == "train-2-cd34"  # its name
    assert resolve("sweep-9", JOBS) == "sweep-9-ef56"  # a prefix of one id


def test_an_ambiguous_reference_lists_the_candidates_and_a_typo_gets_a_suggestion() -> None:
    with pytest.raises(JobRefError, match=r"2 jobs named 'sweep': sweep-10-0a0a, sweep-9-ef56; give the full id"):
        resolve("sweep", JOBS)
    with pytest.raises(JobRefError, match=r"2 jobs whose id starts with 'train-'"):
        resolve("train-", JOBS)
    with pytest.raises(JobRefError, match=r"no job 'train-1-ab13'; did you mean train-1-ab12, train-2-cd34\?"):
        resolve("train-1-ab13", JOBS)
    with pytest.raises(JobRefError, match=r"^no job 'zzz'$"):
        resolve("zzz", JOBS)
