"""Scenario 4, clocks: hosts whose clocks are wrong or jump, sessions in other time zones.

The `once` processes run under Debian's libfaketime (the wall clock off, the monotonic clock
true); their commands (child.py) run on the true clock, so that their log is true, and hold
their period's flock, so that two attempts side by side are seen by the kernel whatever the
clocks say (an `overlap` line).

- fast host (every backend): an honest owner runs a yearly period's command while wrappers
  whose wall clock runs 10 minutes fast fire every 0.3 s. Half of them ask for
  `--max-clock-skew 0`, so that staleness alone is under test: by the database's clock on a
  server backend, by the owner's OS lock on SQLite (whose clock is the host's); the others
  keep the default, and a server backend refuses them (exit 75). None may take the period over
  while the owner lives; once it is killed, one does, on a server backend not before
  --stale-after since its last heartbeat by the database's clock, and never beside the
  owner's command.
- slow owner (every backend): the same, the other way round: an owner 10 minutes slow
  (`--max-clock-skew 0`) and honest wrappers.
- clock step (every backend): the owner and the wrappers share one clock, which steps 10
  minutes forward while the owner's command runs (libfaketime re-reading its offset from a
  file), as an NTP step or a resume does. The wrappers keep the default --max-clock-skew (a
  server backend refuses them: exit 75; SQLite's OS lock keeps them out); the takeover after
  the owner's kill asks for `--max-clock-skew 0`.
- wrong period (server backends): hosts running behind or ahead by more than a period (3
  hours and 2 days either way, and 25 years behind) fire `once run`, `once run --catchup`,
  `once catchup` and `once rerun` at an hourly job. Each must claim nothing, run nothing, and
  leave the job's first period, schedule and rows as they were: `once run` and `rerun` exit
  75 with one `once:` line naming both clocks. SQLite has one host and one clock: there is
  nothing to compare the host's with.
- session time zones (server backends): ledger sessions whose time zone is set far apart
  (MariaDB `time_zone`, PostgreSQL `TimeZone`) claim, skip, take over and finish the same
  period; every instant they store must be the same UTC instant (checked against the
  database's UTC clock and the period's bounds), and none sees a fresh heartbeat as stale or
  a stale one as fresh.

Per backend: periods claimed under a wrong clock (a claim by a host off by more than the
--max-clock-skew it checks; must be 0) and takeovers of a live owner (must be 0).
"""

from __future__ import annotations

import glob
import signal
import time
from contextlib import suppress
from dataclasses import dataclass, field
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
    histogram,
    not_applicable,
    read_marks,
    status_word,
)

STALE = 3.0
# libfaketime preloaded into the `once` process itself (the faketime program would stand
# between the torture and the process it kills).
LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
NO_CHECK = ["--max-clock-skew", "0"]  # staleness alone under test


