"""`once lead`: one leader per name for a long-running command, the rest candidates.

    candidate ──(the lease is free: acquire wins a term)──> leader: the command runs
        ^                                                     │
        │   (--rejoin)                                        ├─ the command ends: release, exit
        └──────────────── lost: stepped down ─────────────────┤   with its status
                                                              └─ a stop signal: forwarded; once
                                                                 the group is dead, release

The command runs under the wrapper and guard of `once run` (once.run.wrapper): renewed every
third of the lease, counted from when the last successful renewal was *sent*, it gets SIGTERM
--kill-after before that renewal's deadline and SIGKILL at it, from the guard too when this
process is stopped or killed. Each state change is one `once:` line (or a JSON event). No SQL
here: the statements are once.ledger.leases'.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

from once.deadlines import lease_now, max_grace
from once.messages import ERROR, NORMAL, say
from once.run.child import EXPORTED, LEAD_EXPORTED
from once.run.lease import Lease
from once.run.stops import FORWARDED, signal_name

if TYPE_CHECKING:
    from once.ledger import Ledger
    from once.ledger.leases import Leases, Peek

# A candidate looks at the lease this often (jittered), so that it learns of a free lease
# within a second; a look is one indexed read.
POLL = 0.5
# After a failed look (the ledger unreachable) it waits longer each time, up to this.
MAX_BACKOFF = 5.0
QUIET_TRIES = 5  # lost races or passing errors in a row that are tried again without a line
LEASE_MIN = 3.0  # seconds: a statement's bound (at least 1 s) must fit a third of it
LEASE_MAX = 365 * 86400  # seconds: a year (the docs'), for a leader lost with its host
FENCED_OUT = 70  # the lease was lost and the command stopped (docs: exit statuses)


def lease_problem(lease: float, kill_after: float | None) -> str:
    """Why --lease and --kill-after cannot keep the promise ('' when they can): the command
    must be dead by the lease's deadline, with a renewal sent every third of the lease and
    answered within a statement's bound before the SIGTERM goes out."""
    if not LEASE_MIN <= lease <= LEASE_MAX:
        return (f"--lease {lease:.10g}s: use {LEASE_MIN:g}s to 365d (1 year; renewed every "
                f"third of it, each renewal bounded by at least a second)")
    grace = kill_after_for(lease, kill_after)
    # A third: the renewal due a third of the lease before the SIGTERM has that long to be
    # answered, which its bound (statement_timeout, at most a third) always fits.
    if grace > max_grace(lease):
        return (f"--kill-after {grace:g}s does not fit --lease {lease:g}s: the command must be "
                f"dead by the lease's deadline, so the grace is at most a third of the lease "
                f"({max_grace(lease):.3g}s)")
    return ""


def kill_after_for(lease: float, kill_after: float | None) -> float:
    """--kill-after, or by default a third of the lease, at most 10 s."""
    return min(10.0, lease / 3) if kill_after is None else kill_after


class Voice:
    """How `once lead` says its lines (once.messages.Voice)."""

    def __init__(self, name: str, owner: str, verbosity: int = NORMAL,
                 log_format: str = "text") -> None:
        self.verbosity, self.log_format, self.owner = verbosity, log_format, owner
        self.context: dict[str, object] = {"lead": name}


