"""`once metrics`, once serve's `/metrics` and `/api/status` read from counts are the full
read's numbers, on every backend: a ledger seeded with SQL with what the counts could get
wrong (gaps, failed rows with attempts left and without, interrupted attempts, stale, live and
overrunning attempts, shards, --no-overlap, --lag, cron schedules across summer time, a
job with no row in its due range and one with no row at all, jobs that stopped together, an
unreadable zone, reruns, takeovers, `once state --set` records, a namespace, lead names of
`once lead`) is read the fast way and the full way in turn at one pinned instant, and every
metric and every field must agree.

The full read is what these reads were before they counted: every job surveyed in full,
each on its own (survey, complete, its gap search), and every attempt's row read and counted
here, in Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import pytest

import once
from helpers import run_here
from ledger_sql import db_time, placeholders, query
from once import report
from once.ledger import parse_url, schema
from once.ledger.fleet import Snapshot
from once.periods import Period
from once.report.model import AttemptCounts
from once.schedules import schedule
from once.serve import status as api
from serving import ServedHere

HOUR = timedelta(hours=1)


# -- the seeded ledger ------------------------------------------------------------------------


@dataclass
class Seed:
    """Rows of once_jobs, once_runs and once_attempts, written in bulk (write)."""

    now: datetime
    jobs: list[tuple[Any, ...]] = field(default_factory=list)
    runs: list[tuple[Any, ...]] = field(default_factory=list)
    attempts: list[tuple[Any, ...]] = field(default_factory=list)
    fence: int = 0

    def job(self, name: str, spec: str | None = None, cron: str | None = None,
            tz: str = "UTC", back: int = 10, lag: int = 0, max_attempts: int = 3,
            shards: int = 1, no_overlap: int = 0, zone: str | None = None) -> list[Period]:
        """A job whose first period is `back` periods before the current one; its periods,
        oldest first (the current one last). zone: the zone stored, if not tz's."""
        sched = schedule(spec, cron, tz)
        periods = [sched.containing(self.now)]
        while len(periods) <= back:
            periods.append(sched.previous(periods[-1]))
        periods.reverse()
        self.jobs.append((name, "cron" if cron else "every", cron or spec, zone or tz, lag,
                          max_attempts, 300.0, 7 * back + 3, periods[0].start, shards,
                          no_overlap))
        return periods

    def run(self, job: str, period: Period, key: str | None = None, status: str = "done",
            attempt: int = 1, started: datetime | None = None,
            heartbeat: datetime | None = None, interrupted: int = 0,
            reason: str | None = None, output: str | None = None,
            earlier: str = "failed") -> None:
        """A once_runs row and its attempts: the earlier ones `earlier` (the first
        `interrupted` of them interrupted), the last one the row's."""
        start = (started or period.end).astimezone(UTC)
        finish = None if status == "running" else start + timedelta(seconds=42)
        for n in range(1, attempt + 1):
            self.fence += 1
            last = n == attempt
            state = status if last else earlier
            outcome = {"done": "done", "failed": "failed"}.get(state)
            if n <= interrupted:
                outcome = "interrupted"
            self.attempts.append((job, key or period.key, n, self.fence, "seed", state,
                                  start, None if state == "running" else finish,
                                  {"done": 0, "failed": 1}.get(state), outcome,
                                  reason if last else None, output if last else None))
        self.runs.append((job, key or period.key, status, attempt, self.fence, "seed",
                          period.start, period.end, start,
                          heartbeat or finish or start, finish,
                          {"done": 0, "failed": 1}.get(status), interrupted))

    def done(self, job: str, periods: list[Period], skip: set[int] = frozenset(),
             shards: int = 1) -> None:
        for i, p in enumerate(periods):
            if i not in skip:
                for k in range(shards):
                    self.run(job, p, f"{p.key}#{k}" if shards > 1 else None)

    def state_set(self, job: str, versions: int) -> None:
        """`once state --set` records: attempts of the period (state), which ran nothing."""
        for n in range(1, versions + 1):
            self.fence += 1
            self.attempts.append((job, "(state)", n, self.fence, "seed", "done", self.now,
                                  self.now, None, "state-set", f"state set: {n}", None))

    def write(self, url: str) -> None:
        schema.ensure(parse_url(url))
        at = lambda v: db_time(url, v) if isinstance(v, datetime) else v  # noqa: E731
        _insert(url, "INSERT INTO once_jobs (job, kind, schedule, tz, lag, max_attempts, "
                     "stale_after, fire_count, first_period_start, shards, no_overlap, fence, "
                     "created_at, last_fired_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                     "?)", [(*map(at, j), self.fence + 1, at(self.now), at(self.now))
                            for j in self.jobs])
        _insert(url, "INSERT INTO once_runs (job, period, status, attempt, fence, owner, "
                     "period_start, period_end, started_at, heartbeat_at, finished_at, "
                     "exit_code, interrupted, claim_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                     "?, ?, ?, 'seed')", [tuple(map(at, r)) for r in self.runs])
        _insert(url, "INSERT INTO once_attempts (job, period, attempt, fence, owner, status, "
                     "started_at, finished_at, exit_code, outcome, reason, output, claim_id) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'seed')",
                [tuple(map(at, a)) for a in self.attempts])


