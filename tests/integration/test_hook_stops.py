"""A SIGTERM or SIGHUP to `once run` while its hook runs ends the hook's process group with
once: the hook, in a session of its own, outlived once and kept once's stderr open, so that
cron (or a CronJob's log) waited for it, up to whatever it did, the hook's 30 s bound dying
with once. once still dies of the signal, as it did; the result was written before the hook.

A real `once run` and its real hook (a shell with a worker in the background); the signal is
sent once the hook has written its pid, never after a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import ONCE, wait_for
from ledger_sql import query
from procs import alive, children, pid_namespace, reaped

pytestmark = pytest.mark.tables_made  # none is about a first use

# The hook writes its shell's pid and its background worker's, then waits for the worker.
HOOK = ('sleep 60 & echo "$$ $! $ONCE_OUTPUT_FILE" > "$DIR/hook.pids.tmp"; '
        'mv "$DIR/hook.pids.tmp" "$DIR/hook.pids"; wait')


def _hooked(once_env: dict[str, str], tmp_path: Path, *prefix: str) -> tuple[
        subprocess.Popen[str], list[int]]:
    """`once run` (behind `prefix`) whose --on-success hook has started: the process, and the
    hook's shell and worker (pids of this namespace's, or of the one `prefix` made). Its
    ONCE_OUTPUT_FILE is in `tmp_path`'s "tmp"."""
    (tmp_path / "tmp").mkdir()
    env = {**once_env, "DIR": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")}
    pids_file = tmp_path / "hook.pids"
    proc = subprocess.Popen([*prefix, ONCE, "run", "--job", "hooked", "--every", "day",
                             "--on-success", HOOK, "--", "echo", "said"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: pids_file.exists() or proc.poll() is not None, timeout=60,
                 what="the hook to start")
    except BaseException:
        reaped(proc, 10)
        raise
    assert proc.poll() is None, proc.communicate()
    shell, worker, output_file = pids_file.read_text().split()
    assert Path(output_file).parent == tmp_path / "tmp"
    return proc, [int(shell), int(worker)]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("sent", [[signal.SIGTERM], [signal.SIGHUP], [signal.SIGINT],
                                  [signal.SIGTERM, signal.SIGHUP]],
                         ids=["TERM", "HUP", "INT", "TERM-then-HUP"])
def test_a_stop_signal_during_a_hook_ends_the_hook_too(once_env: dict[str, str],
                                                       ledger_url: str, tmp_path: Path,
                                                       sent: list[signal.Signals]) -> None:
    # A second signal while the first was being handled raised out of the handling (an
    # outside attacker's finding: a traceback, exit 1).
    proc, hook_pids = _hooked(once_env, tmp_path)
    try:
        for sig in sent:
            proc.send_signal(sig)
        # once's stderr reaches its end with once: nothing of the hook holds it open.
        _out, err = proc.communicate(timeout=20)
    finally:
        reaped(proc, 10)
    if sent[0] == signal.SIGINT:  # as a Ctrl-C anywhere no command takes it
        assert (proc.returncode, err) == (130, "\nonce: interrupted\n")
    else:  # of the first it handled (two sent at once are handled by number, HUP first)
        assert proc.returncode in [-sig for sig in sent] and err == "", (proc.returncode, err)
    wait_for(lambda: not any(alive(pid) for pid in hook_pids), timeout=10,
             what="the hook's shell and worker to be gone")
    # The hook's ONCE_OUTPUT_FILE (the command's output) is gone with it: it was left behind.
    assert list((tmp_path / "tmp").iterdir()) == []
    assert query(ledger_url, "SELECT status FROM once_runs") == [("done",)]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_stop_signal_during_a_hook_ends_once_as_pid_1_with_its_status(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    # As PID 1 (a container's init) the kernel spares once its own signal: its death by it
    # did not come, and once went on to a traceback, exit 1 (an outside attacker's finding).
    outer, _ = _hooked(once_env, tmp_path, *pid_namespace("--mount-proc"))
    try:
        [once] = children(outer.pid)
        os.kill(once, signal.SIGTERM)
        _out, err = outer.communicate(timeout=20)
    finally:
        reaped(outer, 10)
    assert (outer.returncode, err) == (143, "")
    assert list((tmp_path / "tmp").iterdir()) == []
    assert query(ledger_url, "SELECT status FROM once_runs") == [("done",)]


# A hook that says it started, then waits for the test's word before it ends.
PATIENT_HOOK = ('touch "$DIR/hook.started"; while [ ! -e "$DIR/release" ]; do sleep 0.05; done; '
                'touch "$DIR/hook.ended"')


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("many", [["--catchup", "3"], ["--shards", "3", "--all-shards"]],
                         ids=["catchup", "all-shards"])
def test_a_run_of_many_lets_its_hook_end_then_stops(once_env: dict[str, str], ledger_url: str,
                                                    tmp_path: Path, many: list[str]) -> None:
    # A catch-up and --all-shards hold a stop signal for the whole run: the hook in hand runs
    # to its end (docs/how-to/pings-and-hooks.md), then nothing more starts.
    env = {**once_env, "DIR": str(tmp_path)}
    run = [ONCE, "run", "--job", "hooked", "--every", "day"]
    if "--catchup" in many:  # three days ago done: two days and today to make up
        assert subprocess.run([*run, "--lag", "3", "--", "true"], env=env).returncode == 0
    proc = subprocess.Popen([*run, *many, "--on-success", PATIENT_HOOK, "--", "true"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "hook.started").exists() or proc.poll() is not None,
                 timeout=60, what="the first hook to start")
        proc.send_signal(signal.SIGTERM)
        # Held: once waits for its hook, which waits for the word.
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        (tmp_path / "release").touch()
        _out, err = proc.communicate(timeout=40)
    finally:
        reaped(proc, 10)
    assert proc.returncode == 143, err
    assert (tmp_path / "hook.ended").exists()
    assert "stopped by SIGTERM" in err and "left for the next fire" in err, err
    done = 2 if "--catchup" in many else 1  # the first catch-up's, and the one in hand
    assert query(ledger_url, "SELECT status, COUNT(*) FROM once_runs GROUP BY status") == [
        ("done", done)]
