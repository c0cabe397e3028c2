"""A SIGTERM or SIGHUP to `once run` while its hook runs ends the hook's process group with
once: the hook, in a session of its own, outlived once and kept once's stderr open, so that
cron (or a CronJob's log) waited for it, up to whatever it did, the hook's 30 s bound dying
with once. once still dies of the signal, as it did; the result was written before the hook.

A real `once run` and its real hook (a shell with a worker in the background); the signal is
sent once the hook has written its pid, never after a sleep.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from helpers import wait_for
from ledger_sql import query
from procs import alive, start_once

# The hook writes its shell's pid and its background worker's, then waits for the worker.
HOOK = ('sleep 60 & echo "$$ $!" > "$DIR/hook.pids.tmp"; '
        'mv "$DIR/hook.pids.tmp" "$DIR/hook.pids"; wait')


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_during_a_hook_ends_the_hook_too(once_env: dict[str, str],
                                                       ledger_url: str, tmp_path: Path,
                                                       sig: signal.Signals) -> None:
    env = {**once_env, "DIR": str(tmp_path)}
    pids_file = tmp_path / "hook.pids"
    proc = start_once("run", "--job", "hooked", "--every", "day", "--on-success", HOOK, "--",
                      "true", env=env)
    try:
        wait_for(pids_file.exists, timeout=60, what="the hook to start")
        hook_pids = [int(pid) for pid in pids_file.read_text().split()]
        proc.send_signal(sig)
        # once's stderr reaches its end with once: nothing of the hook holds it open.
        _out, err = proc.communicate(timeout=20)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -sig, err
    wait_for(lambda: not any(alive(pid) for pid in hook_pids), timeout=10,
             what="the hook's shell and worker to be gone")
    assert query(ledger_url, "SELECT status FROM once_runs") == [("done",)]