def _insert(url: str, sql: str, rows: list[tuple[Any, ...]]) -> None:
    target = parse_url(url)
    sql = placeholders(sql, url)
    if target.dialect == "sqlite":
        import sqlite3

        conn = sqlite3.connect(target.path)
        with conn:
            conn.executemany(sql, rows)
        conn.close()
    elif target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.connect_args["conninfo"], autocommit=True) as pg:
            pg.cursor().executemany(sql, rows)
    else:
        import pymysql

        my = pymysql.connect(**target.connect_args, autocommit=True)
        try:
            my.cursor().executemany(sql, rows)
        finally:
            my.close()


def _offset_changes(periods: list[Period]) -> list[int]:
    """The indexes of the periods across which the zone's UTC offset changes."""
    return [i for i, p in enumerate(periods) if p.start.utcoffset() != p.end.utcoffset()]


def seed(url: str) -> int:
    """Every case, in one ledger; how many hours of hourly-berlin have no row."""
    now = datetime.now(UTC)
    s = Seed(now)
    daily = s.job("daily", "day", back=30)
    s.done("daily", daily, skip={25})
    s.run("daily", daily[25], attempt=2, reason="once rerun", earlier="done")  # a rerun
    s.state_set("daily", 3)
    # An hour in Berlin for 216 days: across a change of summer time (at most 215 days apart),
    # with a gap about it and gaps elsewhere, a failed and an interrupted period near the end.
    hourly = s.job("hourly-berlin", "hour", tz="Europe/Berlin", back=24 * 216)
    change = next(i for i in _offset_changes(hourly) if 10 < i < len(hourly) - 10)
    gaps = {100, 101, 102, 2000, *range(change - 2, change + 3)}
    s.done("hourly-berlin", hourly[:-5], skip=gaps)
    s.run("hourly-berlin", hourly[-5], status="failed", output="step 1\nboom\n")
    s.run("hourly-berlin", hourly[-4], status="failed", attempt=2, interrupted=1)
    s.done("hourly-berlin", hourly[-3:])
    failing = s.job("failing", "day", back=20)
    s.done("failing", failing, skip={17, 14, 12})
    s.run("failing", failing[17], status="failed", output="starting\nboom: disk full\n\n")
    s.run("failing", failing[14], status="failed", attempt=3)  # failed out
    s.run("failing", failing[12], status="failed", attempt=2, interrupted=1)
    stale = s.job("stale", "hour", back=48)
    s.done("stale", stale, skip={43, 48})
    s.run("stale", stale[43], status="running", heartbeat=now - 2 * HOUR)  # due and stale
    s.run("stale", stale[48], status="running", started=now - 20 * HOUR,
          heartbeat=now - HOUR)  # stale, not due yet
    overrun = s.job("overrun", "hour", back=10)
    s.done("overrun", overrun, skip={7, 10})
    s.run("overrun", overrun[7], status="running", started=now - 5 * HOUR,
          heartbeat=now - timedelta(seconds=10))  # live, run longer than its hour: overrun
    s.run("overrun", overrun[10], status="running", started=now - timedelta(minutes=1),
          heartbeat=now)  # live, the current period
    sharded = s.job("sharded", "day", back=10, shards=3)
    s.done("sharded", sharded, skip={4, 6, 10}, shards=3)
    for k in (0, 2):
        s.run("sharded", sharded[4], f"{sharded[4].key}#{k}")  # shard 1 missing
    for k in (0, 1):
        s.run("sharded", sharded[10], f"{sharded[10].key}#{k}")  # the current period
    held = s.job("no-overlap", "hour", back=12, no_overlap=1)
    s.done("no-overlap", held[:4])
    s.run("no-overlap", held[4], status="running", started=now - timedelta(minutes=10),
          heartbeat=now)  # holds back the periods after it: not missing
    lagged = s.job("lagged", "day", back=10, lag=2)
    s.done("lagged", lagged[:-2], skip={6})
    ny = s.job("cron-ny", cron="30 1 * * *", tz="America/New_York", back=400)
    fall = set(_offset_changes(ny))
    s.done("cron-ny", ny[:-1], skip={i for i in range(len(ny)) if i % 37 == 5} | fall)
    berlin = s.job("cron-berlin", cron="30 2 * * 1-5", tz="Europe/Berlin", back=300, shards=2)
    s.done("cron-berlin", berlin, skip={i for i in range(len(berlin)) if i % 29 == 3} | {
        len(berlin) - 1, len(berlin) - 20, len(berlin) - 50}, shards=2)
    s.run("cron-berlin", berlin[-20], f"{berlin[-20].key}#0")  # a period short of a shard
    s.run("cron-berlin", berlin[-50], f"{berlin[-50].key}#1", status="failed",
          output="no\n")
    soon = s.job("not-due", "day", back=0, lag=1)  # its first period is the current one
    s.run("not-due", soon[0], status="running", started=now, heartbeat=now)
    s.job("never-done", "day", back=5)  # no row at all
    taken = s.job("takeover", "day", back=5)
    s.done("takeover", taken, skip={3})
    s.run("takeover", taken[3], attempt=2)
    s.attempts[-2] = (*s.attempts[-2][:5], "running", *s.attempts[-2][6:7], None, None, None,
                      None, None)  # attempt 1 never finished: taken over
    lost = s.job("bad-zone", "day", back=3, zone="Nowhere/Atlantis")
    s.done("bad-zone", lost)
    batch = s.job("prod:batch", "day", back=5)
    s.done("prod:batch", batch, skip={2})
    for name, shards in (("stopped-a", 1), ("stopped-b", 1), ("stopped-c", 1),
                         ("stopped-d", 2)):
        # Stopped together, 30 hours ago: their missing hours all after their latest rows,
        # listed once for a and b (the same stretch), apart for d (its shards); c has an
        # earlier gap too.
        stopped = s.job(name, "hour", back=60, shards=shards)
        s.done(name, stopped[:30], skip={10} if name == "stopped-c" else set(), shards=shards)
    s.write(url)
    return len(gaps)


