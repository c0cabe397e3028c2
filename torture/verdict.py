"""A storm's verdict: every period judged from the children's own log, the ledger and each
wrapper's JSON log (see storm.py for the storm itself).

A period holds when:

- it converged: once_runs says done, by an attempt whose command did finish (a `done` line
  with the row's fence); otherwise it is *never done*;
- no two attempts of it ran side by side: no child found the period's flock taken as it
  started (child.py); the seconds they overlapped are the *overlap*;
- its work was finished once per deliberate run: between two `done` lines there is a
  `once rerun` attempt, or the first finish went unrecorded for a reason the contract
  documents: exit 75, "the result was not recorded" (the ledger was unreachable at the very
  end), or, under a database fault, exit 70 because the late final write found the stale
  claim taken over (both *redone after an outage*), or its `once` was killed with SIGKILL
  (nothing is written then; *redone after a kill*). Any other second finish is *twice*;
- no command finished after its period was taken over (its `done` time is after the
  started_at, by the database's clock on the same host, of an attempt with a larger fence);
- no claim's command ran twice (two `start` lines with one fence);
- no command outlived the torture (a child still alive at the end: its owner died and it
  was not killed with it).

A fault holds when every period it touched holds (owner faults: the period of the wrapper
it hit; database faults: every period with a command running during the fault).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import END, Mark, Proc, Row, db_time, histogram, proc_stat, read_marks, status_word

if TYPE_CHECKING:
    from storm import Fault, Storm

TOLERANCE = 0.002  # SQLite's clock has milliseconds
KILLS = ("SIGKILL", "guard SIGKILL")  # what the torture does that makes `once` write nothing


@dataclass
class Attempt:
    period: str
    attempt: int
    fence: int
    status: str
    started_at: float
    rerun: bool


class Verdict:
    """Every period's problems, and what the notes and columns say."""

    def __init__(self, storm: Storm) -> None:
        self.storm = storm
        backend, url, job = storm.backend, storm.url, storm.spec.job
        self.marks = read_marks(storm.log)
        self.runs = {p: (s, int(a), int(f)) for p, s, a, f in backend.query(
            url, "SELECT period, status, attempt, fence FROM once_runs WHERE job = %s",
            (job,))}
        self.attempts: dict[str, list[Attempt]] = defaultdict(list)
        for p, a, f, s, at, reason in backend.query(
                url, "SELECT period, attempt, fence, status, started_at, reason "
                     "FROM once_attempts WHERE job = %s", (job,)):
            self.attempts[p].append(Attempt(p, int(a), int(f), s, db_time(at),
                                            reason is not None))
        # fence -> (the wrapper that claimed it, its events for that fence)
        self.claims: dict[int, tuple[Proc, list[dict[str, Any]]]] = {}
        for proc in storm.procs:
            for event in proc.events():
                fence = event.get("fence")
                if isinstance(fence, int):
                    self.claims.setdefault(fence, (proc, []))[1].append(event)
        for (_period, fence), proc in storm.owners.items():  # claimed, killed before a line
            self.claims.setdefault(fence, (proc, []))
        # period -> why a finish was run again: "outage" or "kill"
        self.redone: dict[str, dict[str, str]] = defaultdict(dict)
        self.overlap: dict[str, float] = {}  # period -> seconds two attempts ran side by side
        self.twice: set[str] = set()
        self.never: set[str] = set()
        # period -> [(the fence a problem is about, or None for the period's), problem]
        self.problems: dict[str, list[tuple[int | None, str]]] = {}
        expected = storm.expected()
        for key in expected:
            self.problems[key] = self._period(key)
        strays = set(self.runs) - set(expected)
        for key in sorted(strays):  # a period after the bound (the hour turned): judge it too
            self.problems[key] = self._period(key, needed=False)
        self.orphans = [m for m in self.marks if m.word == "start"
                        and not any(n.word in END and n.pid == m.pid for n in self.marks)
                        and alive_child(m.pid)]
        self.tracebacks = [p.name for p in storm.procs if "Traceback" in p.stderr()]
        # A wrapper dead of a signal the torture did not send it (SIGSEGV, SIGABRT...).
        self.crashes = [p for p in storm.procs if p.returncode is not None and p.returncode < 0
                        and not (p.returncode == -9 and any(k in KILLS for k, _ in p.faults))]

    def _period(self, key: str, needed: bool = True) -> list[tuple[int | None, str]]:
        problems: list[tuple[int | None, str]] = []
        marks = [m for m in self.marks if m.period == key]
        dones = sorted((m for m in marks if m.word == "done"), key=lambda m: m.fence)
        starts = Counter(m.fence for m in marks if m.word == "start")
        for fence, n in starts.items():
            if n > 1:
                problems.append((fence, f"the command of fence {fence} started {n} times"))
        status, _attempt, fence = self.runs.get(key, ("missing", 0, 0))
        if status != "done":
            if needed or status != "missing":
                problems.append((None, f"not converged: {status}"))
                self.never.add(key)
        elif not any(d.fence == fence for d in dones):
            problems.append((None, f"done by fence {fence}, whose command never finished"))
            self.never.add(key)
        attempts = sorted(self.attempts.get(key, []), key=lambda a: a.fence)
        for d in dones:
            later = [a.started_at for a in attempts if a.fence > d.fence]
            if later and d.at > min(later) + TOLERANCE:
                problems.append((d.fence, f"fence {d.fence} finished {d.at - min(later):.3f}s "
                                          f"after its period was taken over"))
        for beside, seconds in self._overlaps(marks):
            self.overlap[key] = self.overlap.get(key, 0.0) + seconds
            problems.append((beside, f"fence {beside} ran {seconds:.3f}s beside another "
                                     f"attempt of its period (its flock was taken)"))
        reruns = [a.fence for a in attempts if a.rerun]
        for first, second in pairwise(dones):
            if any(first.fence < r <= second.fence for r in reruns):
                continue  # run again on purpose
            later = [a.started_at for a in attempts if a.fence > first.fence]
            kind, cause = self._redo_cause(first.fence, first.at,
                                           min(later) if later else first.at)
            if kind:
                self.redone[key][f"fence {first.fence}"] = f"{kind}: {cause}"
                self.redone[key]["kind"] = kind
            else:
                self.twice.add(key)
                problems.append((first.fence, f"finished twice: fence {first.fence} finished "
                                              f"at {first.at:.3f}, then fence {second.fence} "
                                              f"ran it again ({self._story(first.fence)})"))
        return problems

    def _overlaps(self, marks: list[Mark]) -> list[tuple[int, float]]:
        """(fence, seconds) for every child that started while another held the period's
        flock: until it had the lock, or until it ended, or (killed before either) until the
        first of the others ended after it started."""
        found = []
        for m in marks:
            if m.word != "overlap":
                continue
            own = [n.at for n in marks if n.fence == m.fence and n.word in ("clear", *END)]
            others = [n.at for n in marks if n.fence != m.fence and n.word in END
                      and n.at >= m.at]
            until = min(own) if own else min(others) if others else m.at
            found.append((m.fence, max(until - m.at, 0.001)))
        return found

    def ran_on(self) -> list[float]:
        """How long commands ran on after their period was taken over (killed unfinished,
        or the finish is a loss of its own)."""
        ends = {(m.period, m.fence): m.at for m in self.marks if m.word in END}
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

    def _redo_cause(self, fence: int, finished: float, taken: float) -> tuple[str, str]:
        """Why a command that finished (before any takeover) had its result go unrecorded,
        when the contract documents it: ("outage" or "kill", why); ("", "") when nothing
        does."""
        proc, events = self.claims.get(fence, (None, []))
        if proc is None:
            return "", ""
        if any(e.get("event") == "unreachable" for e in events) and proc.returncode == 75:
            return "outage", "its owner could not record the result (ledger unreachable, exit 75)"
        # A database fault kept the owner from renewing and from writing the result in
        # time: its claim went stale, another attempt took over, and the late final write
        # matched no row (exit 70). Only a fault of the ledger's during that window counts.
        # Or the renewals could not get through: the owner stepped down at its deadline,
        # while its command (which ignores SIGTERM once its work is done) finished.
        # A wrapper the torture killed after it said so would have exited 70.
        killed_after = any(kind in KILLS for kind, _ in proc.faults)
        fenced = proc.returncode == 70 or (proc.returncode == -9 and killed_after)
        late = fenced and any(e.get("event") == "fenced-out" and (
            "final write matched no row" in str(e.get("message"))
            or "unreachable past the deadline" in str(e.get("message"))) for e in events)
        # Or it was killed after the takeover, before it could say so: the same story, its
        # final write held up past its promise, with the kill cutting its last line.
        late = late or (proc.returncode == -9 and any(
            kind in KILLS and t > taken for kind, t in proc.faults))
        stale = self.storm.longest_stale
        hit = any(f.period is None and f.db and f.t0 <= taken and f.t1 >= finished - stale
                  for f in self.storm.injector.faults)
        if late and hit:
            return "outage", ("a database fault kept its owner from renewing or recording in "
                              "time: the claim went stale (exit 70)")
        killed = [t for kind, t in proc.faults if kind in KILLS and t <= taken]
        if killed:
            return "kill", "its `once` (or guard) was killed with SIGKILL before it could " \
                           "record the result (nothing is written then)"
        return "", ""

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
            if m.word in END:
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
            problems += fault.problems
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
        for proc in self.crashes[:5]:
            row.fail(f"wrapper {proc.name} died of {status_word(proc.returncode)}: "
                     f"{proc.stderr()[-600:]!r}")
        storm = self.storm
        outage = [k for k, why in self.redone.items() if why["kind"] == "outage"]
        kill = [k for k, why in self.redone.items() if why["kind"] == "kill"]
        row.overlap = sum(self.overlap.values())
        row.twice, row.never = len(self.twice), len(self.never)
        row.redone = (len(outage), len(self.problems))
        codes = [status_word(p.returncode) for p in storm.procs]
        takeovers = sum(1 for a in self.attempts.values() for x in a if x.attempt > 1)
        row.note(f"{len(storm.procs)} wrappers ({histogram(codes)})")
        row.note(f"{takeovers} takeovers; "
                 + ("converged" if storm.converged else "NOT converged")
                 + f" in {storm.took:.0f}s")
        ran_on = self.ran_on()
        if ran_on:
            row.note(f"{len(ran_on)} commands ran on after a takeover's claim, before its "
                     f"command started (longest {max(ran_on):.3f}s)")
        if kill:
            row.note(f"redone after `once` was killed with SIGKILL before recording a "
                     f"finished command: {len(kill)}")
        if storm.stragglers:
            row.note(f"{storm.stragglers} wrappers still running 60s after convergence")
        return row


def alive_child(pid: int) -> bool:
    """A torture child with this pid is still running (not a stranger that reused it)."""
    fields = proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    try:
        return b"child.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
