"""Regressions for the faults `make torture` found (torture/torture.py), on every backend.

Each test is the smallest real-process reproduction of one loss the torture reported.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from helpers import run_once, wait_for
from ledger_sql import query
from procs import alive, start_once

# Records its pid, notes a SIGTERM, and finishes its work (a file) only after 5 seconds.
WORKER = ('echo $$ > "$DIR/pid"; trap \'touch "$DIR/term"; exit 143\' TERM; '
          'sleep 5 & wait; touch "$DIR/finished-$ONCE_FENCE"')


def test_a_stopped_owners_command_is_stopped_by_its_deadline(once_env: dict[str, str],
                                                            tmp_path: Path,
                                                            ledger_url: str) -> None:
    # torture: "owner SIGSTOP past --stale-after": the wrapper was stopped, so nothing
    # stopped its command, which finished its work after another attempt had taken the
    # period over (two finished runs of one period). The guard now keeps the lease's
    # deadline itself and stops the command when it passes unrenewed.
    env = {**once_env, "DIR": str(tmp_path)}
    stale = 2.0
    args = ["run", "--job", "frozen", "--every", "day", "--stale-after", f"{stale:g}s", "--"]
    owner = start_once(*args, "sh", "-c", WORKER, env=env)
    shell = wait_for(lambda: (tmp_path / "pid").exists() and int(
        (tmp_path / "pid").read_text() or 0), what="the owner's command")
    os.kill(owner.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        # While its wrapper is stopped, the command is stopped by the deadline (one renewal
        # interval at most after the last renewal, plus --stale-after), and not after.
        wait_for(lambda: not alive(shell), timeout=stale + 5,
                 what="the stopped owner's command to be stopped")
        assert time.monotonic() - stopped <= stale + 3
        assert (tmp_path / "term").exists(), "stopped with SIGTERM first"
        taken = run_once(*args, "sh", "-c", 'touch "$DIR/second"', env=env)
        deadline = time.monotonic() + stale + 10
        while not (tmp_path / "second").exists() and time.monotonic() < deadline:
            assert taken.returncode == 0, taken.stderr
            time.sleep(0.2)
            taken = run_once(*args, "sh", "-c", 'touch "$DIR/second"', env=env)
        assert (tmp_path / "second").exists(), "nobody took the stale claim over"
        time.sleep(max(0.0, stopped + 6 - time.monotonic()))  # past the first one's work
        assert not list(tmp_path.glob("finished-*")), "the fenced-out command finished"
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    _out, err = owner.communicate(timeout=30)
    assert owner.returncode == 70, err
    assert "fenced out" in err
    assert "Traceback" not in err
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 2)]
