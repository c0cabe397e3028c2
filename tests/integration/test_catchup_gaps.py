"""Gaps behind the latest run, on every backend: a period before the job's latest done one that
is missing, stale or failed with attempts left is made up by `once run --catchup` and by
`once catchup`, with the gap finder `once check` uses; `once prune` keeps what it needs."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import run_either, wait_for
from ledger_sql import query
from once.ledger import Job, open_ledger, parse_url, schema, tables
from once.periods import Period
from once.run import flow
from once.schedules import schedule
from once.stored import shard_keys
from procs import alive, parent, pids, start_once

pytestmark = pytest.mark.tables_made  # none is about a first use

DAY = ["--job", "gaps", "--every", "day"]
LOG_CHILD = ["sh", "-c", 'echo "$ONCE_PERIOD $ONCE_ATTEMPT" >> "$LOG"']
FAIL = ["sh", "-c", 'echo "$ONCE_PERIOD $ONCE_ATTEMPT" >> "$LOG"; exit 3']
# Records its pid, then waits to be killed.
SLEEPER = 'echo $$ > "$DIR/pids"; sleep 600 & echo $! >> "$DIR/pids"; wait'


@pytest.fixture
def env(once_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**once_env, "LOG": str(tmp_path / "children.log"), "DIR": str(tmp_path)}


def day(n: int) -> str:
    return (datetime.now(UTC).date() + timedelta(days=n)).isoformat()


def logged(env: dict[str, str]) -> list[tuple[str, str]]:
    path = Path(env["LOG"])
    lines = path.read_text().splitlines() if path.exists() else []
    return [(period, attempt) for period, attempt in (line.split() for line in lines)]


def fire(env: dict[str, str], lag: int, command: list[str] = LOG_CHILD) -> int:
    return run_either("run", *DAY, "--lag", str(lag), "--", *command, env=env).returncode


def make_up(env: dict[str, str], how: str, *args: str) -> None:
    """`once run --catchup 5` or `once catchup`, which must succeed."""
    if how == "run":
        result = run_either("run", *DAY, "--catchup", "5", *args, "--", *LOG_CHILD, env=env)
    else:
        result = run_either("catchup", *DAY, *args, "--", *LOG_CHILD, env=env)
    assert result.returncode == 0, result.stderr


def check(env: dict[str, str]) -> tuple[int, str]:
    result = run_either("check", "gaps", env=env)
    return result.returncode, result.stdout


@pytest.mark.parametrize("how", ["run", "catchup"])
def test_a_killed_owners_period_before_the_latest_done_one_is_made_up(
        env: dict[str, str], tmp_path: Path, how: str) -> None:
    owner = start_once("run", *DAY, "--lag", "2", "--stale-after", "2s", "--", "sh", "-c",
                       SLEEPER, env=env)
    shell, sleeper = wait_for(lambda: pids(tmp_path / "pids", 2), what="the owner's child")
    guard = parent(shell)
    owner.kill()
    wait_for(lambda: not any(alive(p) for p in (guard, shell, sleeper)),
             what="the owner's guard and command to die with it")
    owner.wait(10)
    assert fire(env, 1) == 0  # D-1 is done after D-2's owner died
    wait_for(lambda: f"{day(-2)} stale" in check(env)[1], what="check to report D-2 stale")
    make_up(env, how)
    assert logged(env) == [(day(-1), "1"), (day(-2), "2"), (day(0), "1")]
    status, found = check(env)
    assert status == 0 and found.startswith("OK 1 job: every due period done"), found


@pytest.mark.parametrize("how", ["run", "catchup"])
def test_a_failed_and_a_missing_period_before_the_latest_done_one_are_made_up(
        env: dict[str, str], how: str) -> None:
    assert fire(env, 4) == 0
    assert fire(env, 3, FAIL) == 3  # attempts left: 2 of 3
    assert fire(env, 1) == 0  # D-2: nobody ran it
    status, found = check(env)
    assert status == 2 and f"{day(-3)} failed" in found and f"{day(-2)} missing" in found
    make_up(env, how)
    assert logged(env) == [(day(-4), "1"), (day(-3), "1"), (day(-1), "1"), (day(-3), "2"),
                           (day(-2), "1"), (day(0), "1")]
    assert check(env)[0] == 0


def test_catchup_max_and_dry_run_take_the_oldest_that_need_a_run(env: dict[str, str]) -> None:
    assert fire(env, 4) == 0
    assert fire(env, 3, FAIL) == 3
    assert fire(env, 1) == 0
    dry = run_either("catchup", *DAY, "--dry-run", env=env)
    assert [line.split()[0] for line in dry.stdout.splitlines()] == [day(-3), day(-2), day(0)]
    make_up(env, "catchup", "--max", "1")
    assert logged(env)[3:] == [(day(-3), "2")]


def test_run_catchup_looks_back_n_periods_only(env: dict[str, str]) -> None:
    assert fire(env, 6) == 0  # D-5 .. D-1 missing
    result = run_either("run", *DAY, "--catchup", "2", "--", *LOG_CHILD, env=env)
    assert result.returncode == 0, result.stderr
    assert logged(env) == [(day(-6), "1"), (day(-2), "1"), (day(-1), "1"), (day(0), "1")]


def test_a_failed_out_period_is_left_to_rerun(env: dict[str, str]) -> None:
    assert run_either("run", *DAY, "--lag", "2", "--max-attempts", "1", "--", *FAIL,
                    env=env).returncode == 3
    assert fire(env, 1) == 0
    result = run_either("run", *DAY, "--max-attempts", "1", "--catchup", "5", "--", *LOG_CHILD,
                      env=env)
    assert result.returncode == 0, result.stderr
    assert logged(env) == [(day(-2), "1"), (day(-1), "1"), (day(0), "1")]


def test_prune_keeps_the_done_rows_catch_up_needs(env: dict[str, str], ledger_url: str) -> None:
    # D-6 done, D-5 missing, D-4 failed, D-3 .. D-1 done; all finished long ago.
    assert fire(env, 6) == 0
    assert fire(env, 4, FAIL) == 3
    for lag in (3, 2, 1):
        assert fire(env, lag) == 0
    query(ledger_url, "UPDATE once_runs SET finished_at = period_start "
                      "WHERE finished_at IS NOT NULL")
    pruned = run_either("prune", "--older-than", "1h", env=env)
    assert pruned.returncode == 0 and pruned.stdout.startswith("deleted 1 done rows"), (
        pruned.stdout, pruned.stderr)
    left = dict(query(ledger_url, "SELECT period, status FROM once_runs"))
    assert left == {day(-4): "failed", day(-3): "done", day(-2): "done", day(-1): "done"}
    status, found = check(env)
    assert status == 2 and f"{day(-5)} missing" in found and f"{day(-4)} failed" in found
    dry = run_either("catchup", *DAY, "--dry-run", env=env)
    assert [line.split()[0] for line in dry.stdout.splitlines()] == [day(-5), day(-4), day(0)]


# -- the finder on its own, against brute force ----------------------------------------------

NOW = datetime(2026, 11, 29, 21, 37, tzinfo=UTC)


@pytest.mark.parametrize("seed", range(8))
def test_the_periods_catch_up_finds_match_brute_force(seed: int, ledger_url: str) -> None:
    rng = random.Random(seed)
    zone = rng.choice(["UTC", "Europe/Berlin", "Australia/Lord_Howe", "America/Havana"])
    sched = (schedule(None, "0 3,15 * * *", zone) if seed % 4 == 3
             else schedule(rng.choice(["hour", "6h", "day"]), None, zone))
    shards = rng.choice([1, 1, 2])
    job = Job("j", sched.kind, sched.spec, sched.tz_name, max_attempts=3, shards=shards)
    until = sched.containing(NOW)
    periods = [until]
    for _ in range(rng.randrange(20, 150)):
        periods.append(sched.previous(periods[-1]))
    periods.reverse()
    rows: dict[str, tuple[Period, str, int]] = {}
    for i, period in enumerate(periods):
        for key in shard_keys(period.key, shards):
            if i == 0 or rng.random() < 0.75:
                status = rng.choices(["done", "failed", "running"], [12, 2, 1])[0]
                rows[key] = (period, status, rng.choice([1, 3]))
    seed_ledger(ledger_url, sched, shards, periods[0], rows)
    expected = [p for p in periods if any(
        key not in rows or rows[key][1] == "running"  # every heartbeat is stale
        or (rows[key][1] == "failed" and rows[key][2] < 3)
        for key in shard_keys(p.key, shards))]
    with open_ledger(parse_url(ledger_url)) as ledger:
        assert flow.missing_periods(ledger, job, sched, None, until) == expected
        assert flow.missing_periods(ledger, job, sched, None, until, limit=3) == expected[:3]
        window = periods[len(periods) // 2]
        assert flow.missing_periods(ledger, job, sched, window, until, from_first=True) == [
            p for p in expected if p.start.astimezone(UTC) >= window.start.astimezone(UTC)]


def seed_ledger(url: str, sched: object, shards: int, first: Period,
                rows: dict[str, tuple[Period, str, int]]) -> None:
    target = parse_url(url)
    schema.ensure(target)
    eng = schema.engine(target)
    old = datetime(2000, 1, 1, tzinfo=UTC)
    with eng.begin() as conn:
        conn.execute(tables.jobs.insert().values(
            job="j", fence=1, fire_count=1, kind=sched.kind, schedule=sched.spec,  # type: ignore[attr-defined]
            tz=sched.tz_name, lag=0, max_attempts=3, stale_after=300.0,  # type: ignore[attr-defined]
            first_period_start=first.start.astimezone(UTC), created_at=old, last_fired_at=old,
            shards=shards))
        conn.execute(tables.runs.insert(), [
            {"job": "j", "period": key, "status": status, "attempt": attempt, "fence": 1,
             "owner": "t", "period_start": p.start.astimezone(UTC),
             "period_end": p.end.astimezone(UTC), "started_at": old, "heartbeat_at": old,
             "finished_at": None if status == "running" else old, "exit_code": 0}
            for key, (p, status, attempt) in rows.items()])
    eng.dispose()
