"""Watermarks (`--state`), sharded periods (`--shards`) and command drift, on every backend.

Real `once` processes against real databases. What the children saw is counted from their own
log; what the ledger holds is read with plain SQL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import ONCE, continue_if_sqlite, release_together, run_once, wait_for
from ledger_sql import query, scalar
from once.core import command_hash
from procs import alive, parent, pids, start_once

pytestmark = pytest.mark.usefixtures("ledger_url")

DAY = ["--every", "day"]

# Reads the watermark as an integer (0 at first), logs it, leaves it + 1.
INCREMENT = ["sh", "-c", 'n=${ONCE_STATE:-0}; echo "$ONCE_PERIOD $n" >> "$LOG"; '
             'echo $((n + 1)) > "$ONCE_STATE_OUT"']
# Logs what it saw (the watermark), then leaves the period key as the new one.
SEE_AND_WRITE = ["sh", "-c", 'printf "%s|%s\\n" "$ONCE_PERIOD" "$ONCE_STATE" >> "$LOG"; '
                 'printf "%s\\n" "$ONCE_PERIOD" > "$ONCE_STATE_OUT"']
# Logs the period and shard it was given.
SHARD_LOG = ["sh", "-c", 'echo "$ONCE_PERIOD $ONCE_SHARD $ONCE_SHARDS $ONCE_ATTEMPT" >> "$LOG"']


@pytest.fixture
def env(once_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**once_env, "LOG": str(tmp_path / "children.log"), "DIR": str(tmp_path)}


def logged(env: dict[str, str]) -> list[str]:
    path = Path(env["LOG"])
    return path.read_text().splitlines() if path.exists() else []


def once_line(stderr: str) -> str:
    """stderr must be exactly one `once:` line; return it."""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("once: "), stderr
    return lines[0]


def run(env: dict[str, str], job: str, *args: str, command: list[str],
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_once("run", "--job", job, *DAY, *args, "--", *command, env=env, timeout=timeout)


def stored_state(url: str, job: str) -> tuple[str | None, int]:
    """(watermark, version) as once_jobs holds them."""
    rows = query(url, "SELECT state, state_version FROM once_jobs WHERE job = %s"
                 if not url.startswith("sqlite") else
                 "SELECT state, state_version FROM once_jobs WHERE job = ?", (job,))
    assert len(rows) == 1, rows
    return rows[0][0], int(rows[0][1])


def set_state(env: dict[str, str], job: str, value: str) -> None:
    result = run_once("state", job, "--set", value, env=env)
    assert result.returncode == 0, result.stderr


def day_key(days_ago: int) -> str:
    return (datetime.now(UTC) - timedelta(days=days_ago)).strftime("%Y-%m-%d")


def stable_day() -> None:
    """Tests that compute day keys here and let `once` compute them too must not straddle
    midnight UTC: wait it out when it is seconds away."""
    now = datetime.now(UTC)
    left = (now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)) - now
    if left < timedelta(seconds=120):
        time.sleep(left.total_seconds() + 1)


# -- watermarks: what a run sees and leaves --------------------------------------------------


def test_successive_runs_see_the_previous_watermark(env: dict[str, str],
                                                    ledger_url: str) -> None:
    stable_day()
    for lag in (2, 1, 0):
        result = run(env, "sync", "--state", "--lag", str(lag), command=SEE_AND_WRITE)
        assert result.returncode == 0, result.stderr
    assert logged(env) == [f"{day_key(2)}|", f"{day_key(1)}|{day_key(2)}",
                           f"{day_key(0)}|{day_key(1)}"]
    shown = run_once("state", "sync", env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == day_key(0) + "\n"
    assert stored_state(ledger_url, "sync") == (day_key(0), 3)


def test_catchup_carries_the_watermark_from_period_to_period(env: dict[str, str],
                                                             ledger_url: str) -> None:
    result = run_once("catchup", "--job", "sync", *DAY, "--state", "--since", "2026-03-01",
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
    assert run_once("state", "plain", env=env).stdout == ""  # a job that never kept one


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
        result = run_once(*args, "sh", "-c",
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


def test_concurrent_runs_never_lose_an_advance(env: dict[str, str], tmp_path: Path,
                                               ledger_url: str) -> None:
    """8 processes, each on a period of its own, each reading the watermark as an integer and
    leaving it + 1. Every advance that was recorded is in the watermark; every run whose
    advance was not recorded said so with 70; retrying those converges on 8."""
    stable_day()
    # Tables first: 8 first uses would spend part of the claim's lease creating them.
    assert run_once("schema", env=env).returncode == 0
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
            results = [run_once(*command(left[0])[1:], env=env)]
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
    assert run_once("state", "exact", env=env).stdout == value + "\n"


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
    result = run_once("state", "sync", "--set", "41", env=env)
    assert result.returncode == 0, result.stderr
    assert "state set" in once_line(result.stderr)
    assert run_once("state", "sync", env=env).stdout == "41\n"
    assert run(env, "sync", "--state", command=INCREMENT).returncode == 0
    assert logged(env)[-1].split()[1] == "41"
    assert stored_state(ledger_url, "sync") == ("42", 3)
    rows = query(ledger_url, "SELECT period, status, outcome, reason, command_hash "
                             "FROM once_attempts WHERE period = '(state)'")
    assert len(rows) == 1
    period, status, outcome, reason, fingerprint = rows[0]
    assert (period, status, outcome, fingerprint) == ("(state)", "done", "state-set", None)
    assert "41" in reason
    history = run_once("history", "sync", "--json", env=env)
    assert history.returncode == 0, history.stderr
    assert "(state)" in [entry.get("period") for entry in json.loads(history.stdout)]


def test_state_of_an_unknown_job_is_a_usage_error(env: dict[str, str]) -> None:
    for args in (["state", "nope"], ["state", "nope", "--set", "1"]):
        result = run_once(*args, env=env)
        assert result.returncode == 2, result.stderr
        assert "unknown job" in once_line(result.stderr)
    assert run(env, "known", command=["true"]).returncode == 0
    result = run_once("state", "nope", env=env)
    assert result.returncode == 2 and "unknown job" in once_line(result.stderr)


def test_state_set_refuses_what_a_watermark_cannot_hold(env: dict[str, str],
                                                        ledger_url: str) -> None:
    assert run(env, "sync", "--state", command=INCREMENT).returncode == 0
    big = run_once("state", "sync", "--set", "x" * (64 * 1024 + 1), env=env)
    assert big.returncode == 2 and "64 KiB" in once_line(big.stderr)
    # Bytes that are not UTF-8 reach Python as surrogate escapes.
    bad = subprocess.run([os.fsencode(ONCE), b"state", b"sync", b"--set", b"\xff\xfe"],
                         env=env, capture_output=True, timeout=60)
    assert bad.returncode == 2, bad.stderr
    assert "UTF-8" in once_line(bad.stderr.decode(errors="replace"))
    assert stored_state(ledger_url, "sync") == ("1", 1)


# -- shards ----------------------------------------------------------------------------------


def test_8_processes_with_4_shards_run_each_shard_once(env: dict[str, str], tmp_path: Path,
                                                       ledger_url: str) -> None:
    stable_day()
    cmd = [ONCE, "run", "--job", "split", *DAY, "--shards", "4", "--", *SHARD_LOG]
    results = release_together([cmd] * 8, tmp_path / "gate", env)
    assert [r.returncode for r in results] == [0] * 8, [r.stderr for r in results]
    seen = sorted(line.split() for line in logged(env))
    assert seen == [[day_key(0), str(i), "4", "1"] for i in range(4)]
    rows = query(ledger_url, "SELECT period, status, attempt FROM once_runs ORDER BY period")
    assert rows == [(f"{day_key(0)}#{i}", "done", 1) for i in range(4)]
    assert scalar(ledger_url, "SELECT shards FROM once_jobs") == 4
    fences = [f for (f,) in query(ledger_url, "SELECT fence FROM once_runs")]
    assert len(set(fences)) == 4


def test_a_sharded_run_takes_the_lowest_shard_it_can(env: dict[str, str]) -> None:
    for _ in range(4):
        assert run(env, "split", "--shards", "3", command=SHARD_LOG).returncode == 0
    assert [line.split()[1] for line in logged(env)] == ["0", "1", "2"]


def test_a_killed_shard_owner_is_taken_over(env: dict[str, str], tmp_path: Path,
                                            ledger_url: str) -> None:
    stable_day()
    stale = 6.0
    args = ["run", "--job", "split", *DAY, "--shards", "2", "--stale-after", f"{stale:g}s",
            "--"]
    owner = start_once(*args, "sh", "-c", 'echo $$ > "$DIR/pids"; echo "$ONCE_SHARD" '
                       '> "$DIR/first-shard"; sleep 600', env=env)
    (shell,) = wait_for(lambda: pids(tmp_path / "pids", 1), what="the owner's child")
    guard = parent(shell)
    owner.kill()
    killed = time.monotonic()
    owner.wait(10)
    wait_for(lambda: not alive(shell) and not alive(guard), timeout=5,
             what="the child to die with its owner")
    assert (tmp_path / "first-shard").read_text().strip() == "0"
    # While shard 0's claim is fresh, others take shard 1, then find nothing to do.
    for _ in range(2):
        assert run(env, "split", "--shards", "2", "--stale-after", f"{stale:g}s",
                   command=SHARD_LOG).returncode == 0
    assert time.monotonic() - killed < stale - 0.5, "too slow to prove a skip"
    assert [line.split()[1:] for line in logged(env)] == [["1", "2", "1"]]
    time.sleep(max(0.0, killed + stale + 0.5 - time.monotonic()))
    late = run(env, "split", "--shards", "2", "--stale-after", f"{stale:g}s",
               command=SHARD_LOG)
    assert late.returncode == 0, late.stderr
    assert [line.split()[1:] for line in logged(env)][-1] == ["0", "2", "2"]
    assert query(ledger_url, "SELECT period, status, attempt FROM once_runs ORDER BY period") \
        == [(f"{day_key(0)}#0", "done", 2), (f"{day_key(0)}#1", "done", 1)]


def test_all_shards_keeps_claiming_until_none_is_left(env: dict[str, str], tmp_path: Path,
                                                      ledger_url: str) -> None:
    stable_day()
    # Another instance holds shard 0; --all-shards runs the rest, in order, then returns.
    holder = start_once("run", "--job", "split", *DAY, "--shards", "4", "--", "sh", "-c",
                        'touch "$DIR/holding"; while [ ! -e "$DIR/release" ]; '
                        'do sleep 0.05; done', env=env)
    try:
        wait_for(lambda: (tmp_path / "holding").exists(), what="the holder")
        result = run(env, "split", "--shards", "4", "--all-shards", command=SHARD_LOG)
        assert result.returncode == 0, result.stderr
        assert [line.split()[1] for line in logged(env)] == ["1", "2", "3"]
        again = run(env, "split", "--shards", "4", "--all-shards", command=SHARD_LOG)
        assert again.returncode == 0 and len(logged(env)) == 3
    finally:
        (tmp_path / "release").touch()
    assert holder.wait(30) == 0
    assert [s for (s,) in query(ledger_url, "SELECT status FROM once_runs")] == ["done"] * 4


def test_all_shards_goes_on_past_a_failed_shard(env: dict[str, str], ledger_url: str) -> None:
    fail_1 = ["sh", "-c", 'echo "$ONCE_SHARD" >> "$LOG"; [ "$ONCE_SHARD" != 1 ]']
    result = run(env, "split", "--shards", "3", "--all-shards", command=fail_1)
    assert result.returncode == 1
    assert logged(env) == ["0", "1", "2"]
    statuses = [s for _, s in query(ledger_url, "SELECT period, status FROM once_runs "
                                                "ORDER BY period")]
    assert statuses == ["done", "failed", "done"]
    retry = run(env, "split", "--shards", "3", "--all-shards", command=["true"])
    assert retry.returncode == 0, retry.stderr
    assert [s for (s,) in query(ledger_url, "SELECT status FROM once_runs")] == ["done"] * 3


def test_catchup_fills_only_the_missing_shards(env: dict[str, str], ledger_url: str) -> None:
    stable_day()
    sharded = ["--shards", "4"]
    # Three days back: complete. Two back: shard 0. One back: shards 0 and 1. Today: none.
    assert run(env, "split", *sharded, "--all-shards", "--lag", "3", command=["true"]
               ).returncode == 0
    assert run(env, "split", *sharded, "--lag", "2", command=["true"]).returncode == 0
    for _ in range(2):
        assert run(env, "split", *sharded, "--lag", "1", command=["true"]).returncode == 0
    catchup = ["catchup", "--job", "split", *DAY, *sharded, "--since", day_key(4)]
    dry = run_once(*catchup, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert [line.split()[0] for line in dry.stdout.splitlines()] == [
        day_key(4), day_key(2), day_key(1), day_key(0)]
    result = run_once(*catchup, "--", *SHARD_LOG, env=env)
    assert result.returncode == 0, result.stderr
    ran = [tuple(line.split()[:2]) for line in logged(env)]
    expected = ([(day_key(4), str(i)) for i in range(4)]
                + [(day_key(2), str(i)) for i in (1, 2, 3)]
                + [(day_key(1), str(i)) for i in (2, 3)]
                + [(day_key(0), str(i)) for i in range(4)])
    assert ran == expected
    assert scalar(ledger_url, "SELECT count(*) FROM once_runs WHERE status = 'done'") == 20
    assert run_once(*catchup, "--", *SHARD_LOG, env=env).returncode == 0
    assert len(logged(env)) == len(expected)


def test_catchup_by_default_resumes_a_partly_done_period(env: dict[str, str]) -> None:
    stable_day()
    # Yesterday has only shard 0 done: it is not done, so catch-up starts there.
    assert run(env, "split", "--shards", "2", "--lag", "1", command=["true"]).returncode == 0
    result = run_once("catchup", "--job", "split", *DAY, "--shards", "2", "--", *SHARD_LOG,
                      env=env)
    assert result.returncode == 0, result.stderr
    assert [tuple(line.split()[:2]) for line in logged(env)] == [
        (day_key(1), "1"), (day_key(0), "0"), (day_key(0), "1")]


def test_a_sharded_period_is_skipped_when_every_shard_is_done(env: dict[str, str]) -> None:
    args = ["--shards", "2", "--skipped-exit-code", "9"]
    assert run(env, "split", *args, "--all-shards", command=["sh", "-c", "exit 0"]
               ).returncode == 0
    assert run(env, "split", *args, command=["true"]).returncode == 9
    assert run(env, "split", *args, "--all-shards", command=["true"]).returncode == 9


def test_rerun_of_a_sharded_job_names_one_shard(env: dict[str, str], ledger_url: str) -> None:
    stable_day()
    assert run(env, "split", "--shards", "2", "--all-shards", command=SHARD_LOG
               ).returncode == 0
    for bad in (day_key(0), f"{day_key(0)}#2", f"{day_key(0)}#x"):
        refused = run_once("rerun", "--job", "split", "--period", bad, "--", *SHARD_LOG,
                           env=env)
        assert refused.returncode == 2, refused.stderr
        assert "KEY#i" in once_line(refused.stderr)
    result = run_once("rerun", "--job", "split", "--period", f"{day_key(0)}#1", "--reason",
                      "bad input", "--", *SHARD_LOG, env=env)
    assert result.returncode == 0, result.stderr
    assert logged(env)[-1].split() == [day_key(0), "1", "2", "2"]
    assert query(ledger_url, "SELECT period, attempt FROM once_runs ORDER BY period") == [
        (f"{day_key(0)}#0", 1), (f"{day_key(0)}#1", 2)]
    unsharded = run(env, "plain", command=["true"])
    assert unsharded.returncode == 0
    refused = run_once("rerun", "--job", "plain", "--period", f"{day_key(0)}#0", "--",
                       "true", env=env)
    assert refused.returncode == 2 and "no shards" in once_line(refused.stderr)


def test_state_with_shards_hands_each_shard_the_watermark(env: dict[str, str],
                                                          ledger_url: str) -> None:
    result = run(env, "both", "--shards", "3", "--all-shards", "--state", command=INCREMENT)
    assert result.returncode == 0, result.stderr
    assert [line.split()[1] for line in logged(env)] == ["0", "1", "2"]
    assert stored_state(ledger_url, "both") == ("3", 3)


def _check(env: dict[str, str], job: str) -> subprocess.CompletedProcess[str]:
    return run_once("check", job, env=env)


def test_check_reports_a_missing_shard_as_a_missing_period(env: dict[str, str],
                                                           ledger_url: str) -> None:
    stable_day()
    # Two days back and yesterday, both due (lag 0: each has ended), every shard done.
    result = run_once("catchup", "--job", "split", *DAY, "--shards", "2", "--since",
                      day_key(2), "--until", day_key(1), "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    whole = _check(env, "split")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    # Shard 1 of two days back was never run.
    query(ledger_url, f"DELETE FROM once_runs WHERE period = '{day_key(2)}#1'")
    partial = _check(env, "split")
    assert partial.returncode == 2, partial.stdout + partial.stderr
    assert "missing" in partial.stdout and day_key(2) in partial.stdout, partial.stdout
    status = run_once("status", "split", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)[0]["missing"] == 1


# -- command drift ---------------------------------------------------------------------------


def test_require_same_command_refuses_a_different_command(env: dict[str, str], tmp_path: Path,
                                                          ledger_url: str) -> None:
    assert run(env, "deploy", "--lag", "1", command=["sh", "-c", "exit 0"]).returncode == 0
    marker = tmp_path / "ran"
    before = query(ledger_url, "SELECT count(*) FROM once_attempts")
    refused = run(env, "deploy", "--require-same-command",
                  command=["touch", str(marker)])
    assert refused.returncode == 2
    assert "different command" in once_line(refused.stderr)
    assert not marker.exists()
    assert query(ledger_url, "SELECT count(*) FROM once_attempts") == before
    assert query(ledger_url, "SELECT count(*) FROM once_runs") == [(1,)]
    # Without the flag, whichever command fires runs.
    assert run(env, "deploy", command=["touch", str(marker)]).returncode == 0
    assert marker.exists()


def test_require_same_command_runs_the_same_command(env: dict[str, str],
                                                    ledger_url: str) -> None:
    # The first run of a job has nothing to compare with.
    assert run(env, "deploy", "--require-same-command", "--lag", "1",
               command=SHARD_LOG).returncode == 0
    result = run(env, "deploy", "--require-same-command", command=SHARD_LOG)
    assert result.returncode == 0, result.stderr
    assert len(logged(env)) == 2


def test_version_tag_is_part_of_the_fingerprint(env: dict[str, str], ledger_url: str) -> None:
    args = ["--require-same-command"]
    assert run(env, "tagged", *args, "--version-tag", "v1", "--lag", "2",
               command=["true"]).returncode == 0
    refused = run(env, "tagged", *args, "--version-tag", "v2", "--lag", "1",
                  command=["true"])
    assert refused.returncode == 2 and "different command" in once_line(refused.stderr)
    untagged = run(env, "tagged", *args, "--lag", "1", command=["true"])
    assert untagged.returncode == 2
    assert run(env, "tagged", *args, "--version-tag", "v1", "--lag", "1",
               command=["true"]).returncode == 0
    assert command_hash(["true"], "v1") != command_hash(["true"], "v2") \
        != command_hash(["true"])


def test_fingerprints_are_kept_in_the_history(env: dict[str, str], ledger_url: str) -> None:
    assert run(env, "drift", "--lag", "2", command=["true"]).returncode == 0
    assert run(env, "drift", "--lag", "1", command=["sh", "-c", "true"]).returncode == 0
    assert run(env, "drift", "--version-tag", "abc123", command=["true"]).returncode == 0
    rows = query(ledger_url, "SELECT period, command_hash FROM once_attempts ORDER BY period")
    assert [h for _, h in rows] == [command_hash(["true"]), command_hash(["sh", "-c", "true"]),
                                    command_hash(["true"], "abc123")]
    assert len({h for _, h in rows}) == 3
    # Argument boundaries count: `a b` is not `a` `b`.
    assert command_hash(["echo", "a b"]) != command_hash(["echo", "a", "b"])


def test_catchup_and_takeovers_record_the_fingerprint(env: dict[str, str],
                                                      ledger_url: str) -> None:
    result = run_once("catchup", "--job", "drift", *DAY, "--since", "2026-03-01", "--until",
                      "2026-03-02", "--version-tag", "t", "--", "false", env=env)
    assert result.returncode == 1
    retried = run_once("catchup", "--job", "drift", *DAY, "--since", "2026-03-01",
                       "--until", "2026-03-02", "--", "true", env=env)
    assert retried.returncode == 0, retried.stderr
    rows = query(ledger_url, "SELECT period, attempt, command_hash FROM once_attempts "
                             "ORDER BY period, attempt")
    assert rows == [("2026-03-01", 1, command_hash(["false"], "t")),
                    ("2026-03-01", 2, command_hash(["true"])),
                    ("2026-03-02", 1, command_hash(["true"]))]
