"""`once prune` and the terms of `once lead` (once_lead_terms), on every backend: the terms
that ended before the cut-off go, never a name's latest (the next term is seeded from the
history's largest) nor one that has not ended; --dry-run counts them; a ledger without the
lease tables prunes as before.

The terms are made with the lease statements themselves (once.ledger.leases) and aged with
SQL (the database's clock wrote them): nothing is mocked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from helpers import run_either
from ledger_sql import query

LONG_AGO = "'2025-01-01 00:00:00.000000'"  # a timestamptz, DATETIME(6) and SQLite's text alike


@contextmanager
def leases_of(url: str) -> Iterator[Any]:
    from once.ledger import open_ledger, parse_url
    from once.ledger.leases import Leases

    with open_ledger(parse_url(url)) as ledger:
        yield Leases(ledger)


def terms(url: str) -> list[tuple[str, int]]:
    return sorted((str(name), int(term)) for name, term in
                  query(url, "SELECT name, term FROM once_lead_terms"))


def age(url: str, name: str, *numbers: int) -> None:
    """The terms of `name` numbered so ended (and began) long ago."""
    listed = ", ".join(str(n) for n in numbers)
    query(url, f"UPDATE once_lead_terms SET started_at = {LONG_AGO}, ended_at = {LONG_AGO} "
               f"WHERE name = '{name}' AND term IN ({listed}) AND ended_at IS NOT NULL")


def test_prune_forgets_ended_terms_but_each_names_latest(once_env: dict[str, str],
                                                         ledger_url: str) -> None:
    with leases_of(ledger_url) as leases:
        beat = []
        for holder in ("h1", "h2", "h3"):  # two released terms, then one that lasts
            term, _ = leases.acquire("beat", holder, holder, 60.0)
            beat.append(term)
            if holder != "h3":
                assert leases.release("beat", holder, term)
        old = []
        for holder in ("h4", "h5"):  # every term released: the latest has ended too
            term, _ = leases.acquire("old", holder, holder, 60.0)
            old.append(term)
            assert leases.release("old", holder, term)
        fresh, _ = leases.acquire("fresh", "h6", "h6", 60.0)  # ended within the cut-off
        assert leases.release("fresh", "h6", fresh)
        later, _ = leases.acquire("fresh", "h7", "h7", 60.0)
        assert leases.release("fresh", "h7", later)
    age(ledger_url, "beat", *beat)  # the lasting one has no ended_at: it stays as it is
    age(ledger_url, "old", *old)
    # beat's first term never seen to end (its holder died unseen, say): it stays.
    query(ledger_url, f"UPDATE once_lead_terms SET ended = NULL, ended_at = NULL "
                      f"WHERE name = 'beat' AND term = {beat[0]}")
    before = terms(ledger_url)
    assert len(before) == 7

    dry = run_either("prune", "--older-than", "30d", "--dry-run", env=once_env)
    assert dry.returncode == 0, dry.stderr
    # beat's second term and old's first: old's second is its latest, fresh's ended lately.
    assert dry.stdout.startswith("would delete 0 done rows, 0 attempts and 2 lead terms\n"), \
        dry.stdout
    assert terms(ledger_url) == before

    done = run_either("prune", "--older-than", "30d", env=once_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("deleted 0 done rows, 0 attempts and 2 lead terms\n"), \
        done.stdout
    assert terms(ledger_url) == sorted([("beat", beat[0]), ("beat", beat[2]), ("old", old[1]),
                                        ("fresh", fresh), ("fresh", later)])
    again = run_either("prune", "--older-than", "30d", env=once_env)
    assert again.stdout.startswith("deleted 0 done rows, 0 attempts and 0 lead terms\n")

    # The reports read what is left: history its terms, metrics the terms begun.
    history = json.loads(run_either("history", "--lead", "old", "--json", env=once_env).stdout)
    assert [e["term"] for e in history] == [old[1]]
    metrics = run_either("metrics", env=once_env).stdout
    assert 'once_lead_changes_total{lead="old"} 1' in metrics, metrics
    assert 'once_lead_changes_total{lead="beat"} 2' in metrics, metrics

    # A name retired and used again goes on from its latest term, which prune kept.
    with leases_of(ledger_url) as leases:
        assert leases.retire("old")
        assert run_either("prune", "--older-than", "1s", env=once_env).returncode == 0
        assert ("old", old[1]) in terms(ledger_url)
        term, _ = leases.acquire("old", "h8", "h8", 60.0)
    assert term > old[1]


def test_prune_of_a_ledger_without_the_lease_tables(once_env: dict[str, str],
                                                    ledger_url: str) -> None:
    """A ledger of schema 5 where no `once lead` has run (the tables dropped here): prune
    deletes what it did and counts no term."""
    args = ["catchup", "--job", "p", "--every", "day", "--since", "2026-01-01", "--until",
            "2026-01-03", "-q", "--", "true"]
    assert run_either(*args, env=once_env).returncode == 0
    for table in ("once_lead_candidates", "once_lead_terms", "once_leases"):
        query(ledger_url, f"DROP TABLE {table}")
    query(ledger_url, "UPDATE once_runs SET finished_at = period_start")
    query(ledger_url, f"UPDATE once_attempts SET finished_at = {LONG_AGO}")
    dry = run_either("prune", "--older-than", "30d", "--dry-run", env=once_env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would delete 2 done rows, 3 attempts and 0 lead terms\n"), \
        dry.stdout
    done = run_either("prune", "--older-than", "30d", env=once_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("deleted 2 done rows, 3 attempts and 0 lead terms\n")
    assert query(ledger_url, "SELECT count(*) FROM once_runs") == [(1,)]
