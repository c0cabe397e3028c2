"""once.frozen.Frozen, the base of the hot path's records, behaves as @dataclass(frozen=True)
did for them: equality and hash by the fields in order, the same repr, no assignment."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from once.ledger import Claim, Job, Target
from once.ledger.dialects import named
from once.periods import Period
from once.run.flow import Result


@dataclass(frozen=True)
class DataJob:  # Job as it was
    name: str
    kind: str
    schedule: str
    tz: str
    lag: int = 0
    max_attempts: int = 3
    stale_after: float = 300.0
    shards: int = 1
    no_overlap: bool = False


def test_a_record_reads_equals_hashes_and_shows_like_the_dataclass() -> None:
    job = Job("j", "every", "day", "UTC", shards=2)
    old = DataJob("j", "every", "day", "UTC", shards=2)
    assert (job.name, job.lag, job.max_attempts, job.stale_after, job.shards) == (
        "j", 0, 3, 300.0, 2)
    assert repr(job) == repr(old).replace("DataJob", "Job")
    assert hash(job) == hash(old)
    assert job == Job("j", "every", "day", "UTC", 0, 3, 300.0, 2, False)
    assert job != Job("j", "every", "day", "UTC")
    assert job != old and job != ("j", "every", "day", "UTC", 0, 3, 300.0, 2, False)
    assert len({job, Job("j", "every", "day", "UTC", shards=2)}) == 1


def test_a_record_is_frozen() -> None:
    claim = Claim(False, 2, 7, "done", "host:1")
    with pytest.raises(AttributeError):
        claim.won = True  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del claim.owner
    assert claim == Claim(False, 2, 7, "done", "host:1") and claim.skip_reason == "skipped-done"


def test_a_record_copies_and_pickles() -> None:
    start = datetime(2026, 12, 1, tzinfo=UTC)
    period = Period("2026-12-01", start, start.replace(day=2))
    assert copy.copy(period) == period == pickle.loads(pickle.dumps(period))
    assert pickle.loads(pickle.dumps(Result("done", 0, b"out"))) == Result("done", 0, b"out")


def test_a_target_gets_its_own_connect_args() -> None:
    sqlite = named("sqlite")
    a, b = Target(sqlite, "sqlite:///a", "sqlite:///a"), Target(sqlite, "sqlite:///b", "b")
    assert a.connect_args == {} and a.connect_args is not b.connect_args
    with pytest.raises(TypeError):  # a dict field: unhashable, as the dataclass was
        hash(a)
