"""Old and new `once` on one ledger: a fleet upgraded while it runs.

Every backend, real processes of real older builds (tests/versions.py: the last commit of
main before each schema version, schemas 2, 3 and 4) beside the current `once` (schema 5).
The rule (docs/concepts/ledger.md): the first schema-5 `once` to use an older ledger upgrades it
in place (or `once schema` does); from then on every claim and every report of an older
`once` is refused (exit 75, nothing run, nothing written), and a schema-5 `once` refuses a
ledger newer than it knows. An attempt an older `once` claimed before the upgrade keeps its
claim: its renewals and its finish work, and nothing takes it over before its own promise
(its stored --stale-after; a schema-2 owner stored none, and the upgrade gives its rows the
job's recorded --stale-after, at least 300 s).

Each older release gets a ledger of its own, which it makes (tests/mixed_ledgers.py), and the
releases are tried side by side, each on its own ledger, so that they share the waits for
staleness. What ran is counted from the commands' own log (child_log.RUNNER: one `start` per
run, `overlap` when another attempt of its period was alive), what the ledger holds with
plain SQL.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from child_log import RUNNER, overlaps, stable_day, starts
from helpers import ONCE, release_together, wait_for
from ledger_sql import query
from mixed_ledgers import (
    DAY,
    NEW,
    Ledger,
    age_heartbeat,
    attempts,
    finish,
    heartbeat_age,
    refusal,
    row,
    snapshot,
    today,
    version,
)
from once.ledger import parse_url
from procs import alive
from versions import Release

if TYPE_CHECKING:
    from conftest import Server

SHORT = ["--stale-after", "1s", "--", *RUNNER]  # a caller that promises a second
# A caller that takes a dead owner's run over and runs the command: its own promise far short
# of the dead owner's (PROMISE, below) and of the minute the test leaves before it, yet long
# enough for its first renewal on a loaded machine (a second was not, beside a whole CI: exit
# 70, "its deadline passed before this process could renew").
TAKING = ["--stale-after", "20s", "--", *RUNNER]
# Seconds: the promise of the older owner whose renewals are watched (it renews every 4 s;
# schema 2, whose renewals are cut short by a deadline of a third of it, missed them with 3 s
# on a loaded two-core machine).
RENEWING = 12


# -- a rolling upgrade: live owners, refusals, reports -----------------------------------------


def _old_fleet(ledgers: dict[int, Ledger]) -> dict[int, dict[str, subprocess.Popen[str]]]:
    """What each older once leaves on its ledger: a done day, a failed-out one (with output,
    schema 4 on), and two live owners, one that promised an hour and one 12 s (both running
    until let finish). Every ledger at once."""
    owners = {schema: {"hour": ledger.old("run", "--job", "hour", *DAY, "--stale-after", "1h",
                                          "--", *RUNNER, "hold")}
              for schema, ledger in ledgers.items()}
    for ledger in ledgers.values():
        ledger.pid("hour")  # its first use made the tables
    runs = {}
    for schema, ledger in ledgers.items():
        owners[schema]["renewing"] = ledger.old(
            "run", "--job", "renewing", *DAY, "--stale-after", f"{RENEWING}s", "--", *RUNNER,
            "hold")
        runs[schema] = (ledger.old("run", "--job", "done", *DAY, "--", *RUNNER),
                        ledger.old("run", "--job", "failed", *DAY, "--max-attempts", "1", "--",
                                   "sh", "-c", "echo last words; exit 3"))
    for schema, ledger in ledgers.items():
        done, failed = finish(*runs[schema])
        assert (done[0], failed[0]) == (0, 3), (ledger.name, done, failed)
        ledger.pid("renewing")
        assert version(ledger.url) == ledger.schema
    return owners


# The first schema-5 once upgrades the ledger, whatever it does: a report, a claim (of a job
# of its own), or `once schema`.
FIRST_USE = {2: ["status"], 3: ["run", "--job", "other", *DAY, "--", *RUNNER], 4: ["schema"]}


def _refused_everything(ledger: Ledger) -> None:
    """The older once's claims and reports on its upgraded ledger: exit 75, one line, nothing
    run, nothing written. Each costs an older once's upgrade path (SQLAlchemy, most of a
    second of CPU): a claim and a report of each release, and the other kinds of claim and
    report from schema 4, the release a fleet upgrades from."""
    before = snapshot(ledger.url)
    ran = starts(ledger.env)
    claims = [["run", "--job", "new", *DAY, *SHORT]]  # a current owner, promised an hour
    reports = [["status"]]
    if ledger.schema == 4:
        claims += [["run", "--job", "done", *DAY, "--lag", "1", "--", *RUNNER],  # would run
                   ["rerun", "--job", "done", "--period", today(), "--", *RUNNER]]
        reports += [["history", "done"]]
    catchup = ["catchup", "--job", "done", *DAY, "--since", today(1), "--", *RUNNER]
    commands = [*claims, *([catchup] if ledger.schema == 4 else []), *reports]
    for args, (code, out, err) in zip(commands, finish(*(ledger.old(*a) for a in commands)),
                                      strict=True):
        assert (code, out) == (75, ""), (ledger.name, args, code, out, err)
        if args in reports:  # they meet the renamed column: one line, naming it
            assert len(err.splitlines()) == 1 and err.startswith("once: "), (args, err)
        else:  # catch-up adds its period's line
            refusal(ledger.schema, err.splitlines()[0] if args is catchup else err)
    assert snapshot(ledger.url) == before, f"{ledger.name} wrote on an upgraded ledger"
    assert starts(ledger.env) == ran, f"{ledger.name} ran a command on an upgraded ledger"


def _fire_at_the_owners(ledgers: dict[int, Ledger], catchup: bool) -> None:
    """Current callers that promise a second at the older owners, on every ledger at once:
    each skips."""
    fires = {schema: [ledger.new("run", "--job", "hour", *DAY, *SHORT),
                      ledger.new("run", "--job", "renewing", *DAY, *SHORT)]
             + ([ledger.new("catchup", "--job", "hour", *DAY, "--since", today(), *SHORT)]
                if catchup else [])
             for schema, ledger in ledgers.items()}
    for schema, procs in fires.items():
        results = finish(*procs)
        assert [code for code, _, _ in results] == [0] * len(procs), (ledgers[schema].name,
                                                                      results)


@pytest.mark.slow
def test_a_rolling_upgrade_keeps_every_owner_and_refuses_the_older_once(
        ledgers: dict[int, Ledger]) -> None:
    """Older owners claimed before the upgrade (promising an hour, and 12 s with renewals)
    against current callers that promise a second; a current owner against older callers;
    every older command on the upgraded ledger; the current reports on the older rows. Each
    owner then finishes: done once, one attempt in its history."""
    stable_day()
    owners = _old_fleet(ledgers)
    firsts = finish(*(ledger.new(*FIRST_USE[schema]) for schema, ledger in ledgers.items()))
    for (schema, ledger), first in zip(ledgers.items(), firsts, strict=True):
        assert first[0] == 0 and version(ledger.url) == NEW, (ledger.name, first)
        owners[schema]["new"] = ledger.new("run", "--job", "new", *DAY, "--stale-after", "1h",
                                           "--", *RUNNER, "hold")
    beats = {schema: row(ledger.url, "renewing", "heartbeat_at")
             for schema, ledger in ledgers.items()}
    for ledger in ledgers.values():
        ledger.pid("new")
        _refused_everything(ledger)
    _fire_at_the_owners(ledgers, catchup=True)
    for schema, ledger in ledgers.items():
        # The older owner renews its claim on the upgraded ledger.
        wait_for(lambda s=schema, ledger=ledger: row(  # type: ignore[misc]
            ledger.url, "renewing", "heartbeat_at") != beats[s], timeout=60,
            what=f"{ledger.name}: a renewal on the upgraded ledger")
    _fire_at_the_owners(ledgers, catchup=False)
    for ledger in ledgers.values():
        assert heartbeat_age(ledger.url, "hour") > 1, ledger.name  # past the callers' promise
        assert heartbeat_age(ledger.url, "renewing") < RENEWING, ledger.name
        _reports_read_older_rows(ledger)
        for job in ("hour", "renewing", "new"):
            ledger.let_finish(job)
    for schema, ledger in ledgers.items():
        for job, owner in owners[schema].items():
            ((code, _out, err),) = finish(owner)
            assert code == 0, (ledger.name, job, err)
            assert row(ledger.url, job, "status", "attempt") == ("done", 1), (ledger.name, job)
            assert attempts(ledger.url, job) == [(1, "done")], (ledger.name, job)
        ((code, out, err),) = finish(ledger.new("history", "hour", "--json"))
        assert [(a["attempt"], a["status"]) for a in json.loads(out)] == [(1, "done")], err
        jobs = ["hour", "renewing", "done", "new"] + (["other"] if schema == 3 else [])
        assert starts(ledger.env) == {(job, today()): 1 for job in jobs}, ledger.name
        assert not overlaps(ledger.env), ledger.name


def _reports_read_older_rows(ledger: Ledger) -> None:
    """The current reports on rows the older once wrote (and its live owners renew)."""
    status, check, logs = finish(ledger.new("status", "--json"), ledger.new("check", "--json"),
                                 ledger.new("logs", "failed"))
    assert status[0] == 0, (ledger.name, status)
    jobs = {j["job"]: j for j in json.loads(status[1])}
    assert jobs["done"]["last_done"] == today(), (ledger.name, jobs["done"])
    assert (jobs["failed"]["failed"], jobs["failed"]["failed_out"]) == (1, 1), ledger.name
    # A schema-2 owner stored no promise: the upgrade gave it the job's, at least 300 s.
    renewing = 300.0 if ledger.schema == 2 else float(RENEWING)
    for job, promise in (("hour", 3600.0), ("renewing", renewing)):
        (running,) = jobs[job]["running"]
        assert (running["attempt"], running["stale"]) == (1, False), (ledger.name, running)
        assert running["stale_after_s"] == promise, (ledger.name, running)
    assert check[0] == 2, (ledger.name, check)  # CRITICAL: the failed-out day, nothing else
    assert {(f["job"], f["problem"]) for f in json.loads(check[1])} == {
        ("failed", "failed-out")}, (ledger.name, check[1])
    # Schema 4 kept the output; the older ones had nowhere to put it.
    assert logs[0] == 0 and ("last words" in logs[1]) == (ledger.schema >= 4), (ledger.name,
                                                                                 logs)


@pytest.mark.slow
def test_a_ledger_newer_than_this_once_is_refused(env: dict[str, str],
                                                  ledger_url: str) -> None:
    """From schema 5 on the claim checks the version in its own statement: a ledger that a
    newer once upgraded (once_meta says 6) is refused even where no column is missing."""
    stable_day()
    first = subprocess.run([ONCE, "run", "--job", "j", *DAY, "--", *RUNNER], env=env,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    query(ledger_url, "UPDATE once_meta SET value = '6' WHERE name = 'schema_version'")
    before = snapshot(ledger_url)
    commands = [["run", "--job", "j", *DAY, "--lag", "1", "--", *RUNNER],
                ["rerun", "--job", "j", "--period", today(), "--", *RUNNER],
                ["catchup", "--job", "j", *DAY, "--since", today(1), "--", *RUNNER],
                ["schema"], ["status"], ["check"], ["history", "j"]]
    procs = [subprocess.Popen([ONCE, *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for args in commands]
    for args, (code, out, err) in zip(commands, finish(*procs), strict=True):
        assert (code, out) == (75, ""), (args, code, out, err)
        line, *more = err.splitlines()
        assert line.startswith("once: ") and (not more or args[0] == "catchup"), (args, err)
        assert re.search(r"\b6\b", line) and re.search(rf"\b{NEW}\b", line), (args, err)
    assert snapshot(ledger_url) == before
    assert starts(env) == {("j", today()): 1}


def _finished_long_ago(url: str) -> None:
    """Every finished run and attempt as if it ended in 2020: a prune of 30 days has work."""
    long_ago = ("'2020-01-01 00:00:00.000000'" if url.startswith("sqlite")
                else "'2020-01-01 00:00:00'")
    for table in ("once_runs", "once_attempts"):
        query(url, f"UPDATE {table} SET finished_at = {long_ago} WHERE finished_at IS NOT NULL")


def test_an_older_state_set_and_prune_write_nothing_on_an_upgraded_ledger(
        ledgers: dict[int, Ledger]) -> None:
    """Neither meets schema 5's renamed once_jobs.fires: an older `once state --set` changes
    the watermark and records a `(state)` attempt that names no claim_id, which schema 5
    requires (NOT NULL, no default; MySQL/MariaDB: also not ''); an older `once prune` reads
    once_jobs.last_fire_at first, renamed last_fired_at. Neither older version reads the
    version there, so neither says the version line: `state --set` exits 75 with its one
    line naming the database's refusal of claim_id (the change of the watermark goes with
    it: one transaction, one statement on PostgreSQL); `prune` (schemas 3 and 4) exits 75
    with its one line naming the missing column. Schema 2's `prune` catches no database
    error: a traceback whose exception (SQLAlchemy's) names the column, exit 1. Nothing is
    written: the current `once prune --dry-run` then finds what the older one would have
    deleted."""
    stable_day()
    # One after the other on each ledger: the first makes the tables, and two first uses of
    # an older once at one instant on SQLite can meet each other's table creation ("database
    # is locked", exit 75), which is the older release's, not what is tried here.
    for lag in ("1", "0"):
        made = finish(*(ledger.old("run", "--job", "j", *DAY, "--lag", lag, "--", *RUNNER)
                        for ledger in ledgers.values()))
        assert [code for code, _, _ in made] == [0] * len(ledgers), made
    for schema, ledger in ledgers.items():
        (seeded,) = finish(ledger.old("state", "j", "--set", "older"))
        assert seeded[0] == 0 and version(ledger.url) == schema, (ledger.name, seeded)
        _finished_long_ago(ledger.url)
    for ledger, upgraded in zip(ledgers.values(),
                                finish(*(ledger.new("schema") for ledger in ledgers.values())),
                                strict=True):
        assert upgraded[0] == 0 and version(ledger.url) == NEW, (ledger.name, upgraded)
    before = {schema: snapshot(ledger.url) for schema, ledger in ledgers.items()}
    # One after the other on each ledger (a SQLite ledger's lock would answer the second
    # instead of the schema), the ledgers side by side.
    states = finish(*(ledger.old("state", "j", "--set", "refused") for ledger in
                      ledgers.values()))
    prunes = finish(*(ledger.old("prune", "--older-than", "30d") for ledger in
                      ledgers.values()))
    for (schema, ledger), (state, _, state_err), (pruned, prune_out, prune_err) in zip(
            ledgers.items(), states, prunes, strict=True):
        assert state == 75, (ledger.name, state, state_err)
        (line,) = state_err.splitlines()
        assert line.startswith("once: cannot set the state in the ledger ") and (
            "claim_id" in line), (ledger.name, line)
        assert pruned == (1 if schema == 2 else 75) and prune_out == "", (ledger.name, pruned,
                                                                           prune_err)
        if schema == 2:  # the exception's line, SQLAlchemy's, above its statement
            last = next(line for line in reversed(prune_err.splitlines())
                        if line.startswith("sqlalchemy.exc."))
        else:
            (last,) = prune_err.splitlines()
            assert last.startswith("once: cannot prune the ledger "), (ledger.name, last)
        assert "last_fire_at" in last, (ledger.name, prune_err)
        assert snapshot(ledger.url) == before[schema], f"{ledger.name} wrote on schema 5"
        assert query(ledger.url, "SELECT state FROM once_jobs") == [("older",)], ledger.name
    for ledger, (code, out, err) in zip(
            ledgers.values(), finish(*(ledger.new("prune", "--older-than", "30d", "--dry-run")
                                       for ledger in ledgers.values())), strict=True):
        assert code == 0, (ledger.name, err)
        # The older day's run row and its attempt, and the (state) row's.
        assert "would delete 1 done rows, 3 attempts and 0 lead terms" in out, (ledger.name, out)


# -- races -----------------------------------------------------------------------------------


def _race(ledger: Ledger, lags: list[int], each: int) -> list[tuple[str, int, str]]:
    """`each` older and `each` current `once run` per period (`--lag`), released at one
    instant: (who, status, stderr) of every one."""
    commands, who = [], []
    for lag in lags:
        for _ in range(each):
            for name, once in (("old", ledger.release.once), ("new", ONCE)):
                commands.append([once, "run", "--job", "race", *DAY, "--lag", str(lag), "--",
                                 *RUNNER])
                who.append(name)
    results = release_together(commands, Path(ledger.env["DIR"]) / "gate", ledger.env)
    return [(w, r.returncode, r.stderr) for w, r in zip(who, results, strict=True)]


def _judge_race(ledger: Ledger, lags: list[int], results: list[tuple[str, int, str]]) -> None:
    periods = {today(lag) for lag in lags}
    ran = {period: n for (_job, period), n in starts(ledger.env).items() if period in periods}
    assert ran == dict.fromkeys(periods, 1), (ledger.name, ran, results)
    assert not overlaps(ledger.env), ledger.name
    for who, code, err in results:
        if who == "new" or code != 75:
            assert code == 0, (ledger.name, who, code, err)
            continue
        (line,) = err.splitlines()
        # Refused by the version, or, on its second try after an upgrade it waited for, by
        # the column the upgrade renamed.
        assert "newer than this once knows" in line or "fires" in line, (ledger.name, err)
    rows = query(ledger.url, "SELECT period, status, attempt FROM once_runs WHERE job = 'race'")
    assert sorted(r for r in rows if r[0] in periods) == sorted(
        (p, "done", 1) for p in periods), (ledger.name, rows)
    tries = query(ledger.url, "SELECT period, attempt FROM once_attempts WHERE job = 'race'")
    assert sorted(t for t in tries if t[0] in periods) == sorted((p, 1) for p in periods)


@pytest.mark.slow
def test_old_and_new_claims_at_one_instant_run_each_period_once(
        ledgers: dict[int, Ledger]) -> None:
    """On the older release's own ledger, where the upgrade meets its claims; then (schema 4,
    the release a fleet upgrades from) on the upgraded ledger, where they are refused."""
    stable_day()
    for ledger in ledgers.values():
        (made,) = finish(ledger.old("schema"))
        assert made[0] == 0 and version(ledger.url) == ledger.schema, made
        # Schema 4, the release a fleet upgrades from: two periods, two of each at each.
        lags, each = ([0, 1], 2) if ledger.schema == 4 else ([0], 1)
        _judge_race(ledger, lags, _race(ledger, lags, each))
        assert version(ledger.url) == NEW, ledger.name
    then = _race(ledgers[4], [2], 2)
    assert all(code == 75 for who, code, _ in then if who == "old"), then
    _judge_race(ledgers[4], [2], then)


@pytest.mark.slow
def test_old_and_new_first_uses_at_one_instant(env: dict[str, str], ledger_url: str,
                                               releases: dict[int, Release],
                                               tmp_path: Path) -> None:
    """A ledger without tables, first used by both at once: whichever makes the tables,
    each period runs once and the ledger ends at schema 5."""
    stable_day()
    onces = (releases[4].once, releases[3].once, ONCE)
    commands = [[once, "run", "--job", "first", *DAY, "--lag", str(lag), "--", *RUNNER]
                for lag in (0, 1) for once in onces]
    results = release_together(commands, tmp_path / "gate", env)
    said = [("new" if c[0] == ONCE else c[0].split("/")[-4], c[c.index("--lag") + 1],
             r.returncode, r.stderr[-300:]) for c, r in zip(commands, results, strict=True)]
    assert starts(env) == {("first", today(0)): 1, ("first", today(1)): 1}, said
    assert not overlaps(env)
    assert version(ledger_url) == NEW
    for command, done in zip(commands, results, strict=True):
        refused = done.returncode == 75 and command[0] != ONCE
        assert done.returncode == 0 or refused, done.stderr
        assert done.returncode == 0 or len(done.stderr.splitlines()) == 1, done.stderr


# -- owners that die -------------------------------------------------------------------------

# The dead owners promised an hour: the test moves their last renewal back (age_heartbeat)
# to a minute short of the promise, then a minute past it, instead of waiting, so that a
# loaded machine's delays cannot carry a fire past the promise unseen.
PROMISE = 3600


def _fire_at_the_dead(ledgers: dict[int, Ledger],
                      who: str) -> dict[int, dict[str, tuple[int, str, str]]]:
    """On every ledger at once, each promising 20 s (TAKING): the current once at the older
    owner's job (`old-dead`) and at the current owner's (`new-dead`); or the older once at
    `new-dead`."""
    fires = {schema: {f"new at {job}": ledger.new("run", "--job", job, *DAY, *TAKING)
                      for job in ("old-dead", "new-dead")} if who == "new" else
             {"old at new-dead": ledger.old("run", "--job", "new-dead", *DAY, *TAKING)}
             for schema, ledger in ledgers.items()}
    return {schema: dict(zip(procs, finish(*procs.values()), strict=True))
            for schema, procs in fires.items()}


def _refused_at_the_dead(ledgers: dict[int, Ledger]) -> None:
    for schema, fired in _fire_at_the_dead(ledgers, "old").items():
        code, _out, err = fired["old at new-dead"]
        assert code == 75, (ledgers[schema].name, err)
        refusal(schema, err)


def _owners_killed(ledgers: dict[int, Ledger]) -> None:
    """On each ledger an older owner claimed before the upgrade (`old-dead`) and a current one
    after it (`new-dead`), both promising an hour; then kill -9 of both wrappers, whose
    guards kill the commands."""
    promise = ["--stale-after", f"{PROMISE}s", "--", *RUNNER, "hold"]
    olds = {s: ledger.old("run", "--job", "old-dead", *DAY, *promise)
            for s, ledger in ledgers.items()}
    for ledger in ledgers.values():
        ledger.pid("old-dead")
    for ledger, upgraded in zip(ledgers.values(),
                                finish(*(ledger.new("schema") for ledger in ledgers.values())),
                                strict=True):
        assert upgraded[0] == 0 and version(ledger.url) == NEW, upgraded
    news = {s: ledger.new("run", "--job", "new-dead", *DAY, *promise)
            for s, ledger in ledgers.items()}
    for schema, ledger in ledgers.items():
        ledger.pid("new-dead")
        for owner in (olds[schema], news[schema]):
            owner.send_signal(signal.SIGKILL)
    for schema, ledger in ledgers.items():
        for job, owner in (("old-dead", olds[schema]), ("new-dead", news[schema])):
            owner.communicate(timeout=30)
            command = ledger.pid(job)
            wait_for(lambda c=command: not alive(c), timeout=15,  # type: ignore[misc]
                     what=f"{ledger.name}: the guard to kill {job}'s command")


@pytest.mark.slow
def test_a_dead_owner_of_either_version_is_taken_over_only_after_its_promise(
        ledgers: dict[int, Ledger]) -> None:
    stable_day()
    _owners_killed(ledgers)
    jobs = ("old-dead", "new-dead")
    for ledger in ledgers.values():
        # The promise each made, schema 2's too (the upgrade gave its row the job's).
        assert [row(ledger.url, job, "stale_after")[0] for job in jobs] == [PROMISE] * 2
        for job in jobs:
            age_heartbeat(ledger.url, job, PROMISE - 60)
    # Within the promise: nothing is taken over, whatever the callers promise.
    early = _fire_at_the_dead(ledgers, "new")
    for schema, ledger in ledgers.items():
        assert all(code == 0 for code, _, _ in early[schema].values()), early[schema]
        assert [row(ledger.url, job, "attempt")[0] for job in jobs] == [1, 1], ledger.name
        assert starts(ledger.env) == {(job, today()): 1 for job in jobs}, ledger.name
        for job in jobs:
            age_heartbeat(ledger.url, job, 120)
    # Past it: the current once takes over either; the older one is refused, even now.
    _refused_at_the_dead(ledgers)
    late = _fire_at_the_dead(ledgers, "new")
    for schema, ledger in ledgers.items():
        assert all(code == 0 for code, _, _ in late[schema].values()), late[schema]
        for job in jobs:
            assert row(ledger.url, job, "status", "attempt") == ("done", 2), (ledger.name, job)
            assert attempts(ledger.url, job) == [(1, "running"), (2, "done")], ledger.name
        assert starts(ledger.env) == {(job, today()): 2 for job in jobs}, ledger.name
        assert not overlaps(ledger.env), ledger.name


# -- an upgrade cut short --------------------------------------------------------------------


def test_an_upgrade_cut_short_is_refused_by_the_older_once_and_finished_by_the_next(
        backend: Server, ledger_url: str, env: dict[str, str],
        releases: dict[int, Release]) -> None:
    """`once schema` killed (kill -9, its session ended by the server) in the middle of the
    upgrade: an outsider's open transaction holds it at its first change after the rename of
    once_jobs.fires. PostgreSQL rolls the whole upgrade back; MySQL/MariaDB commits each
    statement on its own, so the rename stays while once_meta still says 4. Then the older
    once fires (it runs, on a ledger still the older one's, or it is refused: never stuck),
    the current once fires (it finishes the upgrade and runs), and the older once is refused."""
    if backend.dialect == "sqlite":
        pytest.skip("SQLite upgrades in one transaction under its write lock, which nothing "
                    "holds up half-way")
    ledger = Ledger(releases[4], ledger_url, env)
    (first,) = finish(ledger.old("run", "--job", "a", *DAY, "--", *RUNNER))
    assert first[0] == 0 and version(ledger.url) == 4, first
    with _holding(ledger.url, "once_attempts") as waiting:
        upgrade = ledger.new("schema")
        session = wait_for(waiting, timeout=90, what="the upgrade to wait on once_attempts")
        upgrade.send_signal(signal.SIGKILL)
        upgrade.communicate(timeout=30)
        _end_session(backend, session)
    (old,) = finish(ledger.old("run", "--job", "a", *DAY, "--lag", "1", "--", *RUNNER))
    assert old[0] in (0, 75), old
    if old[0] == 75:
        assert "newer than this once knows" in old[2], old  # refused, naming both versions
    (new,) = finish(ledger.new("run", "--job", "a", *DAY, "--lag", "2", "--", *RUNNER))
    assert new[0] == 0, new
    assert version(ledger.url) == NEW
    (late,) = finish(ledger.old("run", "--job", "a", *DAY, "--lag", "3", "--", *RUNNER))
    assert late[0] == 75, late
    refusal(4, late[2])
    ran = {today(0): 1, today(2): 1, **({today(1): 1} if old[0] == 0 else {})}
    assert starts(ledger.env) == {("a", period): n for period, n in ran.items()}, old


@contextmanager
def _holding(url: str, table: str) -> Iterator[Callable[[], int | None]]:
    """An open transaction that has read `table` (an ALTER of it waits for its end); yields
    a probe: the server's id for the session whose ALTER of the table waits, or None."""
    target = parse_url(url)
    if target.dialect == "postgresql":
        import psycopg

        conn: Any = psycopg.connect(target.connect_args["conninfo"])
        conn.execute(f"SELECT * FROM {table} LIMIT 1").fetchall()
        probe = ("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                 f"AND query LIKE 'ALTER TABLE {table}%'")
    else:
        import pymysql

        conn = pymysql.connect(**target.connect_args, autocommit=False)
        conn.cursor().execute(f"SELECT * FROM {table} LIMIT 1")
        probe = ("SELECT id FROM information_schema.processlist "
                 f"WHERE info LIKE 'ALTER TABLE {table}%'")

    def waiting() -> int | None:
        rows = query(url, probe)
        return int(rows[0][0]) if rows else None

    try:
        yield waiting
    finally:
        conn.rollback()
        conn.close()


def _end_session(backend: Server, session: int) -> None:
    """The server ends the killed process's session, as it does once it sees the socket
    closed (before its waiting ALTER gets the lock and goes on)."""
    with backend.admin() as conn:
        if backend.dialect == "postgresql":
            conn.execute("SELECT pg_terminate_backend(%s)", (session,))
        else:
            with suppress(Exception):  # gone already
                conn.cursor().execute(f"KILL CONNECTION {session}")