def _skew(offset: str) -> dict[str, str]:
    """A wall clock `offset` off ("+10m"), the monotonic clock true (skew/sitecustomize.py
    works around libfaketime's time.sleep)."""
    return {"LD_PRELOAD": LIBFAKETIME[0], "FAKETIME": offset,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": str(Path(__file__).resolve().parent / "skew")}


def _stepping(offset_file: Path) -> dict[str, str]:
    """A wall clock whose offset is read from a file at every reading: writing the file steps
    the clock of every process started with it, at once."""
    return {"LD_PRELOAD": LIBFAKETIME[0], "FAKETIME_TIMESTAMP_FILE": str(offset_file),
            "FAKETIME_CACHE_DURATION": "0", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": str(Path(__file__).resolve().parent / "skew")}


# The command runs with the real clock, so that its log's times are true.
UNFAKED = ["env", "-u", "LD_PRELOAD", "-u", "FAKETIME", "-u", "FAKETIME_DONT_FAKE_MONOTONIC",
           "-u", "FAKETIME_TIMESTAMP_FILE", "-u", "FAKETIME_CACHE_DURATION", "-u",
           "PYTHONPATH"]

FAST = "host clock 10 min fast takes no live owner over"
SLOW = "owner clock 10 min slow is not taken over"
STEP = "host clock stepped 10 min forward takes no live owner over"
WRONG = "hosts behind and ahead by more than a period claim nothing"
ZONES = "sessions in different time zones store one instant"


def run(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    outdir.mkdir(parents=True, exist_ok=True)
    server = backend.dialect != "sqlite"
    one_clock = ("SQLite has no server clock: each process reads its own, so a SQLite "
                 "ledger serves one host (one clock), with nothing to compare it with")
    rows = []
    if not LIBFAKETIME:
        why = "libfaketime is not installed (apt-get install faketime)"
        for title in (FAST, SLOW, STEP, WRONG):
            missing = Row(title)
            missing.fail(why)
            rows.append(missing)
    else:
        rows.append(_live_owner(config, backend, outdir, Skew("fast", others="+10m"), FAST))
        rows.append(_live_owner(config, backend, outdir, Skew("slow", owner="-10m"), SLOW))
        rows.append(_live_owner(config, backend, outdir, Skew("step", step=True), STEP))
        rows.append(_wrong_period(backend, outdir) if server else
                    not_applicable(WRONG, one_clock))
    rows.append(_zones(config, backend) if server else not_applicable(ZONES, one_clock))
    return rows


@dataclass
class Skew:
    name: str
    owner: str = ""  # the owner's offset ("" : true)
    others: str = ""  # the other wrappers'
    step: bool = False  # one clock for all, stepped 10 min forward while the owner runs
    offset_file: Path | None = field(default=None, repr=False)

    def owner_env(self) -> dict[str, str]:
        if self.step:
            assert self.offset_file is not None
            return _stepping(self.offset_file)
        return _skew(self.owner) if self.owner else {}

    def others_env(self) -> dict[str, str]:
        if self.step:
            assert self.offset_file is not None
            return _stepping(self.offset_file)
        return _skew(self.others) if self.others else {}

    @property
    def others_skewed(self) -> bool:
        return self.step or bool(self.others)

    @property
    def want(self) -> float:
        """How far off the skewed process's clock must be seen, seconds."""
        return -600.0 if self.owner else 600.0


def _live_owner(config: Config, backend: Backend, outdir: Path, skew: Skew, title: str) -> Row:
    row = Row(title)
    row.wrong_clock, row.live_takeovers, row.overlap = 0, 0, 0.0
    server = backend.dialect != "sqlite"
    url = backend.new_ledger()
    fires_total = 0
    codes: list[str] = []
    lags: list[float] = []
    downs: list[str] = []  # why owners stepped down before they were killed
    for r in range(config.count(3, 1)):
        job = f"clock-{skew.name}-{r}"
        log = outdir / f"{job}.log"
        if skew.step:
            skew.offset_file = outdir / f"{job}.offset"
            skew.offset_file.write_text("+0\n")
        env = {**base_env(url, outdir), "TORTURE_LOG": str(log),
               "TORTURE_LOCKS": str(outdir / f"{job}.locks")}
        (outdir / f"{job}.locks").mkdir(exist_ok=True)
        argv = [ONCE, "run", "--job", job, "--every", "year", "--stale-after", f"{STALE:g}s",
                "--max-attempts", "10", "-v", "--log-format", "json"]
        tail = ["--", *UNFAKED, *CHILD]
        problems: list[str] = []
        owner_env = {**env, "TORTURE_WORK_MIN": "30", "TORTURE_WORK_MAX": "30",
                     **skew.owner_env()}
        holder = Proc([*argv, *(NO_CHECK if skew.owner else []), *tail], owner_env, outdir,
                      f"{job}-owner")
        deadline = time.monotonic() + 30
        while not read_marks(log) and time.monotonic() < deadline:
            time.sleep(0.05)
        marks = read_marks(log)
        if not marks:
            holder.kill()
            row.judge([f"the owner's command never started: {holder.stderr()[-300:]}"], job)
            continue
        owner_fence = marks[0].fence
        if skew.step:
            assert skew.offset_file is not None
            skew.offset_file.write_text("+600\n")  # the host's clock steps forward
        fire_env = {**env, "TORTURE_WORK_MIN": "0.2", "TORTURE_WORK_MAX": "0.2",
                    **skew.others_env()}
        fires: list[tuple[Proc, bool]] = []  # (the wrapper, whether it checks the skew)
        # While the owner lives: 3 x --stale-after of fires, none may win.
        until = time.monotonic() + 3 * STALE
        while time.monotonic() < until:
            checks = skew.step or len(fires) % 2 == 0 or not skew.others
            options = [] if checks else NO_CHECK
            fires.append((Proc([*argv, *options, *tail], fire_env, outdir, f"{job}-fire"),
                          checks))
            time.sleep(0.3)
        for proc, _checks in fires:
            proc.wait(30)
        claims = _attempts(backend, url, job)
        # A takeover after the owner stepped down by itself (its renewals did not get
        # through in time on a loaded machine: exit 70) is no takeover of a live owner.
        stepped_down = holder.poll() is not None and bool(_fenced_out(holder))
        taken = [o for o in claims if o != claims[0]] if claims else []
        if taken and not stepped_down:
            row.live_takeovers += len(taken)
            problems.append(f"taken over while its owner lived ({len(taken)} claims)")
        early = [m for m in read_marks(log) if m.fence != owner_fence]
        if early and not stepped_down:
            problems.append(f"a command of fence {early[0].fence} ran while the owner lived")
        if stepped_down:
            downs.append(_fenced_out(holder))
        elif holder.poll() is not None:
            problems.append(f"the owner ended early: {status_word(holder.returncode)} "
                            f"{holder.stderr()[-300:]}")
        seen = _skew_seen(holder if skew.owner else fires[0][0])
        if seen is None or abs(seen - skew.want) > 60:
            problems.append(f"the skewed process did not run {skew.want:+.0f}s off "
                            f"(seen: {seen})")
        for proc, checks in fires:
            codes.append(status_word(proc.returncode))
            refused = server and checks and skew.others_skewed
            if proc.returncode != (75 if refused else 0):
                problems.append(f"a fire while held ended {status_word(proc.returncode)}, "
                                f"not {'75' if refused else '0'}: {proc.stderr()[-200:]!r}")
                break
        if server and skew.others_skewed:
            wrong = sum(1 for o in claims for p, checks in fires
                        if checks and o.endswith(f":{p.pid}"))
            row.wrong_clock += wrong
            if wrong:
                problems.append(f"{wrong} claims by a host whose clock is 10 min off")
        # Kill the owner; the last heartbeat it left is the clock the takeover must wait for.
        holder.signal(signal.SIGKILL, "SIGKILL")
        holder.wait(30)
        last_beat = None if stepped_down else _last_beat(backend, url, job)
        killed = time.monotonic()
        takeover: list[Proc] = []
        options = NO_CHECK if skew.others_skewed else []
        while time.monotonic() - killed < STALE * 10:  # a loaded machine's takers may fail
            takeover.append(Proc([*argv, *options, *tail], fire_env, outdir, f"{job}-late"))
            time.sleep(0.5)
            if any(m.fence != owner_fence and m.word == "done" for m in read_marks(log)):
                break
        for proc in takeover:
            proc.wait(30)
        fires_total += len(fires) + len(takeover)
        attempts = backend.query(url, "SELECT attempt, started_at FROM once_attempts "
                                      "WHERE job = %s ORDER BY attempt", (job,))
        runs = backend.query(url, "SELECT status, attempt FROM once_runs WHERE job = %s",
                             (job,))
        if len(runs) != 1 or runs[0][0] != "done" or runs[0][1] < 2 or (
                runs[0][1] > 2 and not stepped_down):
            problems.append(f"ledger {runs}, expected done by attempt 2")
        if server and len(attempts) >= 2 and last_beat is not None:
            lag = db_time(attempts[1][1]) - last_beat
            lags.append(lag)
            if lag < STALE - 0.002:
                problems.append(f"taken over {lag:.3f}s after the last heartbeat, before "
                                f"--stale-after {STALE:g}s")
        marks = read_marks(log)
        for m in marks:
            if m.word == "overlap":
                ended = [n.at for n in marks if n.word in ("clear", "done", "term")
                         and n.at >= m.at]
                row.overlap += (min(ended) if ended else m.at) - m.at
                problems.append(f"fence {m.fence}'s command started beside another")
        done = [m for m in marks if m.word == "done"]
        if len(done) != 1:
            problems.append(f"{len(done)} finished commands, expected 1")
        tracebacks = [p.name for p in [holder, *(f for f, _ in fires), *takeover]
                      if "Traceback" in p.stderr()]
        if tracebacks:
            problems.append(f"traceback in {tracebacks[0]}")
        row.judge(problems, job)
    row.note(f"{fires_total} fires ({histogram(codes)} while held)")
    if lags:
        row.note(f"takeover {min(lags):.1f}-{max(lags):.1f}s after the last heartbeat "
                 f"(--stale-after {STALE:g}s)")
    elif not server:
        row.note("taken over once the owner was dead (its OS lock gone)")
    if downs:
        row.note(f"{len(downs)} owners stepped down before they were killed (exit 70: "
                 f"{downs[0]}); what followed was judged as a takeover of a dead owner")
    return row


def _fenced_out(proc: Proc) -> str:
    """Why the wrapper said it was fenced out because its renewals did not get through, or
    "" (a takeover that fenced it out is no excuse)."""
    if proc.returncode != 70:
        return ""
    for event in proc.events():
        message = str(event.get("message", ""))
        if event.get("event") == "fenced-out" and "unreachable" in message:
            return message.partition("fenced out: ")[2][:120]
    return ""


def _attempts(backend: Backend, url: str, job: str) -> list[str]:
    """The owners of the job's attempts, in order."""
    return [o for (o,) in backend.query(url, "SELECT owner FROM once_attempts WHERE job = %s "
                                             "ORDER BY attempt", (job,))]


def _skew_seen(proc: Proc) -> float | None:
    """How far off the process's wall clock ran: its last log line's time, against ours (a
    stepping clock has stepped by then)."""
    seen = None
    for event in proc.events():
        with suppress(KeyError, ValueError, TypeError):
            seen = datetime.fromisoformat(event["time"]).timestamp() - proc.started
    return seen


def _last_beat(backend: Backend, url: str, job: str) -> float | None:
    rows = backend.query(url, "SELECT heartbeat_at FROM once_runs WHERE job = %s", (job,))
    return db_time(rows[0][0]) if rows else None


# -- hosts a period or more off ------------------------------------------------------------------

OFFSETS = ["-3h", "+3h", "-2d", "+2d", "-9131d"]  # -9131d: 25 years, a host before NTP


def _wrong_period(backend: Backend, outdir: Path) -> Row:
    """Fires from hosts off by more than a period claim nothing and change nothing."""
    row = Row(WRONG)
    row.wrong_clock = 0
    url = backend.new_ledger()
    job = "clock-wrong"
    log = outdir / f"{job}.log"
    env = {**base_env(url, outdir), "TORTURE_LOG": str(log), "TORTURE_WORK_MIN": "0.1",
           "TORTURE_WORK_MAX": "0.1"}
    every = ["--job", job, "--every", "hour", "--stale-after", f"{STALE:g}s", "-v",
             "--log-format", "json"]
    tail = ["--", *UNFAKED, *CHILD]
    honest = Proc([ONCE, "run", *every, *tail], env, outdir, "honest")
    if honest.wait(60) != 0:
        row.judge([f"the honest run ended {status_word(honest.returncode)}: "
                   f"{honest.stderr()[-300:]}"], "setup")
        return row
    (key,) = [k for (k,) in backend.query(url, "SELECT period FROM once_runs")]
    commands = {
        "run": ["run", *every],
        "run --catchup 5": ["run", *every, "--catchup", "5"],
        "catchup": ["catchup", *every],
        "rerun": ["rerun", "--job", job, "--period", key, "--reason", "torture", "-v",
                  "--log-format", "json"],
    }
    codes = []
    for offset in OFFSETS:
        for name, args in commands.items():
            before = _snapshot(backend, url, job)
            marks = len(read_marks(log))
            proc = Proc([ONCE, *args, *tail], {**env, **_skew(offset)}, outdir,
                        f"{offset}-{name.split()[0]}")
            problems = []
            if proc.wait(60) is None:
                proc.kill()
                problems.append("still running after 60 s")
            codes.append(status_word(proc.returncode))
            after = _snapshot(backend, url, job)
            claimed = len(after["attempts"]) - len(before["attempts"])
            if claimed or after["runs"] != before["runs"]:
                row.wrong_clock += max(claimed, 1)
                problems.append(f"claimed under its wrong clock: {after['runs']}")
            if after["job"] != before["job"]:
                problems.append(f"the job's row moved: {before['job']} -> {after['job']}")
            if len(read_marks(log)) != marks:
                problems.append("its command ran")
            err = proc.stderr()
            lines = [line for line in err.splitlines() if not line.startswith("{")]
            clock_line = [line for line in err.splitlines() if "clock" in line
                          and "--max-clock-skew" in line]
            refused = proc.returncode == 75 and clock_line
            # A host behind sees the real period as one to come: rerun refuses it (exit 2).
            future = name == "rerun" and proc.returncode == 2 and "has not begun" in err
            if (name in ("run", "rerun") or proc.returncode != 0) and not (refused or future):
                problems.append(f"ended {status_word(proc.returncode)} without naming the "
                                f"clocks: {err[-300:]!r}")
            if "Traceback" in err or len(lines) > 1:
                problems.append(f"said more than one line: {err[-300:]!r}")
            row.judge(problems, f"{name} on a host {offset} off")
    row.note(f"offsets {', '.join(OFFSETS)} x {len(commands)} commands: {histogram(codes)}")
    return row


def _snapshot(backend: Backend, url: str, job: str) -> dict[str, list[tuple[object, ...]]]:
    return {
        "job": backend.query(url, "SELECT first_period_start, schedule, kind FROM once_jobs "
                                  "WHERE job = %s", (job,)),
        "runs": sorted(backend.query(url, "SELECT period, status, attempt FROM once_runs "
                                          "WHERE job = %s", (job,))),
        "attempts": backend.query(url, "SELECT period, attempt FROM once_attempts "
                                       "WHERE job = %s", (job,)),
    }


# -- session time zones --------------------------------------------------------------------------

PG_ZONES = ["UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago", "Asia/Kathmandu",
            "America/St_Johns"]
MY_ZONES = ["+00:00", "+13:00", "-12:00", "+05:45", "-03:30"]  # MariaDB allows -12:59..+13:00


def _zones(config: Config, backend: Backend) -> Row:
    from once.ledger import Job, open_ledger, parse_url

    row = Row(ZONES)
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
            if not first.renew(job.name, key, claim):
                problems.append(f"the renewal from {z0} found no row")
            problems += _instants(backend, url, job.name, key, start, end)
            time.sleep(stale + 0.3)
            zone, taker = others[0]
            took = taker.claim(job, key, start, end, f"taker@{zone}")
            if not took.won or took.attempt != 2:
                problems.append(f"a session in {zone} did not take the stale claim over")
            elif not taker.finish(job.name, key, took, "done", 0, "done"):
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
