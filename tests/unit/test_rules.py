"""The rules the CLI, the Python API and the reports share, each in one place: the words of an
outcome and how one leads to the next (once.outcomes), a row's key and a stored job's schedule
(once.stored), what may be stored as a watermark (once.limits.state_problem), and how long a
statement may take (once.deadlines.statement_timeout)."""

from __future__ import annotations

from typing import get_args

import pytest

from once import outcomes, stored
from once.deadlines import statement_timeout
from once.limits import STATE_LIMIT, InputError, state, state_problem
from once.run.child import StateFile


@pytest.mark.parametrize("kind, succeeded, interrupted, bad_state, status, history, result", [
    ("exited", True, False, False, "done", "done", "done"),
    ("exited", False, False, False, "failed", "failed", "failed"),
    ("signaled", False, False, False, "failed", "failed", "failed"),
    ("exited", True, False, True, "failed", "bad-state", "failed"),
    ("exited", False, True, False, "failed", "interrupted", "failed"),
    ("timed-out", False, False, False, "failed", "timed-out", "timed-out"),
    ("timed-out", False, True, False, "failed", "interrupted", "timed-out"),
    ("exec-failed", False, False, False, "failed", "exec-failed", "failed"),
    ("guard-died", False, False, False, "failed", "guard-died", "failed"),
])
def test_one_mapping_from_the_runner_to_the_ledger_and_the_history(
        kind: outcomes.Kind, succeeded: bool, interrupted: bool, bad_state: bool,
        status: str, history: str, result: str) -> None:
    recorded = outcomes.status(succeeded, bad_state)
    assert recorded == status
    assert outcomes.history(kind, succeeded, interrupted, bad_state) == history
    assert outcomes.result(kind, recorded) == result


def test_every_word_belongs_to_its_vocabulary() -> None:
    assert set(outcomes.SKIPS) == set(get_args(outcomes.Skip))
    assert set(get_args(outcomes.Result)) >= outcomes.OK | outcomes.UNCLAIMED
    assert {outcomes.skip(s) for s in ("done", "failed", "running", "overlap")} == set(
        outcomes.SKIPS)
    assert set(get_args(outcomes.Status)) <= set(get_args(outcomes.History))


def test_a_row_key_is_written_and_read_back_one_way() -> None:
    assert stored.shard_key("2026-10-27", None) == "2026-10-27"
    assert stored.shard_keys("2026-10-27", 3) == ["2026-10-27#0", "2026-10-27#1",
                                                  "2026-10-27#2"]
    assert stored.shard_keys("2026-10-27", 1) == ["2026-10-27"]
    assert stored.period_key("2026-10-27#2") == stored.period_key("2026-10-27") == "2026-10-27"
    assert stored.parse("2026-10-27", "j", 1) == ("2026-10-27", None)
    assert stored.parse("2026-10-27#2", "j", 3) == ("2026-10-27", 2)


@pytest.mark.parametrize("key, shards, message", [
    ("2026-10-27#0", 1, "bad --period '2026-10-27#0': job j has no shards"),
    ("2026-10-27", 3, "job j runs 3 shards: give --period KEY#i, i from 0 to 2"),
    ("2026-10-27#3", 3, "job j runs 3 shards"),
    ("2026-10-27#x", 3, "job j runs 3 shards"),
    ("2026-10-27#\u0661", 3, "job j runs 3 shards"),  # a digit, but not an ASCII one
])
def test_a_shard_the_job_does_not_have_is_refused(key: str, shards: int, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        stored.parse(key, "j", shards)


def test_a_stored_job_s_schedule_is_the_one_it_ran_with() -> None:
    every = stored.job_schedule("every", "day", "Europe/Berlin")
    cron = stored.job_schedule("cron", "0 3 * * *", "UTC")
    assert (every.kind, every.spec, every.tz_name) == ("every", "day", "Europe/Berlin")
    assert (cron.kind, cron.spec, cron.tz_name) == ("cron", "0 3 * * *", "UTC")


@pytest.mark.parametrize("data, problem", [
    (b"", ""), (b"x" * STATE_LIMIT, ""), ("é".encode(), ""),
    (b"x" * (STATE_LIMIT + 1), "is over 64 KiB"), (b"a\0b", "holds a NUL byte"),
    (b"\xff", "is not UTF-8"),
])
def test_one_rule_for_a_watermark_set_by_hand_or_left_by_the_command(
        data: bytes, problem: str) -> None:
    assert state_problem(data) == problem
    with StateFile(True) as file:
        with open(file.path, "wb") as handle:
            handle.write(data + b"\n")
        new, error = file.read()
    assert (new, error) == ((data.decode(), "") if not problem else
                            (None, f"the new state written to ONCE_STATE_OUT {problem}"))
    if problem == "is over 64 KiB":
        with pytest.raises(InputError, match="a watermark holds at most 64 KiB of UTF-8"):
            state(data.decode())


@pytest.mark.parametrize("stale_after, timeout", [(0.3, 1.0), (3, 1.0), (6, 2.0), (30, 10.0),
                                                  (300, 10.0)])
def test_a_statement_takes_a_third_of_stale_after_from_one_to_ten_seconds(
        stale_after: float, timeout: float) -> None:
    assert statement_timeout(stale_after) == timeout


def test_the_job_a_claim_works_on_is_checked_once_for_the_cli_and_the_api() -> None:
    from once.run.flow import claiming_job
    from once.schedules import schedule

    day = schedule("day", None, "UTC")
    job = claiming_job("j" * 54, "n" * 200, day, 0, 3, 300, shards=2)  # 255: the column's
    assert (job.name, job.kind, job.schedule, job.shards) == ("n" * 200 + ":" + "j" * 54,
                                                            "every", "day", 2)
    for bad in (("j" * 55, "n" * 200, 0, 3), ("ok", None, -1, 3), ("ok", None, 0, 0)):
        name, namespace, lag, attempts = bad
        with pytest.raises(InputError):
            claiming_job(name, namespace, day, lag, attempts, 300)
