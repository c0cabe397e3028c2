"""The lead names of `once lead` in the reports, on every backend: `once status` (its table,
`--leads --json`), `once history --lead` (one term of each ending), `once metrics` (parsed by
prometheus_client), `once check` (CRITICAL `leaderless` past the lease plus --grace, OK while
held, not after --retire) and once serve (`/api/leads`, the page, `/metrics`).

A leader and a candidate are real `once lead` processes; the terms whose endings a test needs
(released, lost, expired) are made with the lease statements themselves (once.ledger.leases),
on a lease short enough to run out in the test. Times are the database's throughout.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest

from helpers import ONCE, run_either, run_here, wait_for
from serving import ServedHere

pytestmark = pytest.mark.tables_made  # but where a test says otherwise

LEASE = 3.0


def once(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_either(*args, env=env)  # type: ignore[no-any-return]


def leads_json(env: dict[str, str], *names: str) -> dict[str, dict[str, Any]]:
    result = once(env, "status", "--leads", "--json", *names)
    assert result.returncode == 0, result.stderr
    return {x["lead"]: x for x in json.loads(result.stdout)}


def metric_samples(text: str) -> dict[tuple[str, str], float]:
    """(metric, lead) -> value of the once_lead_ samples, read by Prometheus' own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation and family.type in ("gauge", "counter"), family.name
        for sample in family.samples:
            if sample.name.startswith("once_lead_"):
                assert set(sample.labels) == {"lead"}, sample
                found[(sample.name, sample.labels["lead"])] = sample.value
    return found


@contextmanager
def leases_of(url: str) -> Iterator[Any]:
    """The lease statements on a ledger connection of their own."""
    from once.ledger import open_ledger, parse_url
    from once.ledger.leases import Leases

    with open_ledger(parse_url(url)) as ledger:
        yield Leases(ledger)


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """A read of the ledger's own rows (the test's view, beside once's)."""
    from once.ledger import parse_url
    from once.ledger.dialects import of

    target = parse_url(url)
    backend = of(target)
    conn = backend.report_connection(target)
    try:
        return [tuple(backend.from_db(v) if isinstance(v, (str, datetime)) and i in (1, 2)
                      else v for i, v in enumerate(r)) for r in backend.fetch(conn, sql, {})]
    finally:
        conn.close()


