"""A stop signal that reaches `once` after its command ended on its own, before `once` has
heard so, is not the command's (an outside attacker's finding: a period done was recorded
interrupted and ran again, 9 in 250 signals at a command's end). The result is recorded
(done), then `once` dies of the signal; a catch-up starts no period after it.

Real `once` processes, guards and signals on every backend. The window is held open by the
command itself, which stops `once` before it exits; each signal is sent once the kernel shows
where things are: no sleeps. (A signal while the command is being started: test_guard.py.)
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from child_log import DAY, day_key, stable_day
from helpers import run_once, wait_for
from ledger_sql import placeholders, query
from procs import children, reaped, start_once, stat

pytestmark = pytest.mark.usefixtures("ledger_url")


def attempts(url: str, job: str) -> list[tuple[object, ...]]:
    return [tuple(row) for row in query(url, placeholders(
        "SELECT period, attempt, outcome, exit_code FROM once_attempts WHERE job = ? "
        "ORDER BY period, attempt", url), (job,))]


def _state(pid: int) -> str:
    fields = stat(pid)
    return fields[0] if fields is not None else "gone"


# The command stops `once` (its guard's parent) and exits 0.
_STOPS_ONCE = 'kill -STOP "$(cut -d" " -f4 /proc/$PPID/stat)"; exit 0'


def _signalled_after_the_end(env: dict[str, str], reported: Callable[[int], bool],
                             *args: str) -> tuple[int, str]:
    """`once ARGS -- sh -c _STOPS_ONCE`, sent SIGTERM while stopped by its command, once
    reported(its pid) says the guard has reported the command's end, then continued: it
    hears both at once. Its status and stderr."""
    once = start_once(*args, "--", "sh", "-c", _STOPS_ONCE, env=env)
    try:
        wait_for(lambda: _state(once.pid) == "T", what="once to be stopped by its command")
        wait_for(lambda: reported(once.pid), what="the guard to report the command's end")
        once.send_signal(signal.SIGTERM)
        once.send_signal(signal.SIGCONT)
        _stdout, stderr = once.communicate(timeout=60)
    finally:
        reaped(once, 10)
    return once.returncode, stderr


def test_a_stop_signal_after_the_command_ended_on_its_own_is_not_the_command_s(
        env: dict[str, str], ledger_url: str) -> None:
    stable_day()
    status, stderr = _signalled_after_the_end(  # the guard reports the end, and exits
        env, lambda pid: [_state(guard) for guard in children(pid)] == ["Z"],
        "run", "--job", "ending", *DAY)
    assert attempts(ledger_url, "ending") == [(day_key(0), 1, "done", 0)], stderr
    assert status == -signal.SIGTERM, stderr  # it dies of it, the result written
    ran = Path(env["DIR"]) / "ran"
    again = run_once("run", "--job", "ending", *DAY, "--", "touch", str(ran), env=env)
    assert again.returncode == 0 and not ran.exists(), again.stderr  # done: not run again


def _kept_guard_waits(pid: int) -> bool:
    """The catch-up's kept guard has no command left and sleeps: it has reported the period's
    end and waits for the next."""
    [guard] = children(pid)
    return not children(guard) and _state(guard) == "S"


def test_a_catchup_whose_command_ended_before_the_signal_records_it_done(
        env: dict[str, str], ledger_url: str) -> None:
    # The same at a catch-up's period: done, and no period after it starts.
    status, stderr = _signalled_after_the_end(
        env, _kept_guard_waits, "catchup", "--job", "ending", *DAY, "--since", "2026-10-01",
        "--until", "2026-10-03")
    assert attempts(ledger_url, "ending") == [("2026-10-01", 1, "done", 0)], stderr
    assert status == 143, stderr
    assert "stopped by SIGTERM" in stderr.splitlines()[-1], stderr