# -- the full read ----------------------------------------------------------------------------


def counted_by_hand(url: str, names: list[str]) -> dict[str, AttemptCounts]:
    """Every attempt's row, counted here as once_runs_total and its siblings say."""
    found = {n: AttemptCounts() for n in names}
    for job, period, attempt, status, reason, outcome in query(
            url, "SELECT job, period, attempt, status, reason, outcome FROM once_attempts"):
        if job not in found or period == "(state)":
            continue
        counts = found[job]
        counts.by_status[status] = counts.by_status.get(status, 0) + 1
        counts.later += attempt > 1 and reason is None
        counts.reruns += reason is not None
        counts.interrupted += outcome == "interrupted"
    return found


def full_metrics(url: str, namespace: str | None) -> str:
    with Snapshot.open(parse_url(url)) as snap:
        states = full_states(snap, namespace)
        counts = counted_by_hand(url, [s.name for s in states])
        return report.exposition(states, counts, report.read_figures(snap, namespace))


def full_states(snap: Snapshot, namespace: str | None) -> list[report.JobState]:
    """Every job surveyed in full, each on its own."""
    now = snap.db_now()
    return [report.survey(snap, [row], now)[0] for row in snap.job_rows(None, namespace)]


def full_status(url: str) -> str:
    target = parse_url(url)
    with Snapshot.open(target) as snap:
        page = api.Page(full_states(snap, None), 0, snap.standby())
    return api.body(page, target.redacted)


def samples(text: str) -> dict[str, float]:
    """Each sample line's value, by the line's name and labels."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def same_metrics(fast: str, full: str) -> None:
    """Every sample the same; a released lead name's time without a leader grows between
    the reads, by the database's clock: within a few seconds."""
    timed = ("once_lead_leaderless_seconds", "once_lead_leaderless_time_seconds_total")
    assert [x for x in fast.splitlines() if not x.startswith(timed)] == [
        x for x in full.splitlines() if not x.startswith(timed)]
    mine, theirs = samples(fast), samples(full)
    assert mine.keys() == theirs.keys()
    assert all(abs(mine[k] - theirs[k]) < 5 for k in mine if k.startswith(timed))


# -- the tests --------------------------------------------------------------------------------


class Seeded(NamedTuple):
    url: str
    hourly_gaps: int  # hours of hourly-berlin without a row


