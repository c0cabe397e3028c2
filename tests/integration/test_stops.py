"""A stop signal ends a run of several commands (issue 34, rows 9 and 10): once a SIGTERM,
SIGINT or SIGHUP has reached `once catchup` (--keep-going, or a sharded job's every shard) or
`once run --all-shards`, no command starts; the one in hand gets the signal, the rest is left
for the next fire and a line says so. A command that traps SIGTERM and exits 0 leaves
`once run` exit 0, as the docs say (it exited 1, a status no table lists).

Real `once` processes and real signals, on every backend; each signal is sent once a file
the command writes exists, never after a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from child_log import DAY, day_key, logged, stable_day
from helpers import ONCE, run_once, wait_for
from ledger_sql import placeholders, query
from once.ledger import parse_url
from procs import Terminal, start_once

pytestmark = [pytest.mark.usefixtures("ledger_url"), pytest.mark.tables_made]

STOPS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
DAYS = ["--since", "2026-10-01", "--until", "2026-10-05"]

# Logs its period (and shard); holds (until a signal ends it) where $HOLD says, after
# touching $DIR/holding.
HOLDER = ["sh", "-c", 'echo "$ONCE_PERIOD${ONCE_SHARD:+#$ONCE_SHARD}" >> "$LOG"; '
          'if [ "$ONCE_PERIOD${ONCE_SHARD:+#$ONCE_SHARD}" = "$HOLD" ]; then '
          'touch "$DIR/holding"; exec sleep 60; fi']

# Ends with status 0 when SIGTERM comes (a graceful shutdown), after touching $DIR/holding.
TRAPS_SIGTERM = [sys.executable, "-c",
                 "import os, signal, sys\n"
                 "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
                 "open(os.path.join(os.environ['DIR'], 'holding'), 'w').close()\n"
                 "while True: signal.pause()\n"]


def stopped_once(env: dict[str, str], sig: signal.Signals, *args: str
                 ) -> subprocess.CompletedProcess[str]:
    """`once ARGS`, sent sig once its command holds ($DIR/holding); how it ended."""
    proc = start_once(*args, env=env)
    try:
        wait_for((Path(env["DIR"]) / "holding").exists, what="the command to hold")
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def attempts(url: str, job: str) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in query(url, placeholders(
        "SELECT period, attempt, outcome, exit_code FROM once_attempts WHERE job = ? "
        "ORDER BY period, attempt", url), (job,))]


@pytest.mark.parametrize("sig", STOPS, ids=[s.name for s in STOPS])
def test_catchup_keep_going_starts_no_period_after_a_stop_signal(
        env: dict[str, str], ledger_url: str, sig: signal.Signals) -> None:
    env = {**env, "HOLD": "2026-10-02"}
    result = stopped_once(env, sig, "catchup", "--job", "daily", *DAY, *DAYS, "--keep-going",
                          "--", *HOLDER)
    assert logged(env) == ["2026-10-01", "2026-10-02"], result.stderr  # 3 more before
    assert result.returncode == 128 + sig, result.stderr
    lines = result.stderr.splitlines()
    assert lines[-1].startswith(f"once: catch-up of daily: stopped by {sig.name}: 2 of 5 "
                                f"periods in "), result.stderr
    assert lines[-1].endswith(": 1 done, 1 failed; 3 left for the next fire"), result.stderr
    assert attempts(ledger_url, "daily") == [("2026-10-01", 1, "done", 0),
                                             ("2026-10-02", 1, "interrupted", 128 + sig)]
    # The next fire makes up the rest, the interrupted period first.
    again = run_once("catchup", "--job", "daily", *DAY, *DAYS, "--", *HOLDER,
                     env={**env, "HOLD": ""})
    assert again.returncode == 0, again.stderr
    assert logged(env)[2:] == ["2026-10-02", "2026-10-03", "2026-10-04", "2026-10-05"]


def test_ctrl_c_on_a_terminal_stops_a_catchup_too(env: dict[str, str],
                                                  ledger_url: str) -> None:
    # On a terminal the command has the foreground: Ctrl-C sends SIGINT to its process group
    # alone, not to once. A catch-up then stops as a shell script would, not at the next
    # period's command (three more Ctrl-Cs before).
    env = {**env, "HOLD": "2026-10-02"}
    term = Terminal([ONCE, "catchup", "--job", "daily", *DAY, *DAYS, "--keep-going", "--",
                     *HOLDER], env)
    try:
        wait_for((Path(env["DIR"]) / "holding").exists, what="the command to hold")
        term.write(b"\x03")
        status = term.wait()
    finally:
        if term.status is None:  # the test failed before it ended
            os.kill(term.pid, signal.SIGKILL)
            os.waitpid(term.pid, 0)
    assert logged(env) == ["2026-10-01", "2026-10-02"], term.output
    assert status == 130, term.output
    assert b"stopped by SIGINT: 2 of 5 periods" in term.output, term.output
    assert attempts(ledger_url, "daily") == [("2026-10-01", 1, "done", 0),
                                             ("2026-10-02", 1, "failed", 130)]


def test_a_sharded_catchup_starts_no_shard_after_a_stop_signal(env: dict[str, str],
                                                                ledger_url: str) -> None:
    env = {**env, "HOLD": "2026-10-01#1"}
    result = stopped_once(env, signal.SIGTERM, "catchup", "--job", "split", *DAY, "--shards",
                          "4", *DAYS, "--", *HOLDER)
    assert logged(env) == ["2026-10-01#0", "2026-10-01#1"], result.stderr
    assert result.returncode == 143, result.stderr
    lines = result.stderr.splitlines()
    assert "once: split 2026-10-01: stopped by SIGTERM: 2 shards not tried, left for the next " \
           "fire" in lines, result.stderr
    assert lines[-1].endswith(": 1 failed; 4 left for the next fire"), result.stderr
    assert attempts(ledger_url, "split") == [("2026-10-01#0", 1, "done", 0),
                                             ("2026-10-01#1", 1, "interrupted", 143)]


@pytest.mark.parametrize("sig", STOPS, ids=[s.name for s in STOPS])
def test_run_all_shards_starts_no_shard_after_a_stop_signal(
        env: dict[str, str], ledger_url: str, sig: signal.Signals) -> None:
    stable_day()
    today = day_key(0)
    env = {**env, "HOLD": f"{today}#1"}
    result = stopped_once(env, sig, "run", "--job", "split", *DAY, "--shards", "4",
                          "--all-shards", "--", *HOLDER)
    assert logged(env) == [f"{today}#0", f"{today}#1"], result.stderr  # 2 more before
    assert result.returncode == 128 + sig, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"once: split {today}: stopped by {sig.name}: 2 shards not tried, left for the next "
        f"fire"), result.stderr
    assert attempts(ledger_url, "split") == [(f"{today}#0", 1, "done", 0),
                                             (f"{today}#1", 1, "interrupted", 128 + sig)]
    again = run_once("run", "--job", "split", *DAY, "--shards", "4", "--all-shards", "--",
                     *HOLDER, env={**env, "HOLD": ""})
    assert again.returncode == 0, again.stderr
    assert logged(env)[2:] == [f"{today}#1", f"{today}#2", f"{today}#3"]


def test_a_command_that_traps_sigterm_and_exits_0_leaves_once_run_0(
        env: dict[str, str], ledger_url: str) -> None:
    stable_day()
    result = stopped_once(env, signal.SIGTERM, "run", "--job", "graceful", *DAY, "--",
                          *TRAPS_SIGTERM)
    assert result.returncode == 0, result.stderr  # 1 before, in no table of exit statuses
    assert result.stderr.splitlines()[-1] == (
        f"once: graceful {day_key(0)} attempt 1: SIGTERM received and forwarded to the "
        f"command, which ended with status 0; recorded failed (interrupted: not counted "
        f"against --max-attempts)")
    assert attempts(ledger_url, "graceful") == [(day_key(0), 1, "interrupted", 0)]


def test_a_catchup_stopped_while_a_command_exits_0_is_not_0(env: dict[str, str],
                                                           ledger_url: str) -> None:
    # The command's 0 is its own, but the catch-up did not make up its periods: 128+N.
    result = stopped_once(env, signal.SIGTERM, "catchup", "--job", "graceful", *DAY, *DAYS,
                          "--keep-going", "--", *TRAPS_SIGTERM)
    assert result.returncode == 143, result.stderr
    assert attempts(ledger_url, "graceful") == [("2026-10-01", 1, "interrupted", 0)]
    assert result.stderr.splitlines()[-1].endswith(
        ": 1 failed; 4 left for the next fire"), result.stderr


@contextmanager
def claims_blocked(url: str) -> Iterator[Callable[[], bool]]:
    """Another session holds once_runs so that a claim (a write) waits and reads do not;
    yields whether a session waits on it. Let go at the block's end."""
    target = parse_url(url)
    if target.dialect == "sqlite":
        pytest.skip("a claim waiting on SQLite's lock shows nowhere a test can see it")
    if target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.connect_args["conninfo"]) as conn:
            conn.execute("LOCK TABLE once_runs IN SHARE MODE")
            yield lambda: bool(query(url, "SELECT count(*) FROM pg_locks WHERE NOT granted "
                                          "AND relation = 'once_runs'::regclass")[0][0])
            conn.rollback()
        return
    import pymysql

    held = pymysql.connect(**target.connect_args)
    try:
        with held.cursor() as cur:
            cur.execute("LOCK TABLES once_runs READ")
        yield lambda: bool(query(url, "SELECT count(*) FROM information_schema.processlist "
                                      "WHERE state LIKE 'Waiting for table%'")[0][0])
        with held.cursor() as cur:
            cur.execute("UNLOCK TABLES")
    finally:
        held.close()


def test_a_stop_signal_during_a_claim_starts_no_command(env: dict[str, str],
                                                        ledger_url: str) -> None:
    assert run_once("run", "--job", "first", *DAY, "--", "true", env=env).returncode == 0
    with claims_blocked(ledger_url) as waiting:
        proc = start_once("catchup", "--job", "daily", *DAY, "--since", "2026-10-01",
                          "--until", "2026-10-02", "--keep-going", "--", *HOLDER, env=env)
        try:
            wait_for(waiting, what="the claim to wait on the lock")
            proc.send_signal(signal.SIGTERM)
        except BaseException:
            proc.kill()
            raise
    _, stderr = proc.communicate(timeout=60)
    assert logged(env) == [], stderr  # the claim was won, and its command not started
    assert proc.returncode == 143, stderr
    assert ("once: daily 2026-10-01 attempt 1: SIGTERM received before its command "
            "started, which was not started; recorded failed (interrupted: not counted "
            "against --max-attempts)") in stderr.splitlines(), stderr
    assert stderr.splitlines()[-1].endswith(": 1 failed; 1 left for the next fire"), stderr
    assert attempts(ledger_url, "daily") == [("2026-10-01", 1, "interrupted", 143)]
