"""A process stopped (SIGSTOP, a suspended VM) right after its renewal's statement holds no
lock: a renewal is one statement, committed by the server as it ends (Ledger._single). When
the COMMIT was sent apart, a process stopped between the two kept SQLite's write lock (every
other writer of the ledger waited, then exited 75) or, on MySQL/MariaDB, the row's lock (no
host could take the period over until it was continued or the server dropped its session).

Real processes on every backend: an owner that claims through once.claim and stops itself
the moment its driver has run the renewal's UPDATE, and real `once run` beside it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import ONCE, wait_for
from ledger_sql import query
from procs import stat

# The owner: once.claim with a 2 s promise (a renewal every 2/3 s); its connection wrapped so
# that the process stops itself once the driver has run the first renewal.
OWNER = r"""
import os, signal, sys, time

import once
from once.ledger import parse_url
from once.ledger.dialects import of

url = sys.argv[1]
cls = of(parse_url(url)).ledger_class()
opened = cls._open


def renewal(sql):
    said = " ".join(str(sql).split())
    return said.startswith(("UPDATE once_runs SET heartbeat_at",
                            "UPDATE once_leases SET renewed_at"))


class Stops:
    def __init__(self, inner):
        self.__dict__["inner"] = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    def _then(self, sql, result):
        if renewal(sql):
            os.kill(os.getpid(), signal.SIGSTOP)
        return result

    def execute(self, sql, *args, **kwargs):
        return self._then(sql, self.inner.execute(sql, *args, **kwargs))

    def cursor(self, *args, **kwargs):
        outer = self

        class Cursor:
            def __init__(self, inner):
                self.__dict__["inner"] = inner

            def __getattr__(self, name):
                return getattr(self.inner, name)

            def execute(self, sql, *a, **k):
                return outer._then(sql, self.inner.execute(sql, *a, **k))

        return Cursor(self.inner.cursor(*args, **kwargs))


cls._open = lambda self: Stops(opened(self))
if sys.argv[2] == "claim":
    with once.claim("held", every="hour", db=url, stale_after=2) as run:
        assert run.won
        time.sleep(120)
else:
    with once.lead("beat", db=url, lease=3):
        time.sleep(120)
"""


def _stopped(pid: int) -> bool:
    fields = stat(pid)
    return fields is not None and fields[0] == "T"


@contextmanager
def stopped_by_its_renewal(kind: str, ledger_url: str, env: dict[str, str],
                           tmp_path: Path) -> Iterator[None]:
    """OWNER as `kind` (claim, lead), until it has stopped itself at its first renewal;
    SIGKILLed at the end (which ends a stopped process too)."""
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen([sys.executable, str(script), ledger_url, kind], env=env,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _stopped(owner.pid) or owner.poll() is not None, timeout=60,
                 what="the owner stopped by its renewal")
        assert owner.poll() is None, owner.stderr.read() if owner.stderr else ""
        yield
    finally:
        owner.kill()
        owner.wait(timeout=30)


def _run(env: dict[str, str], job: str, *extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ONCE, "run", "--job", job, "--every", "hour", *extra, "--", "true"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_a_process_stopped_after_its_renewal_holds_no_lock(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    with stopped_by_its_renewal("claim", ledger_url, once_env, tmp_path):
        _run(once_env, "other")  # another job's claim and finish: SQLite's write lock is free
        if ledger_url.startswith("sqlite"):
            return  # a live owner keeps its claim by its OS lock, stopped or not (by design)
        # Its own row, once stale, is taken over: no row lock is held.
        (stale,) = query(ledger_url, "SELECT stale_after FROM once_runs WHERE job = 'held'")[0]
        assert float(stale) == 2.0
        wait_for(lambda: "took over as attempt 2" in _run(once_env, "held", "--stale-after",
                                                            "2s").stderr,
                 timeout=60, what="the stopped owner's row taken over")  # skips while fresh
        assert query(ledger_url, "SELECT status, attempt FROM once_runs "
                                 "WHERE job = 'held'") == [("done", 2)]


def test_a_leader_stopped_after_its_renewal_holds_no_lock(
        ledger_url: str, once_env: dict[str, str], tmp_path: Path) -> None:
    """The lease's renewal: a candidate leads once the stopped leader's lease has run out
    (SQLite: the ledger's write lock is free; the lead name's OS lock stays with the live
    leader's process, stopped or not, by design: docs/concepts/leases.md, "on SQLite, also")."""
    with stopped_by_its_renewal("lead", ledger_url, once_env, tmp_path):
        if ledger_url.startswith("sqlite"):
            _run(once_env, "other")
            return
        led = subprocess.run([ONCE, "lead", "--name", "beat", "--lease", "3s", "--", "sh",
                              "-c", "echo $ONCE_TERM"], env=once_env, capture_output=True,
                             text=True, timeout=120)
        assert led.returncode == 0, led.stderr
        assert led.stdout.strip() == "2", led.stdout
