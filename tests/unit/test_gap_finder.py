"""once.gaps.GapFinder over an in-memory job's rows (no database): the units it finds are the
ones a walk finds, in order both ways, and a gap in a long history costs few reads."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from once import gaps, outcomes
from once.ledger.records import beaten
from once.periods import Period, Schedule
from once.schedules import schedule

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class MemoryRows:
    """once.gaps.Rows over a dict of key -> (period start, status); counts its reads."""

    def __init__(self, sched: Schedule, rows: dict[str, tuple[datetime, str]]) -> None:
        self.sched, self.rows = sched, rows
        self.reads = 0

    def done_counts(self, stretches: Sequence[tuple[datetime, datetime]]) -> list[int]:
        assert len(stretches) <= gaps.SPLIT
        self.reads += 1
        return [sum(1 for at, st in self.rows.values() if st == "done" and a <= at < b)
                for a, b in stretches]

    def keys_at(self, starts: Sequence[datetime]) -> dict[datetime, set[str]]:
        self.reads += 1
        found: dict[datetime, set[str]] = {}
        for key, (at, _) in self.rows.items():
            if at in starts:
                found.setdefault(at, set()).add(key)
        return found

    def done_breaks(self, lo: datetime,
                    hi: datetime) -> tuple[datetime | None, list[tuple[datetime, datetime | None]]]:
        self.reads += 1
        done = sorted({at for at, st in self.rows.values() if st == "done" and lo <= at < hi})
        breaks = []
        for i, at in enumerate(done):
            end = self.sched.containing(at).end.astimezone(UTC)
            following = done[i + 1] if i + 1 < len(done) else None
            if following is None or following > end:
                breaks.append((end, following))
        return (done[0] if done else None), breaks

    def short_starts(self, lo: datetime, hi: datetime, shards: int,
                     limit: int) -> list[datetime]:
        self.reads += 1
        per_start: dict[datetime, int] = {}
        for at, _ in self.rows.values():
            if lo <= at < hi:
                per_start[at] = per_start.get(at, 0) + 1
        return sorted(at for at, n in per_start.items() if n < shards)[:limit]


def _history(sched: Schedule, count: int) -> list[Period]:
    periods = [sched.previous(sched.containing(NOW))]
    while len(periods) < count:
        periods.append(sched.previous(periods[-1]))
    return periods[::-1]


def _finder(sched: Schedule, shards: int, memory: MemoryRows) -> gaps.GapFinder:
    rows = memory.rows
    open_rows = [(at, key) for key, (at, st) in rows.items() if st != "done"]
    latest = max((at for at, _ in rows.values()), default=None)
    return gaps.GapFinder(sched, shards, memory, open_rows, latest)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("every", "cron", "shards"), [
    ("day", None, 1), ("hour", None, 3), (None, "30 2 * * *", 1), (None, "0 */6 * * *", 2),
])
def test_units_are_the_periods_without_a_row(seed: int, every: str | None, cron: str | None,
                                             shards: int) -> None:
    rng = random.Random(seed)
    sched = schedule(every, cron, "Europe/Paris")  # with DST changes in the history
    periods = _history(sched, rng.randrange(50, 400))
    rows: dict[str, tuple[datetime, str]] = {}
    for i, period in enumerate(periods):
        for key in gaps.shard_keys(period.key, shards):
            if i == 0 or rng.random() > 0.1:
                rows[key] = (period.start.astimezone(UTC),
                             rng.choices(["done", "failed", "running"], [30, 1, 1])[0])
    expected = [key for p in periods for key in gaps.shard_keys(p.key, shards)
                if key not in rows]
    memory = MemoryRows(sched, rows)
    finder = _finder(sched, shards, memory)
    lo, hi = periods[0].start.astimezone(UTC), periods[-1].end.astimezone(UTC)
    assert [key for _, key in finder.units(lo, hi)] == expected
    if every:
        assert [key for _, key in finder.units(lo, hi, len(expected), backwards=True)] == (
            expected[::-1])
        assert finder.deficit(lo, hi) == len(expected)


def test_one_gap_in_ten_thousand_hours_costs_a_few_reads() -> None:
    sched = schedule("hour", None, "UTC")
    periods = _history(sched, 10_000)
    rows = {p.key: (p.start.astimezone(UTC), "done") for p in periods}
    del rows[periods[4321].key]
    memory = MemoryRows(sched, rows)
    finder = _finder(sched, 1, memory)
    lo, hi = periods[0].start.astimezone(UTC), periods[-1].end.astimezone(UTC)
    assert [key for _, key in finder.units(lo, hi)] == [periods[4321].key]
    assert memory.reads <= 6  # the deficit, then about log8(10,000) splits


def test_the_stretch_after_the_latest_row_is_known_without_a_read() -> None:
    sched = schedule("day", None, "UTC")
    periods = _history(sched, 30)
    rows = {p.key: (p.start.astimezone(UTC), "done") for p in periods[:20]}
    memory = MemoryRows(sched, rows)
    finder = _finder(sched, 1, memory)
    lo, hi = periods[0].start.astimezone(UTC), periods[-1].end.astimezone(UTC)
    found = [key for _, key in finder.units(lo, hi, missing=10)]
    assert found == [p.key for p in periods[20:]] and memory.reads == 0


def test_a_cron_job_is_walked_forwards_only() -> None:
    sched = schedule(None, "0 3 * * *", "UTC")
    finder = _finder(sched, 1, MemoryRows(sched, {}))
    with pytest.raises(ValueError, match="forwards only"):
        list(finder.units(NOW - timedelta(days=3), NOW, backwards=True))


@pytest.mark.parametrize(("status", "attempt", "stale", "needs"), [
    ("failed", 1, False, True), ("failed", 3, False, False), ("running", 1, True, True),
    ("running", 1, False, False), ("done", 1, True, False),
])
def test_needs_run(status: str, attempt: int, stale: bool, needs: bool) -> None:
    row = gaps.OpenRow("2026-11-30", NOW, status, attempt, stale)
    assert gaps.needs_run(row, max_attempts=3) is needs


@pytest.mark.parametrize(("attempt", "interrupted", "left"), [
    (3, 0, 0),  # three failures: used up
    (3, 2, 2),  # two drains and one real failure: two failures left of --max-attempts 3
    (5, 2, 0),  # and then two more failures
    (8, 7, 1),  # interrupted nearly every time: the attempt cap (9) is near
    (9, 8, 0),  # the cap: a period interrupted for ever is not retried for ever
    (9, 9, 0),
])
def test_interrupted_attempts_keep_the_budget(attempt: int, interrupted: int,
                                               left: int) -> None:
    assert outcomes.attempts_left(attempt, interrupted, 3) == left
    row = gaps.OpenRow("2026-11-30", NOW, "failed", attempt, False, interrupted)
    assert gaps.needs_run(row, max_attempts=3) is (left > 0)
    holder = ("failed", attempt, 1, "them", 1.0, 300.0, interrupted)  # records.beaten's read
    assert beaten(holder, 3, rerun=False) is (left == 0)
    assert beaten(holder, 3, rerun=True) is False