@pytest.fixture
def seeded(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Seeded]:
    """The seeded ledger with two lead names (one released, one held), read at one instant
    (the snapshots' clock pinned: the fast and the full read judge by the same now)."""
    hourly_gaps = seed(ledger_url)
    with once.lead("released", db=ledger_url, lease=3):
        pass
    with Snapshot.open(parse_url(ledger_url)) as snap:
        pinned = snap.db_now()
    monkeypatch.setattr(Snapshot, "db_now", lambda _self: pinned)
    with once.lead("held", db=ledger_url, lease=60):
        yield Seeded(ledger_url, hourly_gaps)


def test_the_attempts_counted_are_every_attempts(seeded: Seeded) -> None:
    with Snapshot.open(parse_url(seeded.url)) as snap:
        names = [row.job for row in snap.job_rows(None, None)]
        counts = report.attempt_counts(snap, names)
    assert counts == counted_by_hand(seeded.url, names)
    if parse_url(seeded.url).dialect in ("sqlite", "postgresql"):  # without the index: slower
        query(seeded.url, "DROP INDEX once_attempts_unusual")
        with Snapshot.open(parse_url(seeded.url)) as snap:
            assert report.attempt_counts(snap, names) == counts
    assert counts["daily"].by_status == {"done": 32} and counts["daily"].reruns == 1
    assert counts["failing"].interrupted == 1 and counts["failing"].later == 3
    assert counts["takeover"].by_status == {"done": 6, "running": 1}


def test_metrics_are_the_full_reads(seeded: Seeded, once_env: dict[str, str]) -> None:
    env = {**once_env, "ONCE_DATABASE_URL": seeded.url}
    full = full_metrics(seeded.url, None)
    printed = run_here("metrics", env=env)
    assert printed.returncode == 0, printed.stderr
    same_metrics(printed.stdout, full)
    server = ServedHere(env=env)
    try:
        answer = server.get("/metrics")
        assert answer.status == 200
        same_metrics(answer.text, full)
        status = server.get("/api/status")
        assert status.status == 200
        assert status.text == full_status(seeded.url)
    finally:
        server.stop()
    found = samples(full)
    job = 'once_job="{}"'.format
    # The cases are what they are meant to be (else agreeing would prove little).
    assert found[f"once_missing_periods{{{job('hourly-berlin')}}}"] == seeded.hourly_gaps
    assert found[f"once_missing_periods{{{job('stale')}}}"] == 1
    assert found[f"once_stale_attempts{{{job('stale')}}}"] == 2
    assert found[f"once_overrun_attempts{{{job('overrun')}}}"] == 1
    assert found[f"once_missing_periods{{{job('sharded')}}}"] == 1 + 3
    assert found[f"once_missing_periods{{{job('no-overlap')}}}"] == 0
    assert found[f"once_missing_periods{{{job('lagged')}}}"] == 1
    assert found[f"once_missing_periods{{{job('never-done')}}}"] == 5
    assert found[f"once_missing_periods{{{job('stopped-a')}}}"] == 30
    assert found[f"once_missing_periods{{{job('stopped-b')}}}"] == 30
    assert found[f"once_missing_periods{{{job('stopped-c')}}}"] == 31
    assert found[f"once_missing_periods{{{job('stopped-d')}}}"] == 60
    assert found[f"once_missing_periods{{{job('not-due')}}}"] == 0
    assert found[f"once_failed_out_periods{{{job('failing')}}}"] == 1
    assert found[f"once_failed_periods{{{job('failing')}}}"] == 3
    assert found[f"once_missing_periods{{{job('cron-ny')}}}"] > 10
    assert found[f"once_missing_periods{{{job('cron-berlin')}}}"] > 10
    assert f"once_job_info{{{job('bad-zone')},kind=\"every\"" in full
    assert found['once_lead_term{lead="held"}'] == 1
    assert found['once_lead_leaderless_seconds{lead="released"}'] > 0


def test_metrics_of_a_namespace_are_the_full_reads(seeded: Seeded,
                                                   once_env: dict[str, str]) -> None:
    env = {**once_env, "ONCE_DATABASE_URL": seeded.url, "ONCE_NAMESPACE": "prod"}
    printed = run_here("metrics", env=env)
    assert printed.returncode == 0, printed.stderr
    same_metrics(printed.stdout, full_metrics(seeded.url, "prod"))
    assert 'once_job="prod:batch"' in printed.stdout and '"daily"' not in printed.stdout


def test_status_json_is_the_full_reads(seeded: Seeded, once_env: dict[str, str]) -> None:
    printed = run_here("status", "--json", env={**once_env, "ONCE_DATABASE_URL": seeded.url})
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == json.loads(full_status(seeded.url))
