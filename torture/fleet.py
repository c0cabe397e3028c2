"""Scenario: a mixed fleet. Callers of one job that disagree, under every fault at once.

A storm (storm.py) over hourly periods whose wrappers are what a real fleet runs side by
side: cron-like `once run --catchup N` and plain `once run`, `once catchup` from the first
period or over a random window, and now and then `once rerun` of a period already done. Each
caller draws its own `--stale-after` (2 s to 8 s) and `--kill-after` (the default, or up to a
third of its `--stale-after`), so that owners with a long promise meet callers with a short
one; a few callers ask for a `--kill-after` over a third of their `--stale-after`, which must
be a usage error (exit 2, one `once:` line, nothing claimed, no command).

Meanwhile: guards (`once-guard JOB PERIOD`, the command's parent) killed with SIGKILL,
wrappers killed with SIGKILL, wrappers stopped past their own `--stale-after` and continued,
every `once` process (wrappers and guards) killed with `kill -9` at once every so often, and
an outsider session holding the job's running rows (PostgreSQL, MariaDB: SELECT ... FOR
UPDATE, sometimes the job's once_jobs row too) or SQLite's write lock for a while.

Every command (child.py) logs its own start and end and holds its period's flock while it
lives, so the verdict (verdict.py) measures, per period: seconds two attempts ran side by
side (must be 0), finished twice without a rerun or a documented cause (must be 0), never
done (must be 0), and redone after an outage (at least once is the contract there). A
command must be dead 2 s after its guard, or its `once` and guard, were killed.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from common import (
    CHILD,
    ONCE,
    Backend,
    Config,
    Mark,
    Proc,
    Row,
    histogram,
    parent_of,
    proc_stat,
    status_word,
)
from storm import Background, Fault, Spec, Storm
from verdict import alive_child

STALES = (2.0, 3.0, 5.0, 8.0)  # kill-after: 1s from 3s up, 2s at 8s
MARGIN = 0.8  # a targeted fault leaves the command at least this much work


class Fleet(Storm):
    """The storm's callers, drawn from a mixed fleet."""

    def __init__(self, config: Config, backend: Backend, url: str, outdir: Path, spec: Spec,
                 injector: FleetFaults) -> None:
        super().__init__(config, backend, url, outdir, spec, injector)
        self.longest_stale = max(STALES)
        self.stale_of: dict[int, float] = {}  # wrapper pid -> its --stale-after
        self.misfits: list[Proc] = []  # --kill-after over a third of --stale-after
        self.rerun: set[str] = set()  # periods rerun (once each, so that the storm settles)
        # Faults and reruns stop here, so that even a starved storm can converge.
        self.quiet_at = time.monotonic() + spec.limit / 2

    def fire(self) -> None:
        spec, rng = self.spec, self.rng
        stale = rng.choice(STALES)
        # Whole seconds: the default (a third of --stale-after when that is less than 10s)
        # or anything from 1s to a third of --stale-after.
        fits = int(stale // 3)
        kill = rng.choice([0, *range(1, fits + 1)])
        common = ["--job", spec.job, "--every", "hour", "--stale-after", f"{stale:g}s",
                  "--max-attempts", str(spec.max_attempts), "-v", "--log-format", "json"]
        if kill:
            common += ["--kill-after", f"{kill}s"]
        choice = rng.random()
        if choice < 0.04:
            argv = [ONCE, "run", "--job", spec.job, "--every", "hour", "--stale-after",
                    f"{stale:g}s", "--kill-after", f"{fits + rng.randint(1, 4)}s", "--",
                    *CHILD]
            self.misfits.append(self.start(argv, "misfit"))
            return
        keys = sorted(self.finished - self.rerun)
        if choice < 0.10 and keys and time.monotonic() < self.quiet_at:
            key = rng.choice(keys)
            self.rerun.add(key)
            argv = [ONCE, "rerun", "--job", spec.job, "--period", key, "--reason", "torture",
                    "-v", "--log-format", "json"]
            stale = self.longest_stale  # the job's, as its latest `once run` left it
        elif choice < 0.45:
            argv = [ONCE, "run", *common, "--catchup", str(spec.periods)]
        elif choice < 0.55:
            argv = [ONCE, "run", *common]
        elif choice < 0.80:
            argv = [ONCE, "catchup", *common, "--since", self.first.key]
        else:
            keys = self.expected()
            i = rng.randrange(len(keys))
            j = rng.randrange(i, len(keys))
            argv = [ONCE, "catchup", *common, "--since", keys[i], "--until", keys[j]]
        proc = self.start([*argv, "--", *CHILD], "rerun" if "rerun" in argv else "w")
        self.stale_of[proc.pid] = stale


class FleetFaults(Background):
    """The owner faults (on a tick) and the outsider's locks (on a thread of their own)."""

    KINDS = ("guard SIGKILL", "SIGKILL", "SIGSTOP")

    def __init__(self, rng: random.Random, every: tuple[float, float] = (0.3, 0.7),
                 kill_all: tuple[float, float] = (8.0, 16.0),
                 locks: tuple[float, float] = (4.0, 10.0),
                 hold: tuple[float, float] = (0.5, 5.0)) -> None:
        super().__init__(rng, locks)
        self.every, self.kill_all, self.hold = every, kill_all, hold
        self.next_fault = 0.0
        self.next_kill_all = time.monotonic() + rng.uniform(*kill_all)
        self.dones_then = 0
        self.turn = 0
        self.orphaned: list[tuple[Fault, Proc]] = []  # guard killed: (the fault, its `once`)
        self.resume: list[tuple[float, Proc]] = []
        self.checks: list[tuple[float, Callable[[], None]]] = []
        self.hits: Counter[str] = Counter()  # targeted faults per period: at most 3

    def tick(self, storm: Storm, now: float) -> None:
        assert isinstance(storm, Fleet)
        for when, proc in list(self.resume):
            if now >= when:
                proc.signal(signal.SIGCONT, "SIGCONT")
                proc.stopped = False
                self.resume.remove((when, proc))
        for when, check in list(self.checks):
            if now >= when:
                check()
                self.checks.remove((when, check))
        if now >= storm.quiet_at:
            return
        # Everything dies at once only after some work was finished since the last time:
        # on a loaded machine a wrapper can take seconds to claim, and the storm must move.
        if now >= self.next_kill_all and storm.dones > self.dones_then:
            self.next_kill_all = now + self.rng.uniform(*self.kill_all)
            self.dones_then = storm.dones
            self._kill_everything(storm, now)
        elif now >= self.next_fault:
            self.next_fault = now + self.rng.uniform(*self.every)
            if self._target(storm, now, self.KINDS[self.turn % len(self.KINDS)]):
                self.turn += 1  # each kind in turn, so that each gets its share
        super().tick(storm, now)

    def finish(self, storm: Storm) -> None:
        for _when, proc in self.resume:
            proc.signal(signal.SIGCONT, "SIGCONT")
            proc.stopped = False
        self.resume.clear()
        for when, check in sorted(self.checks, key=lambda c: c[0]):
            time.sleep(max(0.0, when - time.monotonic()))
            check()
        self.checks.clear()
        super().finish(storm)

    # -- the owners

    def _target(self, storm: Fleet, now: float, kind: str) -> bool:
        wall = time.time()
        candidates = []
        for mark in storm.running.values():
            owner = storm.owner_of(mark)
            if owner is None or owner.stopped or self.hits[mark.period] >= 3:
                continue
            need = MARGIN + (storm.stale_of.get(owner.pid, storm.longest_stale)
                             if kind == "SIGSTOP" else 0.0)
            if mark.at + mark.work - wall > need:
                candidates.append((mark, owner))
        if not candidates:
            return False
        mark, owner = self.rng.choice(candidates)
        detail = ""
        if kind == "guard SIGKILL":
            guard = parent_of(mark.pid)
            if guard is None or not _is_guard(guard) or not _kill(guard):
                return False
            owner.faults.append((kind, wall))
            detail = f"guard {guard}"
        elif not owner.signal(signal.SIGKILL if kind == "SIGKILL" else signal.SIGSTOP, kind):
            return False
        if kind == "SIGSTOP":
            owner.stopped = True
            # Short: past its --stale-after; long: past the end of the command's work too,
            # so that it would finish while its owner is stopped unless something stops it.
            if self.rng.random() < 0.5:
                pause = storm.stale_of.get(owner.pid, storm.longest_stale) + \
                    self.rng.uniform(0.5, 2.0)
                detail = f"short, {pause:.1f}s"
            else:
                pause = mark.at + mark.work - wall + self.rng.uniform(0.3, 1.5)
                detail = f"long, {pause:.1f}s"
            self.resume.append((now + pause, owner))
        self.hits[mark.period] += 1
        fault = Fault(kind, wall, wall, mark.period, mark.fence, detail)
        self.add(fault)
        if kind != "SIGSTOP":
            self._check_dead(fault, [mark], now)
        if kind == "guard SIGKILL":
            self.orphaned.append((fault, owner))
        return True

    def _kill_everything(self, storm: Fleet, now: float) -> None:
        """kill -9 of every `once` process: the wrappers and their guards, in any order."""
        t0 = time.time()
        wrappers = [p for p in storm.live() if p.tag != "misfit"]
        pids = {p.pid for p in wrappers}
        guards = [pid for pid in _children(pids) if _is_guard(pid)]
        victims = [(p.pid, p) for p in wrappers] + [(g, None) for g in guards]
        self.rng.shuffle(victims)
        running = list(storm.running.values())
        for pid, proc in victims:
            if _kill(pid) and proc is not None:
                proc.faults.append(("SIGKILL", t0))
        for proc in wrappers:
            proc.stopped = False
        self.resume = [(w, p) for w, p in self.resume if p.pid not in pids]
        for mark in running:  # the guards' owners: their `once` wrote nothing either
            owner = storm.owners.get((mark.period, mark.fence))
            if owner is not None:
                owner.faults.append(("guard SIGKILL", t0))
        fault = Fault("kill -9 of every once", t0, time.time(),
                      detail=f"{len(wrappers)} wrappers, {len(guards)} guards, "
                             f"{len(running)} commands")
        self.add(fault)
        self._check_dead(fault, running, now)

    def _check_dead(self, fault: Fault, marks: list[Mark], now: float) -> None:
        """2 s later, none of these commands may be alive."""
        def check() -> None:
            for mark in marks:
                if alive_child(mark.pid):
                    fault.problems.append(f"{mark.period} fence {mark.fence}: its command "
                                          f"(pid {mark.pid}) was still running 2 s after "
                                          f"its `once` or guard was killed")
        self.checks.append((now + 2.0, check))

    def judge_orphans(self) -> None:
        """A wrapper whose guard died records failed (guard-died) and exits 137; or 75 when
        the ledger could not take that, or 70 when its row was taken over meanwhile."""
        for fault, owner in self.orphaned:
            killed = any(kind == "SIGKILL" for kind, _ in owner.faults)
            if owner.returncode not in (137, 75, 70) and not killed:
                fault.problems.append(f"its `once` ended with {owner.returncode} after its "
                                      f"guard was killed")

    # -- the outsider

    def make(self, storm: Storm) -> None:
        backend, url, job = storm.backend, storm.url, storm.spec.job
        pause = self.rng.uniform(*self.hold)
        if backend.dialect == "sqlite":
            import sqlite3

            from once.ledger import parse_url

            conn = sqlite3.connect(parse_url(url).path, isolation_level=None, timeout=30)
            try:
                conn.execute("BEGIN IMMEDIATE")
                t0 = time.time()
                time.sleep(pause)
                conn.execute("ROLLBACK")
            finally:
                conn.close()
            detail = f"write lock {pause:.1f}s"
        else:
            with_job = self.rng.random() < 0.4
            try:
                t0, rows = _hold_rows(backend, url, job, pause, with_job)
            except Exception as exc:
                if "once_runs" in str(exc):  # no tables yet: nothing to lock
                    return
                raise
            detail = f"{rows} running rows{' and the job row' if with_job else ''} " \
                     f"{pause:.1f}s"
        self.add(Fault("rows locked", t0, time.time(), detail=detail, db=True))


def _hold_rows(backend: Backend, url: str, job: str, pause: float,
               with_job: bool) -> tuple[float, int]:
    """Lock the job's running rows (and its once_jobs row) in an open transaction."""
    sql = "SELECT period FROM once_runs WHERE job = %s AND status = 'running' FOR UPDATE"
    if backend.dialect == "postgresql":
        import psycopg

        with psycopg.connect(url, connect_timeout=10) as conn:
            rows = conn.execute(sql, (job,)).fetchall()
            if with_job:
                conn.execute("SELECT job FROM once_jobs WHERE job = %s FOR UPDATE", (job,))
            t0 = time.time()
            time.sleep(pause)
            conn.rollback()
        return t0, len(rows)
    with backend.session(url, autocommit=False) as conn, conn.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute(sql, (job,))
        found = len(cur.fetchall())
        if with_job:
            cur.execute("SELECT job FROM once_jobs WHERE job = %s FOR UPDATE", (job,))
        t0 = time.time()
        time.sleep(pause)
        conn.rollback()
    return t0, found


def _children(parents: set[int]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = proc_stat(int(entry.name))
            if fields is not None and int(fields[1]) in parents:
                found.append(int(entry.name))
    return found


def _is_guard(pid: int) -> bool:
    with suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().startswith("once-guard")
    return False


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


LABELS = {
    "guard SIGKILL": "guard (once-guard) SIGKILL, command running",
    "SIGKILL": "owner SIGKILL, command running",
    "SIGSTOP": "owner SIGSTOP past its own --stale-after, SIGCONT",
    "kill -9 of every once": "kill -9 of every `once` process (wrappers and guards)",
}


def run(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    rng = random.Random(config.rng.random())
    spec = Spec(job="fleet", periods=config.count(60, 6), work=(0.5, 8.0), max_live=16,
                limit=config.span(480, 300))
    injector = FleetFaults(rng)
    storm = Fleet(config, backend, backend.new_ledger(), outdir / "fleet", spec, injector)
    storm.blow()
    injector.judge_orphans()
    verdict = storm.verdict()
    labels = {**LABELS, "rows locked": "SQLite write lock held by an outsider"
              if backend.dialect == "sqlite" else "running rows locked by an outsider session"}
    rows: dict[str, Row] = {}
    verdict.judge_faults(rows, lambda kind: labels.get(kind, kind))
    result = [rows.get(k) or Row(name) for k, name in labels.items()]
    periods = verdict.periods_row(f"mixed fleet: {spec.periods} periods converge, each "
                                  f"finished once (or redone as documented)")
    stales = Counter(storm.stale_of.values())
    periods.note("--stale-after " + ", ".join(f"{s:g}s×{n}" for s, n in sorted(stales.items())))
    reruns = [p for p in storm.procs if p.tag == "rerun"]
    if reruns:
        periods.note(f"{len(reruns)} reruns ({_codes(reruns)})")
    if injector.errors:
        periods.note(f"the fault itself failed {len(injector.errors)} times: "
                     f"{injector.errors[0]}")
    return [*result, periods, _misfits(storm)]


def _codes(procs: list[Proc]) -> str:
    return histogram([status_word(p.returncode) for p in procs])


def _misfits(storm: Fleet) -> Row:
    row = Row("--kill-after over a third of --stale-after: usage error, nothing claimed")
    owners = [o for _owner, o in storm.backend.query(
        storm.url, "SELECT job, owner FROM once_attempts WHERE job = %s", (storm.spec.job,))]
    for proc in storm.misfits:
        proc.wait(30)
        problems = []
        if proc.returncode != 2:
            problems.append(f"ended with {proc.returncode}, not 2")
        lines = proc.stderr().splitlines()
        if len(lines) != 1 or not lines[0].startswith("once: "):
            problems.append(f"said {lines[:3]}")
        if any(owner.endswith(f":{proc.pid}") for owner in owners) or any(
                p is proc for p in storm.owners.values()):
            problems.append("it claimed a period")
        row.judge(problems, proc.name)
    return row
