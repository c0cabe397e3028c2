"""Scenario 4, clocks: hosts whose clocks are wrong, sessions in other time zones.

- fast host clock: an honest owner runs a command for a while; wrappers whose wall clock runs
  10 minutes fast (Debian's libfaketime, `faketime -f +10m`, with the monotonic clock left
  alone as a wrong wall clock leaves it) fire every fraction of a second. Staleness is judged
  by the database's clock, so none may take the period over while the owner renews it; once
  the owner is killed, one of them takes over, but not before --stale-after has passed since
  the owner's last heartbeat, by the database's clock.
- slow owner clock: the same, the other way round: an owner 10 minutes slow is not taken over
  by honest wrappers while it lives.
- session time zones: ledger sessions whose time zone is set far apart (MariaDB `time_zone`,
  PostgreSQL `TimeZone`) claim, skip, take over and finish the same period; every instant they
  store must be the same UTC instant (checked against the database's UTC clock and the
  period's bounds), and none sees a fresh heartbeat as stale or a stale one as fresh.

SQLite has no server clock (each process reads its own), so a SQLite ledger serves one host:
the clock rows are not applicable there.
"""

from __future__ import annotations

import glob
import signal
import time
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path

from common import (
    CHILD,
    ONCE,
    Backend,
    Config,
    Proc,
    Row,
    base_env,
    db_time,
    not_applicable,
    read_marks,
    status_word,
)

STALE = 3.0
# libfaketime preloaded into the `once` process itself (the faketime program would stand
# between the torture and the process it kills).
LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))


