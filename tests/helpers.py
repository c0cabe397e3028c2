"""Helpers for tests that drive the real `once` command and real databases."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ONCE = str(Path(sys.executable).with_name("once"))

# Waits on a shared flock of the file in argv[1], then becomes argv[2:].
_LAUNCH = "import fcntl,os,sys; f=open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_SH); " \
          "os.execv(sys.argv[2], sys.argv[2:])"


def run_once(*args: str, env: dict[str, str], timeout: float = 60,
             **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run the real `once` command and wait for it."""
    return subprocess.run([ONCE, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, **kwargs)


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
