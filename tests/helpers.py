"""Helpers for tests that drive the real `once` command and real databases."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ONCE = str(Path(sys.executable).with_name("once"))
# Where tests keep what a run leaves for a person to look at (screenshots, a crashed server's
# log): ONCE_TEST_ARTIFACTS, default test-artifacts/ at the repository's root.
ARTIFACTS = Path(os.environ.get("ONCE_TEST_ARTIFACTS")
                 or Path(__file__).resolve().parents[1] / "test-artifacts")

# Waits on a shared flock of the file in argv[1], then becomes argv[2:].
_LAUNCH = "import fcntl,os,sys; f=open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_SH); " \
          "os.execv(sys.argv[2], sys.argv[2:])"


def run_once(*args: str, env: dict[str, str], timeout: float = 60,
             **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run the real `once` command and wait for it."""
    return subprocess.run([ONCE, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, **kwargs)


# The commands that only read or write the ledger: a test may run them in its own process
# (run_here), since a process of their own adds nothing a test checks.
LEDGER_ONLY = frozenset({"status", "check", "history", "logs", "metrics", "periods", "prune",
                         "schema", "state"})
# What a process leaves unsaid by default (Python's default warning filters).
_UNSAID = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_here(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`once ARGS` in this process, as the `once` script runs it (once.cli.main: its `once:`
    lines and exit statuses, the warnings a process would print), with exactly `env` as its
    environment: a report over a seeded ledger needs no process of its own, which costs
    about half a second on a loaded machine."""
    from click.testing import CliRunner

    from once.cli.main import main

    overrides: dict[str, str | None] = {name: None for name in os.environ if name not in env}
    overrides.update(env)
    status: object = 0
    with CliRunner().isolation(env=overrides) as (out, err, _), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            main(list(args))
        except SystemExit as end:
            status = end.code
        for said in caught:
            if not issubclass(said.category, _UNSAID):
                sys.stderr.write(warnings.formatwarning(said.message, said.category,
                                                        said.filename, said.lineno))
        sys.stdout.flush()  # what is still in the text layer, as a process's exit flushes it
        sys.stderr.flush()
    code = status if isinstance(status, int) else 0 if status is None else 1
    return subprocess.CompletedProcess([ONCE, *args], code, out.getvalue().decode(),
                                       err.getvalue().decode())


def run_either(*args: str, env: dict[str, str],
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A ledger-only command in this process (run_here), any other as a real `once`."""
    if args and args[0] in LEDGER_ONLY:
        return run_here(*args, env=env)
    return run_once(*args, env=env, timeout=timeout)


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll an observable state until it holds (generous bound for a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


def release_together(commands: Sequence[Sequence[str]], gate: Path, env: dict[str, str],
                     timeout: float = 120) -> list[subprocess.CompletedProcess[str]]:
    """Start every command blocked on one lock, release them at the same instant, wait all.

    Each process is parked on a shared flock of `gate` while the test holds it exclusively;
    once all of them are seen waiting in /proc/locks the test lets go, and they run at once.
    """
    gate.touch()
    with open(gate) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        procs = [subprocess.Popen([sys.executable, "-c", _LAUNCH, str(gate), *cmd], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for cmd in commands]
        inode = os.stat(gate).st_ino
        wait_for(lambda: _waiters(inode) >= len(procs), what=f"{len(procs)} parked processes")
        fcntl.flock(held, fcntl.LOCK_UN)
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def _waiters(inode: int) -> int:
    """How many processes wait for a flock on the file with this inode."""
    with open("/proc/locks") as locks:
        return sum(1 for line in locks if "->" in line and f":{inode} " in line)


def continue_if_sqlite(ledger_url: str, owner: subprocess.Popen[Any],
                       command_pid: int | None, fire: Callable[[], bool], stale: float,
                       timeout: float = 30.0) -> None:
    """SQLite only: a stopped `once` keeps its claim (the row's OS lock stays with its live
    process, whatever the clock says), so nothing takes it over until it is continued.

    Wait until the guard has stopped the stopped owner's command at the deadline (when its
    pid is given), check that a fire now still skips, then continue the owner and wait for
    it to exit: from then on its claim can be taken over once stale."""
    import signal as signals

    if not ledger_url.startswith("sqlite"):
        return
    if command_pid is not None:
        wait_for(lambda: not _alive(command_pid), timeout=timeout,
                 what="the stopped owner's command to be stopped at its deadline")
    else:
        time.sleep(stale / 3 + stale)  # the deadline: last renewal plus --stale-after
    time.sleep(0.5)  # past --stale-after by the clock: only the lock keeps the claim
    assert not fire(), "a stopped owner's SQLite claim was taken over"
    os.kill(owner.pid, signals.SIGCONT)
    owner.wait(timeout=timeout)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