def _skew(offset: str) -> dict[str, str]:
    """A wall clock `offset` off ("+10m"), the monotonic clock true (skew/sitecustomize.py
    works around libfaketime's time.sleep)."""
    return {"LD_PRELOAD": LIBFAKETIME[0], "FAKETIME": offset,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": str(Path(__file__).resolve().parent / "skew")}


# The command runs with the real clock, so that its log's times are true.
UNFAKED = ["env", "-u", "LD_PRELOAD", "-u", "FAKETIME", "-u", "FAKETIME_DONT_FAKE_MONOTONIC",
           "-u", "PYTHONPATH"]


def run(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    if backend.dialect == "sqlite":
        why = ("SQLite has no server clock: each process reads its own, so a SQLite "
               "ledger serves one host (one clock)")
        return [not_applicable("host clock 10 min fast takes nothing over early", why),
                not_applicable("owner clock 10 min slow is not taken over", why),
                not_applicable("sessions in different time zones store one instant", why)]
    outdir.mkdir(parents=True, exist_ok=True)
    rows = []
    if not LIBFAKETIME:
        why = "libfaketime is not installed (apt-get install faketime)"
        fast = Row("host clock 10 min fast takes nothing over early")
        fast.fail(why)
        slow = Row("owner clock 10 min slow is not taken over")
        slow.fail(why)
        rows += [fast, slow]
    else:
        rows.append(_skewed(config, backend, outdir, "fast", owner={}, others=_skew("+10m"),
                            title="host clock 10 min fast takes nothing over early"))
        rows.append(_skewed(config, backend, outdir, "slow", owner=_skew("-10m"), others={},
                            title="owner clock 10 min slow is not taken over"))
    rows.append(_zones(config, backend))
    return rows


def _skewed(config: Config, backend: Backend, outdir: Path, name: str, owner: dict[str, str],
            others: dict[str, str], title: str) -> Row:
    row = Row(title)
    url = backend.new_ledger()
    rounds = config.count(3, 1)
    fires_total = 0
    lags: list[float] = []
    for r in range(rounds):
        job = f"clock-{name}-{r}"
        log = outdir / f"{job}.log"
        env = {**base_env(url, outdir), "TORTURE_LOG": str(log)}
        argv = [ONCE, "run", "--job", job, "--every", "year", "--stale-after", f"{STALE:g}s",
                "--max-attempts", "10", "-v", "--log-format", "json", "--", *UNFAKED, *CHILD]
        problems: list[str] = []
        owner_env = {**env, "TORTURE_WORK_MIN": "30", "TORTURE_WORK_MAX": "30", **owner}
        holder = Proc(argv, owner_env, outdir, f"{job}-owner")
        deadline = time.monotonic() + 30
        while not read_marks(log) and time.monotonic() < deadline:
            time.sleep(0.05)
        marks = read_marks(log)
        if not marks:
            holder.kill()
            row.judge([f"the owner's command never started: {holder.stderr()[-300:]}"], job)
            continue
        owner_fence = marks[0].fence
        fire_env = {**env, "TORTURE_WORK_MIN": "0.2", "TORTURE_WORK_MAX": "0.2", **others}
        fires: list[Proc] = []
        # While the owner lives: 3 x --stale-after of fires, none may win.
        until = time.monotonic() + 3 * STALE
        while time.monotonic() < until:
            fires.append(Proc(argv, fire_env, outdir, f"{job}-fire"))
            time.sleep(0.3)
        for proc in fires:
            proc.wait(30)
        early = [m for m in read_marks(log) if m.fence != owner_fence]
        if early:
            problems.append(f"taken over while its owner lived (fence {early[0].fence})")
        if holder.poll() is not None:
            problems.append(f"the owner ended early: {status_word(holder.returncode)} "
                            f"{holder.stderr()[-300:]}")
        skewed = holder if owner else fires[0]
        skew = _skew_seen(skewed)
        want = 600.0 if others else -600.0
        if skew is None or abs(skew - want) > 60:
            problems.append(f"the skewed process did not run {want:+.0f}s off (seen: {skew})")
        bad = [status_word(p.returncode) for p in fires if p.returncode != 0]
        if bad:
            problems.append(f"fires while held did not skip: {bad[:5]}")
        # Kill the owner; the last heartbeat it left is the clock the takeover must wait for.
        holder.signal(signal.SIGKILL, "SIGKILL")
        holder.wait(30)
        last_beat = _last_beat(backend, url, job)
        killed = time.monotonic()
        takeover: list[Proc] = []
        while time.monotonic() - killed < STALE * 4:
            takeover.append(Proc(argv, fire_env, outdir, f"{job}-late"))
            time.sleep(0.3)
            if any(m.fence != owner_fence and m.word == "done" for m in read_marks(log)):
                break
        for proc in takeover:
            proc.wait(30)
        fires_total += len(fires) + len(takeover)
        attempts = backend.query(url, "SELECT attempt, started_at FROM once_attempts "
                                      "WHERE job = %s ORDER BY attempt", (job,))
        runs = backend.query(url, "SELECT status, attempt FROM once_runs WHERE job = %s",
                             (job,))
        if runs != [("done", 2)]:
            problems.append(f"ledger {runs}, expected done by attempt 2")
        if len(attempts) >= 2 and last_beat is not None:
            lag = db_time(attempts[1][1]) - last_beat
            lags.append(lag)
            if lag < STALE - 0.002:
                problems.append(f"taken over {lag:.3f}s after the last heartbeat, before "
                                f"--stale-after {STALE:g}s")
        done = [m for m in read_marks(log) if m.word == "done"]
        if len(done) != 1:
            problems.append(f"{len(done)} finished commands, expected 1")
        tracebacks = [p.name for p in [holder, *fires, *takeover] if "Traceback" in p.stderr()]
        if tracebacks:
            problems.append(f"traceback in {tracebacks[0]}")
        row.judge(problems, job)
    row.note(f"{fires_total} skewed-clock fires")
    if lags:
        row.note(f"takeover {min(lags):.1f}-{max(lags):.1f}s after the last heartbeat "
                 f"(--stale-after {STALE:g}s)")
    return row


def _skew_seen(proc: Proc) -> float | None:
    """How far off the process's wall clock ran: its first log line's time, against ours."""
    for event in proc.events():
        with suppress(KeyError, ValueError, TypeError):
            return datetime.fromisoformat(event["time"]).timestamp() - proc.started
    return None


def _last_beat(backend: Backend, url: str, job: str) -> float | None:
    rows = backend.query(url, "SELECT heartbeat_at FROM once_runs WHERE job = %s", (job,))
    return db_time(rows[0][0]) if rows else None


# -- session time zones --------------------------------------------------------------------------

PG_ZONES = ["UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kathmandu",
            "America/St_Johns"]
MY_ZONES = ["+00:00", "+13:00", "-12:00", "+05:45", "-03:30"]  # MariaDB allows -12:59..+13:00


def _zones(config: Config, backend: Backend) -> Row:
    from once.ledger import Job, open_ledger, parse_url

    row = Row("sessions in different time zones store one instant")
    url = backend.new_ledger()
    zones = PG_ZONES if backend.dialect == "postgresql" else MY_ZONES
    rounds = config.count(8, 2)
    stale = 1.0
    for r in range(rounds):
        problems: list[str] = []
        job = Job(f"zones-{r}", "every", "day", "UTC", stale_after=stale, max_attempts=5)
        start = datetime(2001, 1, 1, tzinfo=UTC) + timedelta(days=r)
        end = start + timedelta(days=1)
        key = start.strftime("%Y-%m-%d")
        order = zones[r % len(zones):] + zones[: r % len(zones)]
        ledgers = []
        for zone in order:
            ledger = open_ledger(parse_url(url), timeout=10)
            ledger.connect()
            if backend.dialect == "postgresql":
                ledger._conn.execute(f"SET TIME ZONE '{zone}'")
            else:
                ledger._conn.cursor().execute(f"SET time_zone = '{zone}'")
            ledgers.append((zone, ledger))
        try:
            (z0, first), *others = ledgers
            claim = first.claim(job, key, start, end, f"owner@{z0}")
            if not claim.won:
                problems.append(f"the first claim ({z0}) lost")
            for zone, ledger in others:
                seen = ledger.claim(job, key, start, end, f"other@{zone}")
                if seen.won:
                    problems.append(f"a session in {zone} took a fresh claim over")
                elif seen.heartbeat_age is None or not -0.5 < seen.heartbeat_age < stale:
                    problems.append(f"a session in {zone} sees the heartbeat "
                                    f"{seen.heartbeat_age}s old")
            if not first.renew(job.name, key, claim.attempt):
                problems.append(f"the renewal from {z0} found no row")
            problems += _instants(backend, url, job.name, key, start, end)
            time.sleep(stale + 0.3)
            zone, taker = others[0]
            took = taker.claim(job, key, start, end, f"taker@{zone}")
            if not took.won or took.attempt != 2:
                problems.append(f"a session in {zone} did not take the stale claim over")
            elif not taker.finish(job.name, key, took.attempt, "done", 0, "done"):
                problems.append(f"the finish from {zone} found no row")
            problems += _instants(backend, url, job.name, key, start, end)
        finally:
            for _zone, ledger in ledgers:
                ledger.close()
        row.judge(problems, f"round {r} ({', '.join(order)})")
    row.note(f"zones: {', '.join(zones)}")
    return row


def _instants(backend: Backend, url: str, job: str, key: str, start: datetime,
              end: datetime) -> list[str]:
    """Every instant stored for the period, read by a UTC session: the true ones?"""
    problems = []
    now = backend.now(url)
    (row,) = backend.query(url, "SELECT period_start, period_end, started_at, heartbeat_at, "
                                "finished_at FROM once_runs WHERE job = %s AND period = %s",
                           (job, key))
    if db_time(row[0]) != start.timestamp() or db_time(row[1]) != end.timestamp():
        problems.append(f"period bounds stored as {row[0]} - {row[1]}")
    for name, value in zip(("started_at", "heartbeat_at", "finished_at"), row[2:],
                           strict=True):
        if value is not None and abs(db_time(value) - now) > 10:
            problems.append(f"{name} stored as {value}, {db_time(value) - now:+.0f}s off")
    for attempt, started in backend.query(url, "SELECT attempt, started_at FROM "
                                               "once_attempts WHERE job = %s", (job,)):
        if abs(db_time(started) - now) > 10:
            problems.append(f"attempt {attempt} started_at {started} is off")
    return problems
