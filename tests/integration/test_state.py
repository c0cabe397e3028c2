"""Watermarks (`--state`) and `once state`, on every backend: what a run sees and leaves.

Real `once` processes against real databases (children and helpers: tests/child_log.py);
`once state` and the reports in this process (helpers.run_either).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from child_log import (
    DAY,
    INCREMENT,
    day_key,
    logged,
    once_line,
    run,
    stable_day,
    stored_state,
)
from helpers import ONCE, continue_if_sqlite, release_together, run_either, wait_for
from ledger_sql import query, scalar
from procs import alive, pids, start_once

# Logs what it saw (the watermark), then leaves the period key as the new one.
SEE_AND_WRITE = ["sh", "-c", 'printf "%s|%s\\n" "$ONCE_PERIOD" "$ONCE_STATE" >> "$LOG"; '
                 'printf "%s\\n" "$ONCE_PERIOD" > "$ONCE_STATE_OUT"']

pytestmark = [pytest.mark.usefixtures("ledger_url"), pytest.mark.tables_made]


def set_state(env: dict[str, str], job: str, value: str) -> None:
    result = run_either("state", job, "--set", value, env=env)
    assert result.returncode == 0, result.stderr


# -- watermarks: what a run sees and leaves --------------------------------------------------


def test_successive_runs_see_the_previous_watermark(env: dict[str, str],
                                                    ledger_url: str) -> None:
    stable_day()
    for lag in (2, 1, 0):
        result = run(env, "sync", "--state", "--lag", str(lag), command=SEE_AND_WRITE)
        assert result.returncode == 0, result.stderr
    assert logged(env) == [f"{day_key(2)}|", f"{day_key(1)}|{day_key(2)}",
                           f"{day_key(0)}|{day_key(1)}"]
    shown = run_either("state", "sync", env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == day_key(0) + "\n"
    assert stored_state(ledger_url, "sync") == (day_key(0), 3)


def test_catchup_carries_the_watermark_from_period_to_period(env: dict[str, str],
                                                             ledger_url: str) -> None:
    result = run_either("catchup", "--job", "sync", *DAY, "--state", "--since", "2026-03-01",
                      "--until", "2026-03-05", "--", *INCREMENT, env=env)
    assert result.returncode == 0, result.stderr
    assert logged(env) == [f"2026-03-0{d} {d - 1}" for d in range(1, 6)]
    assert stored_state(ledger_url, "sync") == ("5", 5)


def test_the_state_file_is_private_and_removed(env: dict[str, str], tmp_path: Path) -> None:
    peek = ["sh", "-c", 'd=$(dirname "$ONCE_STATE_OUT"); stat -c %a "$d" > "$DIR/mode"; '
            'echo "$ONCE_STATE_OUT" > "$DIR/path"; [ ! -e "$ONCE_STATE_OUT" ]']
    result = run(env, "private", "--state", command=peek)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "mode").read_text().strip() == "700"
    path = Path((tmp_path / "path").read_text().strip())
    assert path.is_absolute() and not path.parent.exists()


def test_without_state_the_command_gets_no_state_variables(env: dict[str, str]) -> None:
    dump = ["sh", "-c", 'echo "${ONCE_STATE-unset} ${ONCE_STATE_OUT-unset}" >> "$LOG"']
    assert run(env, "plain", command=dump).returncode == 0
    assert logged(env) == ["unset unset"]
    assert run_either("state", "plain", env=env).stdout == ""  # a job that never kept one


def test_a_failing_run_does_not_move_it(env: dict[str, str], ledger_url: str) -> None:
    assert run(env, "sync", "--state", "--lag", "1", command=INCREMENT).returncode == 0
    failing = ["sh", "-c", 'echo 99 > "$ONCE_STATE_OUT"; exit 3']
    result = run(env, "sync", "--state", command=failing)
    assert result.returncode == 3
    assert stored_state(ledger_url, "sync") == ("1", 1)
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs ORDER BY period") == [
        ("done", 0), ("failed", 3)]


def test_a_timed_out_run_does_not_move_it(env: dict[str, str], ledger_url: str) -> None:
    assert run(env, "sync", "--state", "--lag", "1", command=INCREMENT).returncode == 0
    began = time.monotonic()
    result = run(env, "sync", "--state", "--timeout", "1s", "--kill-after", "2s",
                 command=["sh", "-c", 'echo x > "$ONCE_STATE_OUT"; sleep 30'])
    assert result.returncode == 124, result.stderr
    assert time.monotonic() - began < 20
    assert "timed out" in once_line(result.stderr)
    assert stored_state(ledger_url, "sync") == ("1", 1)
    assert query(ledger_url, "SELECT status FROM once_runs ORDER BY period") == [
        ("done",), ("failed",)]


@pytest.mark.slow
@pytest.mark.parametrize("child", ["still-running", "exited-0"])
def test_a_fenced_out_owner_never_moves_it(env: dict[str, str], tmp_path: Path,
                                           ledger_url: str, child: str) -> None:
    """SIGSTOP the owner past --stale-after; another instance takes over and finishes with
    its own watermark; SIGCONT: the first is fenced out (70) and the watermark is the
    second's. With exited-0, its child wrote a watermark and succeeded while its owner was
    stopped: the owner's final write is what must be refused."""
    args = ["run", "--job", "sync", *DAY, "--state", "--stale-after", "2s", "--"]
    first = start_once(*args, "sh", "-c",
                       'echo first > "$ONCE_STATE_OUT"; echo $$ > "$DIR/pids"; '
                       'while [ ! -e "$DIR/release" ]; do sleep 0.05; done', env=env)
    (shell,) = wait_for(lambda: pids(tmp_path / "pids", 1), what="the first child")
    os.kill(first.pid, signal.SIGSTOP)

    def second_ran() -> bool:
        result = run_either(*args, "sh", "-c",
                          'printf "%s" "$ONCE_STATE" > "$DIR/second-saw"; '
                          'echo second > "$ONCE_STATE_OUT"', env=env)
        assert result.returncode == 0, result.stderr
        return (tmp_path / "second-saw").exists()

    sqlite = ledger_url.startswith("sqlite")
    if child == "exited-0" and sqlite:
        # The child succeeded within the lease, and nothing could take the row over (the
        # stopped owner's OS lock holds it): on waking, the owner records what happened.
        (tmp_path / "release").touch()
        wait_for(lambda: not alive(shell), timeout=10, what="the first child to exit")
        continue_if_sqlite(ledger_url, first, None, second_ran, 2.0)
        assert first.returncode == 0, first.communicate()[1]
        assert stored_state(ledger_url, "sync") == ("first", 1)
        assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 1)]
        return
    try:
        continue_if_sqlite(ledger_url, first, None if child == "exited-0" else shell,
                           second_ran, 2.0)
        wait_for(second_ran, what="a second instance to take over")
        if child == "exited-0" and not sqlite:
            (tmp_path / "release").touch()
            wait_for(lambda: not alive(shell), timeout=10, what="the first child to exit")
    finally:
        first.send_signal(signal.SIGCONT)  # (reaped already on SQLite: then a no-op)
    _, err = first.communicate(timeout=30)
    assert first.returncode == 70, err
    assert "fenced out" in once_line(err)
    assert (tmp_path / "second-saw").read_text() == ""  # the first left nothing behind
    assert stored_state(ledger_url, "sync") == ("second", 1)
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 2)]


