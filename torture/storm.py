"""A storm: cron-like re-fires of real wrappers over a range of periods, under injected
faults, until the ledger converges; then the verdict, period by period and fault by fault.

The re-fire loop starts a wrapper every fraction of a second (`once catchup --since P0`,
`once catchup` over a random window, or `once run --catchup N`), at most `max_live` at a
time, until every period from P0 to the current one is done, or a time bound passes. Every
wrapper runs torture/child.py, which logs start / done / term with its period and fence.

A period is judged from three sources: the children's own log, the ledger (once_runs and
once_attempts) and each wrapper's JSON log (-v --log-format json). It holds when:

- it converged: once_runs says done, by an attempt whose command did finish (a `done` line
  with the row's fence);
- its work was finished exactly once: one `done` line. A second `done` is a duplicate, and
  lost, unless its owner told why the first finish went unrecorded in a way the contract
  documents: exit 75, "the result was not recorded" (the ledger was unreachable at the very
  end; the period runs again once the claim goes stale), or, under a database fault, exit
  70 because the late final write found the stale claim taken over. Such a period is
  "redone" and counted apart in the notes: under ledger faults `once` is at least once, and
  the command's own fence or idempotency key is what makes a rerun harmless;
- no command finished after its period was taken over (its `done` time is after the
  started_at, by the database's clock on the same host, of an attempt with a larger fence);
- no claim's command ran twice (two `start` lines with one fence);
- no command outlived the torture (a child still alive at the end: its owner died and it
  was not killed with it).

A fault holds when every period it touched holds (owner faults: the period of the wrapper
it hit; database faults: every period with a command running during the fault).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    CHILD,
    ONCE,
    Backend,
    Config,
    Mark,
    Proc,
    Row,
    base_env,
    db_time,
    histogram,
    parent_of,
    proc_stat,
    read_marks,
    status_word,
)

TOLERANCE = 0.002  # SQLite's clock has milliseconds


@dataclass
class Fault:
    kind: str
    t0: float  # wall clock
    t1: float
    period: str | None = None  # owner faults: the period of the command that was hit
    fence: int | None = None
    detail: str = ""


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
        from once.core import current_period
        from once.periods import every

        self.config, self.backend, self.url, self.spec = config, backend, url, spec
        self.outdir = outdir
        outdir.mkdir(parents=True, exist_ok=True)
        self.injector = injector
        self.rng = random.Random(config.rng.random())
        self.log = outdir / f"{spec.job}.log"
        self.env = {**base_env(url, outdir), "TORTURE_LOG": str(self.log),
                    "TORTURE_WORK_MIN": str(spec.work[0]),
                    "TORTURE_WORK_MAX": str(spec.work[1]), **spec.extra_env}
        self.schedule = every("hour", "UTC")
        self.first = current_period(self.schedule, spec.periods - 1)
        self.procs: list[Proc] = []
        self.by_pid: dict[int, Proc] = {}
        self.converged = False
        self.took = 0.0
        self.stragglers = 0
        self._log_offset = 0
        self.running: dict[tuple[str, int], Mark] = {}  # started, not yet ended

    # -- the periods

    def expected(self) -> list[str]:
        from once.core import current_period

        last = current_period(self.schedule)
        return [p.key for p in self.schedule.between(self.first, last)]

    # -- re-fires

    def fire(self) -> None:
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
        proc = Proc([*spec.prefix, *argv, "--", *CHILD], self.env, self.outdir, "w")
        self.procs.append(proc)
        self.by_pid[proc.pid] = proc

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
            else:
                self.running.pop(key, None)

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


@dataclass
class Attempt:
    period: str
    attempt: int
    fence: int
    status: str
    started_at: float


class Verdict:
    """Every period's problems, and what the notes say."""

    def __init__(self, storm: Storm) -> None:
        self.storm = storm
        backend, url, job = storm.backend, storm.url, storm.spec.job
        self.marks = read_marks(storm.log)
        self.runs = {p: (s, int(a), int(f)) for p, s, a, f in backend.query(
            url, "SELECT period, status, attempt, fence FROM once_runs WHERE job = %s",
            (job,))}
        self.attempts: dict[str, list[Attempt]] = defaultdict(list)
        for p, a, f, s, at in backend.query(
                url, "SELECT period, attempt, fence, status, started_at FROM once_attempts "
                     "WHERE job = %s", (job,)):
            self.attempts[p].append(Attempt(p, int(a), int(f), s, db_time(at)))
        # fence -> (the wrapper that claimed it, its events for that fence)
        self.claims: dict[int, tuple[Proc, list[dict[str, Any]]]] = {}
        for proc in storm.procs:
            for event in proc.events():
                fence = event.get("fence")
                if isinstance(fence, int):
                    self.claims.setdefault(fence, (proc, []))[1].append(event)
        self.redone: list[str] = []
        # period -> [(the fence a problem is about, or None for the period's), problem]
        self.problems: dict[str, list[tuple[int | None, str]]] = {}
        expected = storm.expected()
        for key in expected:
            self.problems[key] = self._period(key)
        strays = set(self.runs) - set(expected)
        for key in sorted(strays):  # a period after the bound (the hour turned): judge it too
            self.problems[key] = self._period(key, needed=False)
        self.orphans = [m for m in self.marks if m.word == "start"
                        and not any(n.word != "start" and n.pid == m.pid for n in self.marks)
                        and _alive(m.pid)]
        self.tracebacks = [p.name for p in storm.procs if "Traceback" in p.stderr()]

    def _period(self, key: str, needed: bool = True) -> list[tuple[int | None, str]]:
        problems: list[tuple[int | None, str]] = []
        marks = [m for m in self.marks if m.period == key]
        dones = sorted((m for m in marks if m.word == "done"), key=lambda m: m.at)
        starts = Counter(m.fence for m in marks if m.word == "start")
        for fence, n in starts.items():
            if n > 1:
                problems.append((fence, f"the command of fence {fence} started {n} times"))
        status, _attempt, fence = self.runs.get(key, ("missing", 0, 0))
        if status != "done":
            if needed or status != "missing":
                problems.append((None, f"not converged: {status}"))
        elif not any(d.fence == fence for d in dones):
            problems.append((None, f"done by fence {fence}, whose command never finished"))
        attempts = sorted(self.attempts.get(key, []), key=lambda a: a.fence)
        for d in dones:
            later = [a.started_at for a in attempts if a.fence > d.fence]
            if later and d.at > min(later) + TOLERANCE:
                problems.append((d.fence, f"fence {d.fence} finished {d.at - min(later):.3f}s "
                                          f"after its period was taken over"))
        extra = [d for d in dones if d.fence != fence]
        for d in extra:
            later = [a.started_at for a in attempts if a.fence > d.fence]
            cause = self._redo_cause(d.fence, d.at, min(later) if later else d.at)
            if cause:
                self.redone.append(f"{key} fence {d.fence}: {cause}")
            else:
                problems.append((d.fence, f"finished twice: fence {d.fence} finished at "
                                          f"{d.at:.3f}, then fence {fence} ran it again "
                                          f"({self._story(d.fence)})"))
        return problems

    def overlaps(self) -> list[float]:
        """How long commands ran on after their period was taken over (killed unfinished,
        or the finish is a loss of its own)."""
        ends = {(m.period, m.fence): m.at for m in self.marks if m.word != "start"}
        found = []
        for m in self.marks:
            if m.word != "start":
                continue
            later = [a.started_at for a in self.attempts.get(m.period, [])
                     if a.fence > m.fence]
            end = ends.get((m.period, m.fence))
            if later and end is not None and end > min(later) + TOLERANCE:
                found.append(end - min(later))
        return found

    def _redo_cause(self, fence: int, finished: float, taken: float) -> str:
        """Why a command that finished (before any takeover) had its result go unrecorded,
        when the contract documents it; '' when nothing does."""
        proc, events = self.claims.get(fence, (None, []))
        if proc is None:
            return ""
        if any(e.get("event") == "unreachable" for e in events) and proc.returncode == 75:
            return "its owner could not record the result (ledger unreachable, exit 75)"
        # A database fault kept the owner from renewing and from writing the result in
        # time: its claim went stale, another attempt took over, and the late final write
        # matched no row (exit 70). Only a fault of the ledger's during that window counts.
        late = any(e.get("event") == "fenced-out" and "final write matched no row"
                   in str(e.get("message")) for e in events) and proc.returncode == 70
        stale = self.storm.spec.stale
        hit = any(f.period is None and f.t0 <= taken and f.t1 >= finished - stale
                  for f in self.storm.injector.faults)
        if late and hit:
            return ("its owner's final write came after its claim went stale under a "
                    "database fault (exit 70)")
        return ""

    def _story(self, fence: int) -> str:
        proc, events = self.claims.get(fence, (None, []))
        if proc is None:
            return "no wrapper logged that fence"
        said = "; ".join(f"{e.get('event')}: {e.get('message', '')[:120]}" for e in events)
        faults = ", ".join(kind for kind, _ in proc.faults) or "none"
        return f"owner {status_word(proc.returncode)}, faults {faults}; {said}"

    def touched(self, fault: Fault) -> list[str]:
        """The periods a fault may have touched."""
        if fault.period is not None:
            return [fault.period]
        found = set()
        ends: dict[tuple[str, int], float] = {}
        for m in self.marks:
            if m.word != "start":
                ends[(m.period, m.fence)] = m.at
        for m in self.marks:
            if m.word == "start" and m.at <= fault.t1 and ends.get(
                    (m.period, m.fence), float("inf")) >= fault.t0:
                found.add(m.period)
        return sorted(found)

    def judge_faults(self, rows: dict[str, Row], label: Callable[[str], str]) -> None:
        for fault in self.storm.injector.faults:
            row = rows.setdefault(fault.kind, Row(label(fault.kind)))
            problems = [f"{key}: {text}" for key in self.touched(fault)
                        for fence, text in self.problems.get(key, [])
                        if fault.fence is None or fence in (None, fault.fence)]
            what = f"{fault.kind} at {fault.t0:.3f}"
            if fault.detail:
                what += f" [{fault.detail}]"
            if fault.period:
                what += f" ({fault.period} fence {fault.fence})"
            row.judge(problems, what)

    def periods_row(self, title: str) -> Row:
        row = Row(title)
        for key, problems in self.problems.items():
            row.judge([text for _, text in problems], key)
        if self.orphans:
            for m in self.orphans[:5]:
                row.fail(f"the command of {m.period} fence {m.fence} (pid {m.pid}) outlived "
                         f"its owner")
        for name in self.tracebacks[:5]:
            row.fail(f"traceback in wrapper {name}")
        storm = self.storm
        codes = [status_word(p.returncode) for p in storm.procs]
        takeovers = sum(1 for a in self.attempts.values() for x in a if x.attempt > 1)
        row.note(f"{len(storm.procs)} wrappers ({histogram(codes)})")
        row.note(f"{takeovers} takeovers; "
                 + ("converged" if storm.converged else "NOT converged")
                 + f" in {storm.took:.0f}s")
        overlaps = self.overlaps()
        if overlaps:
            row.note(f"{len(overlaps)} commands ran on after a takeover (longest "
                     f"{max(overlaps):.1f}s)")
        if self.redone:
            row.note(f"redone after a finish the ledger could not record in time "
                     f"(documented: exit 75 or 70): {len(self.redone)}")
        if storm.stragglers:
            row.note(f"{storm.stragglers} wrappers still running 60s after convergence")
        return row


def _alive(pid: int) -> bool:
    """A torture child with this pid is still running (not a stranger that reused it)."""
    fields = proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    try:
        return b"child.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


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
        self.add(Fault("server restart", t0, time.time(), detail=f"down {pause:.1f}s"))

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
            self.add(Fault("connections killed", t0, time.time(), detail=str(killed)))


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
            self.add(Fault("write lock held", t0, time.time(), detail=f"{pause:.1f}s"))
        finally:
            conn.close()
