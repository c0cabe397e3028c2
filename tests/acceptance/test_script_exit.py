"""How the `once` script ends: with a thread still blocked (in a read from a server that died),
it ends at once with its status and what it printed, past the interpreter's teardown, which
such a thread can crash (once.cli.main._end_past_threads)."""

from __future__ import annotations

import subprocess
import sys

from helpers import ONCE
from ledger_sql import query

# The script's end with a thread asleep for a minute, or with none; the teardown's own
# last word (atexit) is printed only when the teardown runs.
_PROBE = ("import atexit, sys, threading, time\n"
          "atexit.register(lambda: print('teardown', file=sys.stderr))\n"
          "if sys.argv[1] == 'thread':\n"
          "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
          "print('said', end='')\n"
          "from once.cli.main import _end_past_threads\n"
          "_end_past_threads(3)\n"
          "sys.exit(4)\n")


def _end(threads: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PROBE, threads], capture_output=True,
                          text=True, timeout=30)


def test_a_thread_left_alive_ends_the_script_at_once_with_its_status_and_output() -> None:
    ended = _end("thread")
    assert (ended.returncode, ended.stdout, ended.stderr) == (3, "said", "")


def test_without_a_thread_the_script_ends_as_python_does() -> None:
    ended = _end("none")
    assert (ended.returncode, ended.stdout, ended.stderr) == (4, "said", "teardown\n")


def test_a_claim_made_with_stdout_or_stderr_closed_ends_with_its_status(
        once_env: dict[str, str], ledger_url: str) -> None:
    """The script's end past its threads (a claim leaves the final write's worker) with no
    stream to flush: the run is recorded done, exit 0."""
    for closed in (">&-", "2>&-"):
        ended = subprocess.run(["sh", "-c", f'exec "$0" run --job j{len(closed)} --every day '
                                            f'-- true {closed}', ONCE], env=once_env,
                               capture_output=True, text=True, timeout=60)
        assert ended.returncode == 0, (closed, ended.stderr)
    assert query(ledger_url, "SELECT job, status FROM once_runs ORDER BY job") == [
        ("j3", "done"), ("j4", "done")]