def test_a_deliberate_set_while_a_run_is_in_flight_fences_the_run_out(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    assert run(env, "sync", "--state", "--lag", "1", command=INCREMENT).returncode == 0
    owner = start_once("run", "--job", "sync", *DAY, "--state", "--", "sh", "-c",
                       'echo from-run > "$ONCE_STATE_OUT"; touch "$DIR/started"; '
                       'while [ ! -e "$DIR/release" ]; do sleep 0.05; done', env=env)
    wait_for(lambda: (tmp_path / "started").exists(), what="the child")
    set_state(env, "sync", "by-hand")
    (tmp_path / "release").touch()
    _, err = owner.communicate(timeout=30)
    assert owner.returncode == 70, err
    line = once_line(err)
    assert "fenced out" in line and "watermark moved" in line, line
    assert stored_state(ledger_url, "sync") == ("by-hand", 2)
    # Nothing was recorded: the row is left to go stale and be retried.
    assert query(ledger_url, "SELECT status FROM once_runs ORDER BY period") == [
        ("done",), ("running",)]


@pytest.mark.slow
def test_concurrent_runs_never_lose_an_advance(env: dict[str, str], tmp_path: Path,
                                               ledger_url: str) -> None:
    """8 processes, each on a period of its own, each reading the watermark as an integer and
    leaving it + 1. Every advance that was recorded is in the watermark; every run whose
    advance was not recorded said so with 70; retrying those converges on 8."""
    stable_day()
    # Tables first: 8 first uses would spend part of the claim's lease creating them.
    assert run_either("schema", env=env).returncode == 0
    stale = 5.0
    slow_increment = ["sh", "-c", 'n=${ONCE_STATE:-0}; sleep 0.3; '
                      'echo "$ONCE_PERIOD $n" >> "$LOG"; echo $((n + 1)) > "$ONCE_STATE_OUT"']

    def command(lag: int) -> list[str]:
        return [ONCE, "run", "--job", "counter", *DAY, "--lag", str(lag), "--state",
                "--stale-after", f"{stale:g}s", "--", *slow_increment]

    left = list(range(8))
    for rounds in range(1, 12):
        if rounds <= 2:  # two rounds of all at once, then one at a time
            results = release_together([command(lag) for lag in left], tmp_path / "gate", env)
        else:
            results = [run_either(*command(left[0])[1:], env=env)]
        done = int(scalar(ledger_url, "SELECT count(*) FROM once_runs WHERE status = 'done'"))
        state, version = stored_state(ledger_url, "counter")
        assert state is not None and int(state) == done == version, (state, done, version)
        for result in results:
            assert result.returncode in (0, 70), result.stderr
            if result.returncode == 70:  # a retry also says that it took over
                lines = result.stderr.splitlines()
                assert all(line.startswith("once: ") for line in lines), result.stderr
                assert "watermark moved" in lines[-1], result.stderr
        # Exactly the runs that exited 0 were recorded done (one claimant per period).
        rows = dict(query(ledger_url, "SELECT period, status FROM once_runs"))
        recorded = [lag for lag in left if rows.get(day_key(lag)) == "done"]
        ok = [lag for lag, r in zip(left, results, strict=False) if r.returncode == 0]
        assert sorted(ok) == sorted(recorded)
        left = [lag for lag in left if lag not in recorded]
        if not left:
            break
        if rounds <= 2:
            time.sleep(stale + 0.5)  # let the rows of the fenced-out runs go stale
    assert not left, f"no convergence; left {left}"
    assert stored_state(ledger_url, "counter") == ("8", 8)
    # The recorded run of each period is its last child: together they read 0 to 7.
    last_read = {}
    for line in logged(env):
        period, value = line.split()
        last_read[period] = int(value)
    assert sorted(last_read.values()) == list(range(8))


def test_one_trailing_newline_is_dropped(env: dict[str, str], ledger_url: str) -> None:
    cases = [("a\\n\\n", "a\n"), ("a", "a"), ("a\\n", "a"), ("", ""), ("\\n", ""),
             ("x y\\r\\n", "x y\r")]
    for lag, (written, kept) in enumerate(cases):
        result = run(env, "nl", "--state", "--lag", str(len(cases) - lag),
                     command=["sh", "-c", f'printf "{written}" > "$ONCE_STATE_OUT"'])
        assert result.returncode == 0, result.stderr
        assert stored_state(ledger_url, "nl")[0] == kept, written


def test_the_next_run_sees_the_value_exactly(env: dict[str, str], tmp_path: Path) -> None:
    value = "2026-10-27T10:00:00Z|42\nline two\t é ✓"
    (tmp_path / "value").write_text(value + "\n")
    write = ["sh", "-c", 'cat "$DIR/value" > "$ONCE_STATE_OUT"']
    assert run(env, "exact", "--state", "--lag", "1", command=write).returncode == 0
    seen = ["sh", "-c", 'printf "%s" "$ONCE_STATE" > "$DIR/seen"']
    assert run(env, "exact", "--state", command=seen).returncode == 0
    assert (tmp_path / "seen").read_text() == value
    assert run_either("state", "exact", env=env).stdout == value + "\n"


def test_no_file_means_no_change(env: dict[str, str], ledger_url: str) -> None:
    assert run(env, "sync", "--state", "--lag", "1", command=INCREMENT).returncode == 0
    result = run(env, "sync", "--state", command=["true"])
    assert result.returncode == 0, result.stderr
    assert stored_state(ledger_url, "sync") == ("1", 1)
    assert query(ledger_url, "SELECT status FROM once_runs") == [("done",), ("done",)]


def test_an_empty_file_empties_it(env: dict[str, str], ledger_url: str) -> None:
    assert run(env, "sync", "--state", "--lag", "1", command=INCREMENT).returncode == 0
    assert run(env, "sync", "--state", command=["sh", "-c", ': > "$ONCE_STATE_OUT"']
               ).returncode == 0
    assert stored_state(ledger_url, "sync") == ("", 2)


@pytest.mark.parametrize("size", [64 * 1024, 64 * 1024 + 1])
def test_64_kib_is_the_limit(env: dict[str, str], ledger_url: str, size: int) -> None:
    assert run(env, "big", "--state", "--lag", "1", command=INCREMENT).returncode == 0
    # 'é' is two bytes of UTF-8: the limit counts bytes, and a trailing newline is free.
    write = ["sh", "-c", f'head -c {size // 2 * 2} /dev/zero | tr "\\0" "x" | '
             f'sed "s/xx/é/g" > "$ONCE_STATE_OUT"; '
             + ('printf x >> "$ONCE_STATE_OUT"' if size % 2 else "true")]
    result = run(env, "big", "--state", command=write)
    if size <= 64 * 1024:
        assert result.returncode == 0, result.stderr
        state, _ = stored_state(ledger_url, "big")
        assert state is not None and len(state.encode()) == size and state[0] == "é"
    else:
        assert result.returncode == 1
        assert "64 KiB" in once_line(result.stderr)
        assert stored_state(ledger_url, "big") == ("1", 1)
        assert query(ledger_url, "SELECT status, exit_code FROM once_runs ORDER BY period") \
            == [("done", 0), ("failed", 0)]


@pytest.mark.parametrize("payload", ["\\377\\376", "ok\\300"], ids=["ff-fe", "truncated"])
def test_invalid_utf8_fails_the_run(env: dict[str, str], ledger_url: str,
                                    payload: str) -> None:
    assert run(env, "bytes", "--state", "--lag", "1", command=INCREMENT).returncode == 0
    result = run(env, "bytes", "--state",
                 command=["sh", "-c", f'printf "{payload}" > "$ONCE_STATE_OUT"'])
    assert result.returncode == 1
    assert "UTF-8" in once_line(result.stderr)
    assert stored_state(ledger_url, "bytes") == ("1", 1)
    assert query(ledger_url, "SELECT status FROM once_runs ORDER BY period") == [
        ("done",), ("failed",)]


def test_a_nul_byte_fails_the_run_on_every_backend(env: dict[str, str],
                                                   ledger_url: str) -> None:
    # PostgreSQL's text cannot hold NUL: refused for every backend alike, at once.
    assert run(env, "nul", "--state", "--lag", "1", command=INCREMENT).returncode == 0
    result = run(env, "nul", "--state", "--stale-after", "30s", timeout=25,
                 command=["sh", "-c", 'printf "a\\000b" > "$ONCE_STATE_OUT"'])
    assert result.returncode == 1, result.stderr
    assert "NUL" in once_line(result.stderr)
    assert stored_state(ledger_url, "nul") == ("1", 1)


# -- once state ------------------------------------------------------------------------------


def test_state_set_is_seen_and_recorded_in_the_history(env: dict[str, str],
                                                       ledger_url: str) -> None:
    assert run(env, "sync", "--state", "--lag", "1", command=INCREMENT).returncode == 0
    result = run_either("state", "sync", "--set", "41", env=env)
    assert result.returncode == 0, result.stderr
    assert "state set" in once_line(result.stderr)
    assert run_either("state", "sync", env=env).stdout == "41\n"
    assert run(env, "sync", "--state", command=INCREMENT).returncode == 0
    assert logged(env)[-1].split()[1] == "41"
    assert stored_state(ledger_url, "sync") == ("42", 3)
    rows = query(ledger_url, "SELECT period, status, outcome, reason, command_hash "
                             "FROM once_attempts WHERE period = '(state)'")
    assert len(rows) == 1
    period, status, outcome, reason, fingerprint = rows[0]
    assert (period, status, outcome, fingerprint) == ("(state)", "done", "state-set", None)
    assert "41" in reason
    history = run_either("history", "sync", "--json", env=env)
    assert history.returncode == 0, history.stderr
    assert "(state)" in [entry.get("period") for entry in json.loads(history.stdout)]


def test_state_of_an_unknown_job_is_a_usage_error(env: dict[str, str]) -> None:
    for args in (["state", "nope"], ["state", "nope", "--set", "1"]):
        result = run_either(*args, env=env)
        assert result.returncode == 2, result.stderr
        assert "unknown job" in once_line(result.stderr)
    assert run(env, "known", command=["true"]).returncode == 0
    result = run_either("state", "nope", env=env)
    assert result.returncode == 2 and "unknown job" in once_line(result.stderr)


def test_state_set_refuses_what_a_watermark_cannot_hold(env: dict[str, str],
                                                        ledger_url: str) -> None:
    assert run(env, "sync", "--state", command=INCREMENT).returncode == 0
    big = run_either("state", "sync", "--set", "x" * (64 * 1024 + 1), env=env)
    assert big.returncode == 2 and "64 KiB" in once_line(big.stderr)
    # Bytes that are not UTF-8 reach Python as surrogate escapes.
    bad = subprocess.run([os.fsencode(ONCE), b"state", b"sync", b"--set", b"\xff\xfe"],
                         env=env, capture_output=True, timeout=60)
    assert bad.returncode == 2, bad.stderr
    assert "UTF-8" in once_line(bad.stderr.decode(errors="replace"))
    assert stored_state(ledger_url, "sync") == ("1", 1)
