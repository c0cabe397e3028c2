"""Sharded periods (`--shards`, `--all-shards`), on every backend: each shard of a period
runs once, takeovers, catch-up, rerun and check by shard.

Real `once` processes against real databases (children and helpers: tests/child_log.py);
the reports in this process (helpers.run_either).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from child_log import (
    DAY,
    INCREMENT,
    SHARD_LOG,
    day_key,
    logged,
    once_line,
    run,
    stable_day,
    stored_state,
)
from helpers import ONCE, release_together, run_either, wait_for
from ledger_sql import query, scalar
from procs import alive, parent, pids, start_once

pytestmark = [pytest.mark.usefixtures("ledger_url"), pytest.mark.tables_made]


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_killed_shard_owner_is_taken_over(env: dict[str, str], tmp_path: Path,
                                            ledger_url: str) -> None:
    stable_day()
    # Generous: the two fires below must be done within it, and a `once` started on a loaded
    # two-core machine may take seconds (with 6 s, under load, they were not).
    stale = 30.0
    args = ["run", "--job", "split", *DAY, "--shards", "2", "--stale-after", f"{stale:g}s",
            "--"]
    # The claim's heartbeat is no older than this (not the kill: a loaded machine took
    # seconds between the claim and the kill, and the fires took shard 0 over, stale).
    started = time.monotonic()
    owner = start_once(*args, "sh", "-c", 'echo $$ > "$DIR/pids"; echo "$ONCE_SHARD" '
                       '> "$DIR/first-shard"; sleep 600', env=env)
    (shell,) = wait_for(lambda: pids(tmp_path / "pids", 1), what="the owner's child")
    guard = parent(shell)
    owner.kill()
    killed = time.monotonic()
    owner.wait(10)
    wait_for(lambda: not alive(shell) and not alive(guard), timeout=stale / 3,
             what="the child to die with its owner")
    assert (tmp_path / "first-shard").read_text().strip() == "0"
    # While shard 0's claim is fresh, others take shard 1, then find nothing to do.
    for _ in range(2):
        assert run(env, "split", "--shards", "2", "--stale-after", f"{stale:g}s",
                   command=SHARD_LOG).returncode == 0
    assert time.monotonic() - started < stale - 0.5, "too slow to prove a skip"
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
    dry = run_either(*catchup, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert [line.split()[0] for line in dry.stdout.splitlines()] == [
        day_key(4), day_key(2), day_key(1), day_key(0)]
    result = run_either(*catchup, "--", *SHARD_LOG, env=env)
    assert result.returncode == 0, result.stderr
    ran = [tuple(line.split()[:2]) for line in logged(env)]
    expected = ([(day_key(4), str(i)) for i in range(4)]
                + [(day_key(2), str(i)) for i in (1, 2, 3)]
                + [(day_key(1), str(i)) for i in (2, 3)]
                + [(day_key(0), str(i)) for i in range(4)])
    assert ran == expected
    assert scalar(ledger_url, "SELECT count(*) FROM once_runs WHERE status = 'done'") == 20
    assert run_either(*catchup, "--", *SHARD_LOG, env=env).returncode == 0
    assert len(logged(env)) == len(expected)


def test_catchup_by_default_resumes_a_partly_done_period(env: dict[str, str]) -> None:
    stable_day()
    # Yesterday has only shard 0 done: it is not done, so catch-up starts there.
    assert run(env, "split", "--shards", "2", "--lag", "1", command=["true"]).returncode == 0
    result = run_either("catchup", "--job", "split", *DAY, "--shards", "2", "--", *SHARD_LOG,
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
        refused = run_either("rerun", "--job", "split", "--period", bad, "--", *SHARD_LOG,
                           env=env)
        assert refused.returncode == 2, refused.stderr
        assert "KEY#i" in once_line(refused.stderr)
    result = run_either("rerun", "--job", "split", "--period", f"{day_key(0)}#1", "--reason",
                      "bad input", "--", *SHARD_LOG, env=env)
    assert result.returncode == 0, result.stderr
    assert logged(env)[-1].split() == [day_key(0), "1", "2", "2"]
    assert query(ledger_url, "SELECT period, attempt FROM once_runs ORDER BY period") == [
        (f"{day_key(0)}#0", 1), (f"{day_key(0)}#1", 2)]
    unsharded = run(env, "plain", command=["true"])
    assert unsharded.returncode == 0
    refused = run_either("rerun", "--job", "plain", "--period", f"{day_key(0)}#0", "--",
                       "true", env=env)
    assert refused.returncode == 2 and "no shards" in once_line(refused.stderr)


def test_state_with_shards_hands_each_shard_the_watermark(env: dict[str, str],
                                                          ledger_url: str) -> None:
    result = run(env, "both", "--shards", "3", "--all-shards", "--state", command=INCREMENT)
    assert result.returncode == 0, result.stderr
    assert [line.split()[1] for line in logged(env)] == ["0", "1", "2"]
    assert stored_state(ledger_url, "both") == ("3", 3)


def _check(env: dict[str, str], job: str) -> subprocess.CompletedProcess[str]:
    return run_either("check", job, env=env)


def test_check_reports_a_missing_shard_as_a_missing_period(env: dict[str, str],
                                                           ledger_url: str) -> None:
    stable_day()
    # Two days back and yesterday, both due (lag 0: each has ended), every shard done.
    result = run_either("catchup", "--job", "split", *DAY, "--shards", "2", "--since",
                      day_key(2), "--until", day_key(1), "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    whole = _check(env, "split")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    # Shard 1 of two days back was never run.
    query(ledger_url, f"DELETE FROM once_runs WHERE period = '{day_key(2)}#1'")
    partial = _check(env, "split")
    assert partial.returncode == 2, partial.stdout + partial.stderr
    assert "missing" in partial.stdout and day_key(2) in partial.stdout, partial.stdout
    status = run_either("status", "split", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)[0]["missing"] == 1
