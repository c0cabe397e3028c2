"""The reports' gap finding against brute force: once.gaps counts the periods the engine walks,
and once.report finds exactly the missing keys a walk over every period finds, on random
SQLite ledgers (random schedules, zones, done/failed/running rows, shards)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from once import gaps, periods, report
from once.ledger import parse_url, schema, tables
from once.periods import Period
from once.schedules import schedule
from once.stored import shard_keys

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Havana",
         "Pacific/Apia", "Asia/Kathmandu", "America/Santiago", "Pacific/Chatham"]
SPECS = ["minute", "15m", "hour", "2h", "6h", "day", "week", "month", "quarter", "year"]
NOW = datetime(2026, 11, 29, 21, 37, tzinfo=UTC)


@pytest.mark.parametrize("seed", range(40))
def test_count_matches_the_engine(seed: int) -> None:
    rng = random.Random(seed)
    sched = schedule(rng.choice(SPECS), None, rng.choice(ZONES))
    first = sched.containing(datetime(rng.choice([1994, 2011, 2026]), 1, 1, tzinfo=UTC)
                             + timedelta(days=rng.randrange(365), minutes=rng.randrange(1440)))
    last = first
    for _ in range(rng.randrange(300)):
        last = sched.next(last)
    assert gaps.count(sched, first, last) == sum(1 for _ in sched.between(first, last))
    assert gaps.count_starts(sched, first.start, last.end) == gaps.count(sched, first, last)
    assert gaps.count(sched, last, first) == (1 if first == last else 0)


@pytest.mark.parametrize("seed", range(60))
def test_missing_periods_match_brute_force(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    spec, tz = rng.choice(SPECS[:6]), rng.choice(ZONES)
    cron = rng.random() < 0.2
    sched = schedule(None, "0 3 * * *", tz) if cron else schedule(spec, None, tz)
    shards = rng.choice([1, 1, 1, 3])
    due_last = sched.previous(sched.containing(NOW))
    periods = [due_last]
    for _ in range(rng.randrange(1, 400)):
        periods.append(sched.previous(periods[-1]))
    periods.reverse()
    # Rows: mostly done, with runs of gaps, some failed and running rows; the first period
    # always has a row (it is the job's first claim).
    rows: dict[str, tuple[Period, str]] = {}
    gap = 0
    for i, period in enumerate(periods):
        if i and gap == 0 and rng.random() < 0.05:
            gap = rng.randrange(1, 40)
        for key in shard_keys(period.key, shards):
            if i == 0 or (gap == 0 and rng.random() > 0.03):
                rows[key] = (period, rng.choices(["done", "failed", "running"], [20, 1, 1])[0])
        gap = max(0, gap - 1)
    if rng.random() < 0.3:  # the job stopped a while ago: a gap up to now
        for period in periods[-rng.randrange(1, len(periods) + 1):][1:]:
            for key in shard_keys(period.key, shards):
                rows.pop(key, None)
    url = f"sqlite:///{tmp_path}/ledger.db"
    seed_ledger(url, sched, shards, periods[0], rows)

    target = parse_url(url)
    with report.surveying(target) as snap:
        (state,) = report.survey(snap, snap.job_rows(None, None), NOW)
    expected = [(p.start.astimezone(UTC), key) for p in periods
                for key in shard_keys(p.key, shards)
                if key not in rows or (rows[key][1] == "running")]  # heartbeats are stale
    assert state.due_last == due_last
    assert state.missing == len(expected)
    assert state.missing_keys(report.LIST_LIMIT) == [k for _, k in expected][:report.LIST_LIMIT]
    no_row = [unit for unit in expected if unit[1] not in rows]
    assert state.no_row == len(no_row)
    assert state.no_row_listed == no_row[:report.LIST_LIMIT + 1]
    assert state.no_row_last == (no_row[-1] if no_row else None)


def seed_ledger(url: str, sched: object, shards: int, first: Period,
                rows: dict[str, tuple[Period, str]]) -> None:
    target = parse_url(url)
    schema.ensure(target)
    eng = schema.engine(target)
    old = datetime(2000, 1, 1, tzinfo=UTC)  # every heartbeat is stale
    with eng.begin() as conn:
        conn.execute(tables.jobs.insert().values(
            job="j", fence=1, fire_count=1, kind=sched.kind, schedule=sched.spec,  # type: ignore[attr-defined]
            tz=sched.tz_name, lag=0, max_attempts=9, stale_after=300.0,  # type: ignore[attr-defined]
            first_period_start=first.start.astimezone(UTC), created_at=old, last_fired_at=old,
            shards=shards))
        if rows:
            conn.execute(tables.runs.insert(), [
                {"job": "j", "period": key, "status": status, "attempt": 1, "fence": 1,
                 "owner": "t", "period_start": p.start.astimezone(UTC),
                 "period_end": p.end.astimezone(UTC), "started_at": old, "heartbeat_at": old,
                 "finished_at": None if status == "running" else old, "exit_code": 0}
                for key, (p, status) in rows.items()])
    eng.dispose()


def test_fixed_zones_have_no_offset_changes_to_probe() -> None:
    # gaps skips probing the zones tzdata gives one offset for all time: check that the probe
    # would have found none, over the years a ledger plausibly spans.
    from zoneinfo import ZoneInfo, available_timezones

    fixed = sorted(k for k in available_timezones() if gaps._fixed(ZoneInfo(k)))
    assert "UTC" in fixed and "Etc/GMT-14" in fixed and "Europe/London" not in fixed
    assert gaps._fixed(periods.zone("UTC"))  # datetime.UTC, not the zone file
    for key in fixed:
        for year in (2, 1970, 1999, 2026, 2037):
            assert gaps._changes_in_year(ZoneInfo(key), year) == (), (key, year)
