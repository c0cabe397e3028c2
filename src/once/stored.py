"""What the ledger's columns hold, read the same way by the commands, the gap finder and the
reports: a row's key (once_runs.period: the period's key, or `KEY#i` for shard i of a job run
in shards, 0 to N-1) and a job's schedule (once_jobs.kind, schedule and tz). On the hot path:
imports only once.limits, once.periods and once.schedules.
"""

from __future__ import annotations

from once.limits import InputError
from once.periods import Schedule
from once.schedules import schedule


def job_schedule(kind: str, spec: str, tz: str) -> Schedule:
    """The schedule a job's row holds (kind `every` or `cron`, its spec, its zone), as its
    latest `once run` gave it."""
    return schedule(spec if kind == "every" else None, spec if kind == "cron" else None, tz)


def shard_key(period_key: str, shard: int | None) -> str:
    """The row's key of a period (shard None), or of one shard of it."""
    return period_key if shard is None else f"{period_key}#{shard}"


def shard_keys(period_key: str, shards: int) -> list[str]:
    """Every row's key of a period when the job runs in `shards` shards."""
    return [period_key] if shards == 1 else [shard_key(period_key, i) for i in range(shards)]


def period_key(key: str) -> str:
    """The period's key of a row's key (the shard dropped)."""
    return key.partition("#")[0]


def parse(key: str, job: str, shards: int) -> tuple[str, int | None]:
    """A row's key as given (`once rerun --period`): the period's key and the shard (None for
    a job without shards). InputError for a shard the job does not have, or a missing one."""
    base, sharp, index = key.partition("#")
    shard = int(index) if index.isascii() and index.isdigit() else -1
    if shards == 1:
        if sharp:
            raise InputError(f"bad --period {key!r}: job {job} has no shards")
        return base, None
    if not 0 <= shard < shards:
        raise InputError(f"job {job} runs {shards} shards: give --period KEY#i, i from 0 to "
                         f"{shards - 1}")
    return base, shard
