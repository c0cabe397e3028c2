"""A storm: cron-like re-fires of real wrappers over a range of periods, under injected
faults, until the ledger converges (verdict.py then judges it, period by period and fault by
fault).

The re-fire loop starts a wrapper every fraction of a second (`once catchup --since P0`,
`once catchup` over a random window, or `once run --catchup N`), at most `max_live` at a
time, until every period from P0 to the current one is done, or a time bound passes. Every
wrapper runs torture/child.py, which logs start / done / term with its period and fence, and
holds the period's flock while it lives (overlap / clear when it finds it taken).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    CHILD,
    END,
    ONCE,
    Backend,
    Config,
    Mark,
    Proc,
    base_env,
    parent_of,
)
from verdict import Verdict


@dataclass
class Fault:
    kind: str
    t0: float  # wall clock
    t1: float
    period: str | None = None  # owner faults: the period of the command that was hit
    fence: int | None = None
    detail: str = ""
    db: bool = False  # a fault of the ledger's (its server, its connections, its locks)
    problems: list[str] = field(default_factory=list)  # seen by the injector itself


@dataclass
class Spec:
    job: str
    periods: int
    stale: float = 3.0
    work: tuple[float, float] = (0.5, 8.0)
    refire: tuple[float, float] = (0.15, 0.45)
    max_live: int = 24
    limit: float = 240.0
    max_attempts: int = 100
    prefix: list[str] = field(default_factory=list)  # e.g. faketime ...
    extra_env: dict[str, str] = field(default_factory=dict)


class Injector:
    """Makes faults while the storm blows; subclasses choose which."""

    def __init__(self) -> None:
        self.faults: list[Fault] = []
        self.lock = threading.Lock()

    def tick(self, storm: Storm, now: float) -> None:
        pass

    def finish(self, storm: Storm) -> None:
        pass

    def add(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)


class Storm:
    def __init__(self, config: Config, backend: Backend, url: str, outdir: Path,
                 spec: Spec, injector: Injector) -> None:
        from once.periods import every
        from once.run.flow import current_period

        self.config, self.backend, self.url, self.spec = config, backend, url, spec
        self.outdir = outdir
        outdir.mkdir(parents=True, exist_ok=True)
        self.injector = injector
        self.rng = random.Random(config.rng.random())
        self.log = outdir / f"{spec.job}.log"
        self.env = {**base_env(url, outdir), "TORTURE_LOG": str(self.log),
                    "TORTURE_WORK_MIN": str(spec.work[0]),
                    "TORTURE_WORK_MAX": str(spec.work[1]),
                    "TORTURE_LOCKS": str(outdir / "locks"),
                    # A wrapper that crashes says where (the command, `python -I`, ignores it).
                    "PYTHONFAULTHANDLER": "1", **spec.extra_env}
        (outdir / "locks").mkdir(exist_ok=True)
        self.schedule = every("hour", "UTC")
        self.first = current_period(self.schedule, spec.periods - 1)
        self.procs: list[Proc] = []
        self.by_pid: dict[int, Proc] = {}
        self.converged = False
        self.took = 0.0
        self.stragglers = 0
        self._log_offset = 0
        self.running: dict[tuple[str, int], Mark] = {}  # started, not yet ended
        self.owners: dict[tuple[str, int], Proc] = {}  # (period, fence) -> its wrapper
        self.finished: set[str] = set()  # periods whose work was finished at least once
        self.dones = 0  # `done` lines read so far
        self.longest_stale = spec.stale  # the longest --stale-after any wrapper was given

    # -- the periods

    def expected(self) -> list[str]:
        from once.run.flow import current_period

        last = current_period(self.schedule)
        return [p.key for p in self.schedule.between(self.first, last)]

    # -- re-fires

    def fire(self) -> None:
        self.start([*self.spec.prefix, *self.argv(), "--", *CHILD])

    def start(self, argv: list[str], tag: str = "w") -> Proc:
        proc = Proc(argv, self.env, self.outdir, tag)
        self.procs.append(proc)
        self.by_pid[proc.pid] = proc
        return proc

    def argv(self) -> list[str]:
        spec = self.spec
        common = ["--job", spec.job, "--every", "hour", "--stale-after", f"{spec.stale:g}s",
                  "--kill-after", f"{min(2.0, spec.stale / 3):g}s",
                  "--max-attempts", str(spec.max_attempts), "-v",
                  "--log-format", "json"]
        choice = self.rng.random()
        if choice < 0.6:
            argv = [ONCE, "catchup", *common, "--since", self.first.key]
        elif choice < 0.8:
            keys = self.expected()
            i = self.rng.randrange(len(keys))
            j = self.rng.randrange(i, len(keys))
            argv = [ONCE, "catchup", *common, "--since", keys[i], "--until", keys[j]]
        else:
            argv = [ONCE, "run", *common, "--catchup", str(spec.periods)]
        return argv

    def live(self) -> list[Proc]:
        return [p for p in self.procs if p.poll() is None]

    # -- what the children say

    def read_log(self) -> None:
        if not self.log.exists():
            return
        with open(self.log) as handle:
            handle.seek(self._log_offset)
            data = handle.read()
        complete = data[: data.rfind("\n") + 1]
        self._log_offset += len(complete.encode())
        for line in complete.splitlines():
            parts = line.split()
            if len(parts) != 7:
                continue
            mark = Mark(parts[0], parts[1], int(parts[2]), int(parts[3]), int(parts[4]),
                        float(parts[5]), float(parts[6]))
            key = (mark.period, mark.fence)
            if mark.word == "start":
                self.running[key] = mark
                owner = self.owner_of(mark)
                if owner is not None:
                    self.owners[key] = owner
            elif mark.word in END:
                self.running.pop(key, None)
                if mark.word == "done":
                    self.finished.add(mark.period)
                    self.dones += 1

    def owner_of(self, mark: Mark) -> Proc | None:
        """The wrapper whose command this is (child -> guard -> wrapper), if still ours."""
        guard = parent_of(mark.pid)
        wrapper = parent_of(guard) if guard else None
        proc = self.by_pid.get(wrapper or -1)
        return proc if proc is not None and proc.poll() is None else None

    # -- the storm

    def blow(self) -> None:
        spec = self.spec
        began = time.monotonic()
        next_fire = began
        next_check = began + 1.0
        while True:
            now = time.monotonic()
            self.read_log()
            for proc in self.procs:
                proc.poll()
            self.injector.tick(self, now)
            if now >= next_fire and len(self.live()) < spec.max_live:
                self.fire()
                next_fire = now + self.rng.uniform(*spec.refire)
            if now >= next_check:
                next_check = now + 1.0
                if self.done_in_ledger():
                    self.converged = True
                    break
            if now - began > spec.limit:
                break
            time.sleep(0.03)
        self.took = time.monotonic() - began
        self.injector.finish(self)
        # Let the wrappers still walking the periods end by themselves; then stop the rest.
        deadline = time.monotonic() + 60
        for proc in self.procs:
            if proc.wait(max(0.1, deadline - time.monotonic())) is None:
                proc.kill()
                self.stragglers += 1
        time.sleep(0.5)  # a killed wrapper's guard takes its command down with it
        self.read_log()

    def done_in_ledger(self) -> bool:
        try:
            rows = self.backend.query(
                self.url, "SELECT period FROM once_runs WHERE job = %s AND status = 'done'",
                (self.spec.job,))
        except Exception:  # the server may be down right now: not converged yet
            return False
        done = {p for (p,) in rows}
        return all(key in done for key in self.expected())

    # -- the verdict

    def verdict(self) -> Verdict:
        return Verdict(self)


# -- owner faults ------------------------------------------------------------------------------


class OwnerFaults(Injector):
    """SIGKILL, SIGSTOP (past --stale-after, then SIGCONT) and SIGTERM of wrappers whose
    command is running. A fault is only made while the command has work left (more than
    `margin`, and for SIGSTOP more than --stale-after plus `margin`), so that any `done` of a
    hit command is a finish its owner should have prevented."""

    KINDS = ("SIGKILL", "SIGSTOP", "SIGTERM")

    def __init__(self, rng: random.Random, every: tuple[float, float] = (0.25, 0.6),
                 margin: float = 0.8) -> None:
        super().__init__()
        self.rng, self.every, self.margin = rng, every, margin
        self.next = 0.0
        self.resume: list[tuple[float, Proc]] = []
        self.hits: Counter[str] = Counter()  # faults per period: at most 3, so it converges

    def tick(self, storm: Storm, now: float) -> None:
        for when, proc in list(self.resume):
            if now >= when:
                proc.signal(signal.SIGCONT, "SIGCONT")
                proc.stopped = False
                self.resume.remove((when, proc))
        if now < self.next:
            return
        self.next = now + self.rng.uniform(*self.every)
        kind = self.rng.choice(self.KINDS)
        need = self.margin + (storm.spec.stale if kind == "SIGSTOP" else 0.0)
        wall = time.time()
        candidates = []
        for mark in storm.running.values():
            if mark.at + mark.work - wall > need and self.hits[mark.period] < 3:
                owner = storm.owner_of(mark)
                if owner is not None and not owner.stopped:
                    candidates.append((mark, owner))
        if not candidates:
            return
        mark, owner = self.rng.choice(candidates)
        sig = {"SIGKILL": signal.SIGKILL, "SIGSTOP": signal.SIGSTOP,
               "SIGTERM": signal.SIGTERM}[kind]
        if not owner.signal(sig, kind):
            return
        detail = ""
        if kind == "SIGSTOP":
            owner.stopped = True
            # Short: past --stale-after; long: past the end of the command's work too, so
            # that it would finish while its owner is stopped unless something stops it.
            if self.rng.random() < 0.5:
                pause, detail = storm.spec.stale + self.rng.uniform(0.5, 2.0), "short"
            else:
                left = mark.at + mark.work - wall
                pause, detail = left + self.rng.uniform(0.3, 1.5), "long"
            self.resume.append((now + pause, owner))
        self.hits[mark.period] += 1
        self.add(Fault(kind, wall, wall, mark.period, mark.fence, detail))

    def finish(self, storm: Storm) -> None:
        for _when, proc in self.resume:
            proc.signal(signal.SIGCONT, "SIGCONT")
            proc.stopped = False
        self.resume.clear()


# -- database faults ---------------------------------------------------------------------------


class Background(Injector):
    """A fault that takes a while, made on a thread of its own every so often."""

    def __init__(self, rng: random.Random, every: tuple[float, float]) -> None:
        super().__init__()
        self.rng, self.every = rng, every
        self.next = time.monotonic() + rng.uniform(*every)
        self.thread: threading.Thread | None = None
        self.errors: list[str] = []

    def tick(self, storm: Storm, now: float) -> None:
        if now < self.next or (self.thread is not None and self.thread.is_alive()):
            return
        self.thread = threading.Thread(target=self._guarded, args=(storm,), daemon=True)
        self.thread.start()

    def _guarded(self, storm: Storm) -> None:
        try:
            self.make(storm)
        except Exception as exc:  # reported in the notes: the fault itself failed
            self.errors.append(str(exc).splitlines()[0] if str(exc) else repr(exc))
        finally:
            self.next = time.monotonic() + self.rng.uniform(*self.every)

    def make(self, storm: Storm) -> None:
        raise NotImplementedError

    def finish(self, storm: Storm) -> None:
        if self.thread is not None:
            self.thread.join(120)


class ServerRestarts(Background):
    """The embedded PostgreSQL server stopped (immediate shutdown: a crash, to its clients)
    for a while, then started again."""

    def __init__(self, rng: random.Random, every: tuple[float, float],
                 down: tuple[float, float]) -> None:
        super().__init__(rng, every)
        self.down = down

    def make(self, storm: Storm) -> None:
        backend = storm.backend
        t0 = time.time()
        backend.server_down()  # type: ignore[attr-defined]
        pause = self.rng.uniform(*self.down)
        time.sleep(pause)
        backend.server_up()  # type: ignore[attr-defined]
        self.add(Fault("server restart", t0, time.time(), detail=f"down {pause:.1f}s",
                       db=True))

    def finish(self, storm: Storm) -> None:
        super().finish(storm)
        if not storm.backend.up:  # type: ignore[attr-defined]
            storm.backend.server_up()  # type: ignore[attr-defined]


class ConnectionKills(Background):
    """Every connection of the ledger's database killed server-side
    (pg_terminate_backend, MariaDB KILL CONNECTION)."""

    def make(self, storm: Storm) -> None:
        t0 = time.time()
        killed = storm.backend.kill_connections(storm.url)
        if killed:
            self.add(Fault("connections killed", t0, time.time(), detail=str(killed),
                           db=True))


class SqliteLocks(Background):
    """SQLite's write lock held by an outsider (BEGIN IMMEDIATE) for a while: claims,
    renewals and finishes wait for it, past their busy timeout."""

    def __init__(self, rng: random.Random, every: tuple[float, float],
                 hold: tuple[float, float]) -> None:
        super().__init__(rng, every)
        self.hold = hold

    def make(self, storm: Storm) -> None:
        import sqlite3

        from once.ledger import parse_url

        conn = sqlite3.connect(parse_url(storm.url).path, isolation_level=None, timeout=30)
        try:
            conn.execute("BEGIN IMMEDIATE")
            t0 = time.time()
            pause = self.rng.uniform(*self.hold)
            time.sleep(pause)
            conn.execute("ROLLBACK")
            self.add(Fault("write lock held", t0, time.time(), detail=f"{pause:.1f}s",
                           db=True))
        finally:
            conn.close()
