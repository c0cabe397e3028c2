"""Scenario 1, contention: many real `once` processes released at the same instant.

- first use: N x P `once run --lag k` processes (P periods, N processes each) on a ledger
  that has no tables yet, so that the tables are created under the race too;
- catch-up race: N `once catchup --since/--until` processes over K periods, released
  together: they walk the same periods in the same order, so every period is fought over by
  all of them.

The command appends "PERIOD FENCE PID" to a log with one O_APPEND write. A period is held
when exactly one process ran it (one log line) and the ledger agrees (done by attempt 1, with
that fence, one attempt row); it is lost when two ran it (a duplicate) or none did (no winner).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from common import (
    ONCE,
    Backend,
    Config,
    Proc,
    Row,
    base_env,
    histogram,
    release_together,
    status_word,
    wait_all,
)

APPEND = 'echo "$ONCE_PERIOD $ONCE_FENCE $$" >> "$TORTURE_LOG"'


def run(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    url = backend.new_ledger()  # empty: the first use races too
    outdir.mkdir(parents=True, exist_ok=True)
    return [first_use(config, url, backend, outdir), catchup_race(config, url, backend, outdir)]


def _errors(procs: list[Proc]) -> tuple[list[str], list[str]]:
    """(exit statuses of processes that did not end with 0, tracebacks seen)."""
    bad = [status_word(p.returncode) for p in procs if p.returncode != 0]
    tracebacks = [p.name for p in procs if "Traceback" in p.stderr()]
    return bad, tracebacks


def _winners(log: Path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    if log.exists():
        for line in log.read_text().splitlines():
            period, fence, _pid = line.split()
            found[period].append(int(fence))
    return found


def _judge(row: Row, periods: list[str], winners: dict[str, list[int]],
           ledger: dict[str, tuple[str, int, int]], attempts: Counter[str]) -> None:
    for key in periods:
        problems = []
        fences = winners.get(key, [])
        if len(fences) > 1:
            problems.append(f"duplicate: ran {len(fences)} times (fences {fences})")
        elif not fences:
            problems.append("no winner: never ran")
        state = ledger.get(key)
        if state is None:
            problems.append("no row in once_runs")
        else:
            status, attempt, fence = state
            if status != "done" or attempt != 1:
                problems.append(f"ledger: {status} by attempt {attempt}")
            if fences and fence not in fences:
                problems.append(f"ledger fence {fence} is not the winner's {fences}")
        if attempts[key] != 1:
            problems.append(f"{attempts[key]} attempt rows")
        row.judge(problems, key)
    strays = sorted(set(winners) - set(periods))
    if strays:
        row.note(f"ran periods not asked for: {strays[:5]}")


def _ledger(backend: Backend, url: str, job: str) -> tuple[dict[str, tuple[str, int, int]],
                                                           Counter[str]]:
    rows = backend.query(url, "SELECT period, status, attempt, fence FROM once_runs "
                              "WHERE job = %s", (job,))
    attempts = backend.query(url, "SELECT period FROM once_attempts WHERE job = %s", (job,))
    return ({p: (s, int(a), int(f)) for p, s, a, f in rows},
            Counter(p for (p,) in attempts))


def first_use(config: Config, url: str, backend: Backend, outdir: Path) -> Row:
    from once.periods import every
    from once.run.flow import current_period

    periods_n, procs_n = config.count(3, 2), config.count(32, 3)
    row = Row(f"contention: first use, {periods_n} periods x {procs_n} `once run`")
    log = outdir / "first-use.log"
    env = {**base_env(url, outdir), "TORTURE_LOG": str(log)}
    year = every("year", "UTC")
    expected = [current_period(year, lag).key for lag in range(periods_n)]
    argvs = [[ONCE, "run", "--job", "first-use", "--every", "year", "--lag", str(lag), "--",
              "sh", "-c", APPEND]
             for lag in range(periods_n) for _ in range(procs_n)]
    config.rng.shuffle(argvs)
    procs = release_together(argvs, env, outdir, "first-use")
    hung = wait_all(procs, 300)
    ledger, attempts = _ledger(backend, url, "first-use")
    _judge(row, expected, _winners(log), ledger, attempts)
    bad, tracebacks = _errors(procs)
    row.note(f"{len(procs)} processes on a ledger without tables")
    row.note(f"errors: {histogram(bad)}" if bad else "errors: none")
    for name in tracebacks[:3]:
        row.fail(f"traceback in {name}")
    if hung:
        row.fail(f"{len(hung)} processes hung")
    return row


def catchup_race(config: Config, url: str, backend: Backend, outdir: Path) -> Row:
    from datetime import UTC, datetime

    from once.periods import every

    periods_n, procs_n = config.count(200, 5), config.count(32, 3)
    row = Row(f"contention: {periods_n} periods x {procs_n} `once catchup`")
    log = outdir / "catchup-race.log"
    env = {**base_env(url, outdir), "TORTURE_LOG": str(log)}
    hour = every("hour", "UTC")
    first = hour.containing(datetime(2001, 1, 1, tzinfo=UTC))
    last = hour.shifted(first, periods_n - 1)
    expected = [p.key for p in hour.between(first, last)]
    argv = [ONCE, "catchup", "--job", "race", "--every", "hour", "--since", first.key,
            "--until", last.key, "--", "sh", "-c", APPEND]
    procs = release_together([argv] * procs_n, env, outdir, "catchup-race")
    hung = wait_all(procs, 600)
    ledger, attempts = _ledger(backend, url, "race")
    _judge(row, expected, _winners(log), ledger, attempts)
    bad, tracebacks = _errors(procs)
    row.note(f"{periods_n * procs_n} claims")
    row.note(f"errors: {histogram(bad)}" if bad else "errors: none")
    for name in tracebacks[:3]:
        row.fail(f"traceback in {name}")
    if hung:
        row.fail(f"{len(hung)} processes hung")
    return row