class Elector:
    """One process's candidacy for a lead name on one ledger: waits for the lease, holds it
    while the caller leads, gives it up."""

    def __init__(self, ledger: Ledger, name: str, lease: float, owner: str,
                 voice: Voice) -> None:
        from once.ledger.leases import Leases, new_holder

        self.ledger, self.name, self.lease, self.owner = ledger, name, float(lease), owner
        self.leases: Leases = Leases(ledger)
        self.holder = new_holder()
        self.voice = voice
        self.stop = threading.Event()  # set by a stop signal (or the API's caller)
        self._said = ""  # the last state line, not said twice
        self._stood_at = -1e9
        self._won: set[int] = set()  # the terms our acquires were answered with
        self._unanswered = False  # an acquire raised: it may have committed all the same

    def say(self, message: str, event: str, level: int = NORMAL) -> None:
        key = f"{event}:{message}"
        if key != self._said:
            self._said = key
            say(message, self.voice, level, event=event,
                json_level="error" if level == ERROR else "info")

    # -- a candidate

    def campaign(self) -> tuple[int, float] | None:
        """Wait for the lease and take it: (term, when the acquire was sent, lease clock);
        None when `stop` was set first."""
        backoff, passing = POLL, 0
        while not self.stop.is_set():
            try:
                won = self._try()
                backoff, passing = POLL, 0
            except Exception as exc:  # a LedgerError: unreachable, refused, a lost race
                self.ledger.close()  # the next look opens a fresh connection
                passing += 1
                if not (self._lost_race(exc) and passing < QUIET_TRIES):
                    self.say(f"{self.name}: a candidate that cannot reach the ledger ({exc}); "
                             f"trying again, at most every {MAX_BACKOFF:g}s", "ledger-error",
                             ERROR)
                    backoff = min(backoff * 2, MAX_BACKOFF)
                pause = backoff
            else:
                if isinstance(won, tuple):
                    return won
                pause = won
            self.stop.wait(random.uniform(0.8, 1.2) * pause)
        return None

    def _try(self) -> tuple[int, float] | float:
        """One look, and an acquire if the lease is free: the term won, or how long to wait."""
        from once.ledger.leases import stand_interval

        peek = self.leases.peek(self.name)
        if self._ours_unanswered(peek):
            self._release_unanswered(peek.term)
            peek = self.leases.peek(self.name)
        if peek.free:
            won = self._acquire()
            if won is not None:
                return won
            peek = self.leases.peek(self.name)
        if lease_now() - self._stood_at >= stand_interval(self.lease):
            self._stood_at = lease_now()
            with suppress(Exception):  # for the reports alone: a busy ledger may skip one
                self.leases.stand(self.name, self.holder, self.owner)
        self._say_held(peek)
        return max(0.05, min(POLL, peek.free_in))

    def _acquire(self) -> tuple[int, float] | None:
        self._unanswered = True  # until an answer says otherwise
        won = self.leases.acquire(self.name, self.holder, self.owner, self.lease)
        self._unanswered = False
        if won is not None:
            self._won.add(won[0])
        return won

    def _ours_unanswered(self, peek: Peek) -> bool:
        """The lease held under our holder id in a term no answer gave us: an acquire of ours
        that raised had committed (a connection cut, a read that timed out while a Galera
        cluster settled after a node's loss). One that has run out is left to the next
        acquire, which ends it `expired` as any."""
        return (self._unanswered and peek.holder == self.holder and not peek.free
                and peek.term not in self._won)

    def _release_unanswered(self, term: int) -> None:
        """Nothing ran under such a term: released, so that nobody waits a whole lease for
        it to run out, and the next look may acquire at once."""
        self.leases.release(self.name, self.holder, term)
        self._unanswered = False
        self.say(f"{self.name}: released term {term}, won by an acquire of this candidate "
                 f"whose answer was lost; nothing ran under it", "released")

    def _say_held(self, peek: Peek) -> None:
        if peek.owner is not None and not peek.free:
            self.say(f"{self.name}: candidate; {peek.owner} leads (term {peek.term})",
                     "candidate")
        else:
            self.say(f"{self.name}: candidate; no leader now", "candidate")

    def _lost_race(self, exc: BaseException) -> bool:
        """A race lost to another candidate, or what passes (a lock held for a moment: a
        hundred candidates on one SQLite file): looked at again, without a line, unless it
        goes on (QUIET_TRIES)."""
        cause = exc.__cause__ or exc
        return (self.ledger.backend.lost_race(cause)
                or getattr(exc, "failure", "") in ("transient", "slow"))

    def withdraw(self) -> None:
        """This candidate stops: a term an unanswered acquire won is released (it would hold
        the others off for a lease), and its candidate row goes."""
        if self._unanswered:
            with suppress(Exception):  # unreleased, it runs out by itself
                peek = self.leases.peek(self.name)
                if self._ours_unanswered(peek):
                    self._release_unanswered(peek.term)
        with suppress(Exception):  # a candidate row left behind ages out of the reports
            self.leases.withdraw(self.name, self.holder)

    # -- the leader

    def lease_for(self, term: int, sent: float) -> Lease:
        """The term as its holder keeps it (once.run.lease): renewed by holder and term. A
        failed renewal closes the connection, so that the next opens a fresh one (a server
        restarted, a proxy's idle timeout, a failover: the lease outlives a short outage)."""
        def renew() -> bool:
            try:
                return self.leases.renew(self.name, self.holder, term, self.lease)
            except Exception:
                self.ledger.close()
                raise

        return Lease(renew, self.lease, sent)

    def release(self, term: int, how: str = "released") -> bool:
        """Give the lease up (the command's group is dead); False when it could not be
        written (it then runs out by itself)."""
        try:
            self.leases.release(self.name, self.holder, term, how)
        except Exception as exc:
            self.say(f"{self.name}: cannot release term {term} ({exc}); it runs out by "
                     f"itself within the lease", "release-failed", ERROR)
            return False
        return True