def start_lead(env: dict[str, str], name: str, owner: str) -> subprocess.Popen[str]:
    return subprocess.Popen([ONCE, "lead", "--name", name, "--lease", f"{LEASE:g}s",
                             "--owner", owner, "--", "sleep", "300"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_leader_and_a_candidate_in_status_metrics_check_and_serve(
        once_env: dict[str, str], ledger_url: str) -> None:
    assert once(once_env, "run", "--job", "nightly", "--every", "day", "--", "true"
                ).returncode == 0
    leader = start_lead(once_env, "scheduler", "pod-a")
    procs = [leader]
    try:
        wait_for(lambda: leads_json(once_env).get("scheduler", {}).get("held"),
                 what="pod-a leading")
        procs.append(start_lead(once_env, "scheduler", "pod-b"))
        lead = wait_for(lambda: (x := leads_json(once_env)["scheduler"])["candidates"] == 1
                        and x, what="pod-b standing as a candidate")
        assert lead["owner"] == "pod-a" and lead["held"] and lead["leaderless_s"] == 0
        assert lead["term"] >= 1 and lead["lease_s"] == LEASE
        since = datetime.fromisoformat(lead["leading_since"])
        renewed = datetime.fromisoformat(lead["renewed_at"])
        expires = datetime.fromisoformat(lead["expires_at"])
        assert since <= renewed < expires and since.utcoffset() is not None
        assert (expires - renewed).total_seconds() == pytest.approx(LEASE, abs=1.0)

        # once status: the jobs' table as before, the lead names' under it; --json the jobs.
        text = once(once_env, "status")
        assert text.returncode == 0, text.stderr
        jobs_part, leads_part, caption = text.stdout.rstrip("\n").split("\n\n")
        assert jobs_part.splitlines()[0].split()[0] == "JOB" and "nightly" in jobs_part
        header, row = leads_part.splitlines()
        assert header.split() == ["LEAD", "LEADER", "TERM", "SINCE", "(UTC)", "RENEWED",
                                  "LEASE", "CANDIDATES"]
        cells = row.split()
        assert cells[:3] == ["scheduler", "pod-a", str(lead["term"])] and cells[-2:] == [
            "3s", "1"]
        assert caption.startswith("ledger: ")
        jobs = json.loads(once(once_env, "status", "--json").stdout)
        assert [j["job"] for j in jobs] == ["nightly"]
        assert once(once_env, "status", "scheduler", "nightly").returncode == 0

        # once check: held is OK, and the OK line counts it.
        check = once(once_env, "check")
        assert check.returncode == 0, check.stdout
        assert "1 lead name: none leaderless" in check.stdout

        found = metric_samples(once(once_env, "metrics").stdout)
        assert found[("once_lead_term", "scheduler")] == lead["term"]
        assert found[("once_lead_changes_total", "scheduler")] == 1
        assert found[("once_lead_leaderless_seconds", "scheduler")] == 0
        assert found[("once_lead_candidates", "scheduler")] == 1
        assert found[("once_lead_lease_seconds", "scheduler")] == LEASE

        served = ServedHere(env=once_env)
        try:
            api = served.get("/api/leads")
            assert api.status == 200 and api.type.startswith("application/json")
            [entry] = json.loads(api.text)
            assert {k: entry[k] for k in ("lead", "owner", "term", "held", "candidates")} == {
                "lead": "scheduler", "owner": "pod-a", "term": lead["term"], "held": True,
                "candidates": 1}
            assert [j["job"] for j in json.loads(served.get("/api/status").text)] == [
                "nightly"]
            page = served.get("/").text
            assert 'id="leads"' in page and "scheduler" in page and "pod-a" in page
            scraped = metric_samples(served.get("/metrics").text)
            assert scraped[("once_lead_candidates", "scheduler")] == 1
        finally:
            served.stop()

        # The leader stopped: the candidate takes over, a second term, a change.
        stop([leader])
        taken = wait_for(lambda: (x := leads_json(once_env)["scheduler"])["owner"] == "pod-b"
                         and x, what="pod-b leading")
        assert taken["term"] > lead["term"]
        found = metric_samples(once(once_env, "metrics").stdout)
        assert found[("once_lead_changes_total", "scheduler")] == 2
        assert found[("once_lead_candidates", "scheduler")] == 0
    finally:
        stop(procs)


def test_history_lists_each_term_and_how_it_ended(once_env: dict[str, str],
                                                  ledger_url: str) -> None:
    name = "beat"
    with leases_of(ledger_url) as leases:
        first, _ = leases.acquire(name, "h1", "alpha", 30.0)
        assert leases.release(name, "h1", first)  # released
        second, _ = leases.acquire(name, "h2", "beta", 1.0)  # left to run out
        leases.hand_over()  # beta is gone, and on SQLite the name's OS lock with it
        wait_for(lambda: leases.peek(name).free, what="beta's lease running out")
        third, _ = leases.acquire(name, "h3", "gamma", 30.0)  # beta's term: expired
        assert leases.release(name, "h3", third, "lost")  # stepped down: lost
        fourth, _ = leases.acquire(name, "h4", "delta", 60.0)  # leads
    assert first < second < third < fourth

    entries = json.loads(once(once_env, "history", "--lead", name, "--json").stdout)
    assert [(e["term"], e["owner"], e["ended"]) for e in entries] == [
        (fourth, "delta", None), (third, "gamma", "lost"), (second, "beta", "expired"),
        (first, "alpha", "released")]
    assert entries[0]["ended_at"] is None and entries[0]["held_s"] >= 0
    assert all(e["ended_at"] and e["held_s"] is not None for e in entries[1:])
    assert entries[2]["lease_s"] == 1.0
    # beta's term ended when its lease ran out, before gamma's began
    assert entries[2]["ended_at"] <= entries[1]["started_at"]

    text = once(once_env, "history", name)  # no job has the name: its terms
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split()[:2] == ["TERM", "OWNER"]
    assert [(line.split()[0], line.split()[1], line.split()[-1]) for line in lines[1:]] == [
        (str(fourth), "delta", "leading"), (str(third), "gamma", "lost"),
        (str(second), "beta", "expired"), (str(first), "alpha", "released")]
    assert [e["term"] for e in json.loads(
        once(once_env, "history", name, "--json", "--limit", "2").stdout)] == [fourth, third]

    # A job of the same name: history shows the job; --lead the terms.
    assert once(once_env, "run", "--job", name, "--every", "day", "--", "true").returncode == 0
    job = json.loads(once(once_env, "history", name, "--json").stdout)
    assert [e["job"] for e in job] == [name]
    assert len(json.loads(once(once_env, "history", name, "--lead", "--json").stdout)) == 4
    unknown = once(once_env, "history", "--lead", "nobody")
    assert unknown.returncode == 2 and "unknown lead name 'nobody'" in unknown.stderr

    # The metrics: four terms begun; the time without a leader is the gaps between them, by
    # the database's clock (delta holds it now, so the sum is fixed).
    terms = rows(ledger_url, "SELECT term, started_at, ended_at FROM once_lead_terms "
                             "ORDER BY term")
    gaps = sum(max(0.0, (later[1] - earlier[2]).total_seconds())
               for earlier, later in itertools.pairwise(terms))
    found = metric_samples(once(once_env, "metrics").stdout)
    assert found[("once_lead_changes_total", name)] == 4
    assert found[("once_lead_leaderless_seconds", name)] == 0
    assert gaps > 0
    assert found[("once_lead_leaderless_time_seconds_total", name)] == pytest.approx(
        gaps, abs=0.05)


def test_check_reports_a_name_without_a_leader_past_its_lease(
        once_env: dict[str, str], ledger_url: str) -> None:
    with leases_of(ledger_url) as leases:
        leases.acquire("held", "h1", "pod-1", 60.0)
        term, _ = leases.acquire("fresh", "h2", "pod-2", 60.0)
        leases.release("fresh", "h2", term)  # leaderless, well within its lease
        term, _ = leases.acquire("gone", "h3", "pod-3", 1.0)
        leases.release("gone", "h3", term)
        leases.acquire("stuck", "h4", "pod-4", 1.0)  # never renewed: expires
    wait_for(lambda: all(leads_json(once_env)[n]["leaderless_s"] > 1.2
                         for n in ("gone", "stuck")), what="two names leaderless past 1 s")

    result = once(once_env, "check")
    assert result.returncode == 2, result.stdout
    lines = result.stdout.splitlines()
    assert [line.split()[:4] for line in lines] == [
        ["CRITICAL", "gone", "-", "leaderless"], ["CRITICAL", "stuck", "-", "leaderless"]]
    assert "lease 1s; term" in lines[0] and "released" in lines[0]
    assert "expired (its holder pod-4 stopped renewing)" in lines[1]
    found = json.loads(once(once_env, "check", "--json").stdout)
    assert [(f["job"], f["lead"], f["problem"], f["status"]) for f in found] == [
        (None, "gone", "leaderless", 2), (None, "stuck", "leaderless", 2)]
    assert all(f["leaderless_s"] > 1.0 and f["lease_s"] == 1.0 for f in found)

    graced = once(once_env, "check", "--grace", "1h")
    assert graced.returncode == 0, graced.stdout
    assert graced.stdout.startswith("OK 0 jobs: every due period done; 4 lead names")
    named = once(once_env, "check", "held", "fresh")  # lead names named: judged, known
    assert named.returncode == 0, named.stdout

    for name in ("gone", "stuck"):
        assert run_here("lead", "--name", name, "--retire", env=once_env).returncode == 0
    result = once(once_env, "check")
    assert result.returncode == 0, result.stdout
    assert "2 lead names" in result.stdout
    assert set(leads_json(once_env)) == {"held", "fresh"}
    # a retired name keeps its terms in the history
    assert json.loads(once(once_env, "history", "--lead", "gone", "--json").stdout)[0][
        "ended"] == "released"


@pytest.mark.tables_made(False)  # its ledger is made as the test says
def test_a_ledger_without_the_lease_tables_reports_no_lead(
        once_env: dict[str, str], ledger_url: str) -> None:
    """A ledger made before `once lead` (its tables dropped here): the reports say what they
    said, no error (and on PostgreSQL none in the server's log: the catalog is asked)."""
    assert once(once_env, "run", "--job", "nightly", "--every", "day", "--", "true"
                ).returncode == 0
    _drop_lease_tables(ledger_url)
    status = once(once_env, "status")
    assert status.returncode == 0 and "LEAD" not in status.stdout, status.stderr
    check = once(once_env, "check")
    assert check.returncode == 0 and check.stdout.startswith("OK 1 job: every due period done (")
    assert "once_lead_term" in once(once_env, "metrics").stdout  # HELP and TYPE, no sample
    assert not [k for k in metric_samples(once(once_env, "metrics").stdout)]
    assert json.loads(once(once_env, "status", "--leads", "--json").stdout) == []
    assert once(once_env, "history", "nobody").returncode == 2
    served = ServedHere(env=once_env)
    try:
        assert json.loads(served.get("/api/leads").text) == []
        assert served.get("/").status == 200
        assert served.get("/metrics").status == 200
    finally:
        served.stop()


def _drop_lease_tables(url: str) -> None:
    from once.ledger import parse_url
    from once.ledger.dialects import of

    target = parse_url(url)
    backend = of(target)
    conn = backend.connect(target, 10)
    try:
        cur = conn.cursor()
        for table in ("once_lead_candidates", "once_lead_terms", "once_leases"):
            cur.execute(f"DROP TABLE {table}")
        conn.commit()
    finally:
        conn.close()