# -- `once lead -- COMMAND`


def child_env(name: str, term: int) -> dict[str, str]:
    """The command's environment: once's own variables of an outer run dropped (a nested
    `once` behaves as cron starts it), ONCE_LEAD and ONCE_TERM set (an outer leader's too)."""
    env = {key: value for key, value in os.environ.items()
           if key not in EXPORTED and key not in LEAD_EXPORTED}
    env.update({"ONCE_LEAD": name, "ONCE_TERM": str(term)})
    return env


def lead_command(elector: Elector, command: Sequence[str], kill_after: float,
                 rejoin: bool = False) -> int:
    """Stand, lead while the command runs, step down; the exit status (docs: exit
    statuses): the command's own, 0 for a candidate stopped by a signal, FENCED_OUT for a
    lost lease (unless `rejoin`: then it stands again)."""
    with _stop_signals(elector.stop):
        while True:
            won = elector.campaign()
            if won is None:
                elector.withdraw()
                elector.say(f"{elector.name}: stopped while a candidate", "stopped")
                return 0
            status, lost = _lead_once(elector, command, kill_after, *won)
            if not lost or not rejoin or elector.stop.is_set():
                return status
            elector.say(f"{elector.name}: standing again (--rejoin)", "rejoin")


def _lead_once(elector: Elector, command: Sequence[str], kill_after: float, term: int,
               sent: float) -> tuple[int, bool]:
    """One term: the status `once lead` would exit with, and whether the lease was lost."""
    from once.run import wrapper

    name = elector.name
    if elector.stop.is_set():  # a stop signal while the acquire was in flight
        elector.release(term)
        return 0, False
    lease = elector.lease_for(term, sent)
    elector.say(f"{name}: leading, term {term}", "leading")
    # The guard is forked holding the lead's OS lock (SQLite); ours goes once it is.
    outcome = wrapper.run(command, child_env(name, term), lease, kill_after,
                          on_start=elector.leases.hand_over, end_group=True)
    if lease.stranded:  # a renewal stuck in the driver still holds the connection
        elector.ledger.abandon()
    if outcome.interrupted_by is not None:
        elector.stop.set()  # the signal was forwarded to the command: this process stops too
    if outcome.kind == "fenced-out" or lease.lost:
        why = lease.last_error or ("the lease is no longer this process's (taken after it ran "
                                   "out, or retired)" if lease.lost else "its deadline came")
        elector.say(f"{name}: lost the lease of term {term} ({why}); the command was "
                    f"stopped", "lost", ERROR)
        elector.release(term, "lost")
        return FENCED_OUT, True
    released = elector.release(term)
    if outcome.kind in ("exec-failed", "guard-died"):  # said as `once run` says them
        what = (f"the command could not start ({outcome.message})"
                if outcome.kind == "exec-failed" else outcome.message)
        elector.say(f"{name}: {what}, status {outcome.status}"
                    + (f"; released term {term}" if released else ""), "released", ERROR)
        return outcome.status, False
    stopped = (f" after {signal_name(outcome.interrupted_by)}"
               if outcome.interrupted_by else "")
    ended = f"the command ended{stopped} with status {outcome.status}"
    elector.say(f"{name}: released term {term}; {ended}" if released else f"{name}: {ended}",
                "released")
    return outcome.status, False


@contextmanager
def _stop_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP stop a candidate (the wrapper forwards them to a leader's
    command while it runs, and they stop this loop after it)."""
    def handler(_signum: int, _frame: object) -> None:
        stop.set()

    handled = [sig for sig in FORWARDED if signal.getsignal(sig) != signal.SIG_IGN]
    previous = {sig: signal.signal(sig, handler) for sig in handled}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
