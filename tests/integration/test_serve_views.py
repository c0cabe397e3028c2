"""`once serve`'s views for an operator (issue 26, item 8): what a failed command said (its
last line on the pages, its whole output at /logs/NAME), and the overview's filter by state
and name, its orders and pages for a fleet of hundreds of jobs.

Real HTTP requests to once serve's server in this process (serving.ServedHere) on ledgers
built by real `once run` and `once catchup` processes
(and, for hundreds of jobs, by the Python API); on every backend where the ledger's
statements matter, on SQLite alone (ids end in [sqlite]) where only the pages do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from html import escape, unescape
from urllib.parse import quote

import pytest

import once as api
from helpers import run_either
from once.ledger import parse_url
from once.serve.data import read_fleet
from once.serve.overview import Listing
from serving import ServedHere

pytestmark = pytest.mark.tables_made  # none is about a first use

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
HOSTILE_OUTPUT = "step 1\n<script>alert(1)</script>\x1b[2J\nerror: <b>disk</b> full\n"


def day(n: int) -> str:
    return (datetime.now(UTC).date() + timedelta(days=n)).isoformat()


def once(env: dict[str, str], *args: str) -> int:
    result = run_either(*args, env=env, timeout=120)
    assert result.returncode not in (2, 69, 70, 75), result.stderr
    return result.returncode


def job_order(page: str) -> list[str]:
    return re.findall(r'<tr class="\w+"><td><a href="/job/([^"]+)"', page)


def test_a_failure_says_what_it_said_on_the_pages_and_links_to_its_output(
        once_env: dict[str, str], serve: Callable[..., ServedHere]) -> None:
    env = once_env
    assert once(env, "run", "--job", "nightly", "--every", "day", "--", "sh", "-c",
                f"printf '{HOSTILE_OUTPUT}'; exit 3") == 3
    assert once(env, "catchup", "--job", "nightly", "--every", "day", "--since", day(-2),
                "--until", day(-1), "--", "echo", "fine") == 0
    server = serve(env=env)
    overview = server.get("/").text
    href = f"/logs/nightly?period={day(0)}&amp;attempt=1"
    said = 'title="error: &lt;b&gt;disk&lt;/b&gt; full: the whole output">error: &lt;b&gt;disk'
    assert f'<a class="line" href="{href}" {said}' in overview  # linked to its output
    assert "<b>disk" not in overview

    job = server.get("/job/nightly").text
    assert job.count(">output</a>") == 2  # every finished attempt's, a failure's by its line
    assert job.count(f'<a class="line" href="{href}" {said}') == 1

    page = server.get(unescape(href))
    assert page.status == 200 and page.type == "text/html; charset=utf-8"
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    text = page.text
    assert f"==&gt; nightly {day(0)} attempt 1: failed (exit 3)" in text
    body = text.split('<pre class="output">')[1].split("</pre>")[0]
    # escaped as once logs escapes it (the ESC), then as HTML (the tags)
    assert body == escape("step 1\n<script>alert(1)</script>\\u001b[2J\nerror: <b>disk</b> full\n")
    assert "<script>alert" not in text
    assert 'data-refresh="0"' in text  # a finished attempt's output does not change

    # the period as once logs takes it: an instant, with Z; no attempt: the latest
    same = server.get(f"/logs/nightly?period={quote(day(0) + 'T10:00Z', safe='')}")
    assert same.status == 200 and body in same.text
    latest = server.get("/logs/nightly").text
    assert "attempt 1: done (exit 0)" in latest and ">fine\n<" in latest
    for path, why in (("/logs/nobody", "no job &#x27;nobody&#x27;"),
                      (f"/logs/nightly?period={day(-9)}", f"no attempt at period {day(-9)}"),
                      (f"/logs/nightly?period={day(0)}&attempt=2", "no attempt 2 at period"),
                      ("/logs/nightly?attempt=x", "no such attempt")):
        missing = server.get(path)
        assert missing.status == 404 and why in missing.text, (path, missing.text)
    assert server.get("/logs/nightly", method="POST").status == 405
    head = server.get(unescape(href), method="HEAD")
    assert head.status == 200 and head.body == b""


def test_a_long_output_is_shown_by_its_end(once_env: dict[str, str],
                                           serve: Callable[..., ServedHere]) -> None:
    script = ("i=0; while [ $i -lt 3000 ]; do echo \"line $i of a long log: $(printf '%040d' 0)\";"
              " i=$((i+1)); done; echo last")
    assert once(once_env, "run", "--job", "chatty", "--every", "day", "--output-tail", "1MiB",
                "--", "sh", "-c", script) == 0
    server = serve(env=once_env)
    text = server.get("/logs/chatty").text
    body = unescape(text.split('<pre class="output">')[1].split("</pre>")[0])
    assert len(body) == 64 * 1024 and body.endswith("line 2999 of a long log: " + "0" * 40
                                                    + "\nlast\n")
    assert re.search(r"The last 64 KiB of 19\d KiB stored", text) and "once logs chatty" in text


@sqlite_only
def test_the_overview_filters_orders_and_pages_a_large_fleet(
        once_env: dict[str, str], ledger_url: str, serve: Callable[..., ServedHere]) -> None:
    for i in range(230):  # 230 jobs whose current day is done
        with api.claim(f"job-{i:03d}", every="day", db=ledger_url):
            pass
    assert once(once_env, "run", "--job", "sync-broken", "--every", "day", "--max-attempts",
                "1", "--", "false") == 1  # failed out: CRITICAL
    assert once(once_env, "run", "--job", "sync-fine", "--every", "hour", "--", "true") == 0
    server = serve(env=once_env)

    first = server.get("/").text
    order = job_order(first)
    assert len(order) == 100 and order[0] == "sync-broken"  # problems first, then by name
    assert order[1:4] == ["job-000", "job-001", "job-002"]
    assert "1-100 of 232 jobs" in first and "page 1 of 3" in first
    assert '<a href="/?page=2">next »</a>' in first and "previous" not in first
    # the timelines read are the page's jobs' alone
    fleet = read_fleet(parse_url(ledger_url), None, 10.0, pick=Listing().pick)
    assert len(fleet.states) == 232 and sorted(fleet.strips) == sorted(order)
    assert sorted(read_fleet(parse_url(ledger_url), None, 10.0).strips) == sorted(
        s.name for s in fleet.states)

    last = server.get("/?page=3").text
    assert job_order(last) == [f"job-{i:03d}" for i in range(199, 230)] + ["sync-fine"]
    assert "201-232 of 232" in last and '<a href="/?page=2">« previous</a>' in last
    assert job_order(server.get("/?page=99").text) == job_order(last)  # past the end: the last

    found = server.get("/?name=SYNC").text  # a part of the name, any case
    assert job_order(found) == ["sync-broken", "sync-fine"] and "2 jobs (of 232)" in found
    assert 'value="SYNC"' in found and "clear</a>" in found
    assert job_order(server.get("/?state=failed").text) == ["sync-broken"]
    assert job_order(server.get("/?state=problems").text) == ["sync-broken"]
    assert len(job_order(server.get("/?state=ok").text)) == 100
    assert job_order(server.get("/?state=ok&name=sync").text) == ["sync-fine"]
    by_next = job_order(server.get("/?sort=next&name=sync").text)
    nexts = {o["job"]: datetime.fromisoformat(o["next_at"])
             for o in json.loads(server.get("/api/status").body) if "sync" in o["job"]}
    assert by_next == sorted(nexts, key=lambda job: (nexts[job], job))
    assert job_order(server.get("/?sort=name&name=sync").text) == ["sync-broken", "sync-fine"]
    nothing = server.get("/?name=nope").text
    assert "No job matches." in nothing and "<tbody>" not in nothing
    # what the page cannot read is its default, never an error
    for query in ("state=evil&sort=%3Cb%3E&page=-1", "page=abc", "page=99999999999",
                  "name=" + "x" * 5000):
        answer = server.get("/?" + query)
        assert answer.status == 200 and "<b>" not in answer.text, query
    # the form submits to the page itself, and the page allows it
    assert 'form class="filter" method="get" action="/"' in first
    assert "form-action 'self'" in server.get("/").headers["Content-Security-Policy"]


def test_a_page_of_a_fleet_reads_the_detail_of_its_own_jobs_and_the_same_verdicts(
        once_env: dict[str, str], ledger_url: str) -> None:
    """Issue 28 item 7: / surveys every job without detail (counts, not keys), completes the
    page's jobs alone, and reads their strips at once: what it shows of them is what a full
    survey finds, and the verdicts of the others are the same."""
    from once.ledger.fleet import Snapshot
    from once.report import complete, survey, timeline_cells, timelines
    from once.serve.pages import severity

    env = once_env
    assert once(env, "catchup", "--job", "gappy", "--every", "day", "--since", day(-6),
                "--until", day(-5), "--", "true") == 0
    assert once(env, "run", "--job", "gappy", "--every", "day", "--", "true") == 0  # 4 missing
    assert once(env, "run", "--job", "broken", "--every", "hour", "--max-attempts", "1", "--",
                "sh", "-c", "echo no disk; exit 4") == 4
    assert once(env, "catchup", "--job", "crony", "--cron", "0 3 * * *", "--since", day(-3),
                "--until", day(-2), "--", "true") == 0
    for i in range(5):
        assert once(env, "run", "--job", f"fine-{i}", "--every", "day", "--", "true") == 0
    target = parse_url(ledger_url)
    with Snapshot.open(target) as snap:
        now = snap.db_now()
        full = survey(snap, snap.job_rows(None, None), now)
        brief = survey(snap, snap.job_rows(None, None), now, detail=False)
        assert [severity(s) for s in brief] == [severity(s) for s in full]
        gappy = next(s for s in brief if s.name == "gappy")
        assert gappy.no_row == 4 and gappy.no_row_listed == [] and gappy.last_done is None
        crony = next(s for s in brief if s.name == "crony")
        assert crony.expected is None and crony.detailed  # its gaps are counted by walking
        complete(snap, brief)
        for b, f in zip(brief, full, strict=True):  # every field, missing keys and lines too
            assert {k: v for k, v in vars(b).items() if k != "sched"} == {
                k: v for k, v in vars(f).items() if k != "sched"}, b.name
        cells = timelines(snap, full, 10)
        assert cells == {s.name: timeline_cells(snap, s, 10) for s in full}
        assert [state for _, state in cells["gappy"]][-6:] == [
            "done", "missing", "missing", "missing", "missing", "done"]
    fleet = read_fleet(target, None, 10.0, pick=lambda states: states[:2])
    assert [s.name for s in fleet.states if s.detailed] == ["broken", "crony"]
    assert sorted(fleet.strips) == ["broken", "crony"]


def test_api_status_answers_a_page_of_the_jobs_that_match(
        once_env: dict[str, str], ledger_url: str, serve: Callable[..., ServedHere]) -> None:
    """Issue 28 item 7: /api/status without a query is every job in full, as before; with
    the dashboard's filter and a page (?state=&name=&limit=&offset=) the jobs that match, by
    name, each as the full list has it, with X-Total-Count and a Link to the next page."""
    for i in range(4):
        with api.claim(f"fine-{i}", every="day", db=ledger_url):
            pass
    assert once(once_env, "run", "--job", "broken", "--every", "day", "--max-attempts", "1",
                "--", "false") == 1
    server = serve(env=once_env)
    whole = server.get("/api/status")
    everyone = json.loads(whole.body)
    assert [o["job"] for o in everyone] == ["broken", *(f"fine-{i}" for i in range(4))]
    assert whole.headers["X-Total-Count"] == "5" and "Link" not in whole.headers

    def asked(query: str) -> tuple[list[str], str, str | None]:
        answer = server.get(f"/api/status?{query}")
        assert answer.status == 200 and answer.type == "application/json", answer.text
        objects = json.loads(answer.body)
        assert objects == [o for o in everyone if o["job"] in {p["job"] for p in objects}]
        return ([o["job"] for o in objects], answer.headers["X-Total-Count"],
                answer.headers.get("Link"))

    assert asked("limit=2") == (["broken", "fine-0"], "5",
                                '</api/status?limit=2&offset=2>; rel="next"')
    assert asked("limit=2&offset=4") == (["fine-3"], "5", None)
    assert asked("offset=9") == ([], "5", None)
    assert asked("state=failed") == (["broken"], "1", None)
    assert asked("state=ok&name=FINE&limit=3&offset=1") == (
        ["fine-1", "fine-2", "fine-3"], "4", None)
    assert asked("state=problems&limit=1")[:2] == (["broken"], "1")
    assert asked("name=fine&limit=1") == (["fine-0"], "4",
                                          '</api/status?name=fine&limit=1&offset=1>; rel="next"')
    for query in ("page=2", "limit=0", "limit=abc", "offset=-1", "state=evil"):
        answer = server.get(f"/api/status?{query}")
        assert answer.status == 400 and answer.type == "application/json", query
        assert json.loads(answer.body)["error"].split()[0] in ("unknown", "bad"), query


def test_the_gap_search_of_a_page_reads_the_same_with_its_rows_read_at_once(
        once_env: dict[str, str], ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gaps of small jobs are searched in done rows read at once (survey.PREFETCH): what
    they find is what counting each stretch in the ledger finds, with shards and a gap at
    the end too."""
    from once.ledger.fleet import Snapshot
    from once.report import survey

    surveying = __import__("once.report.survey", fromlist=["PREFETCH"])
    env = once_env
    for job, extra in (("gappy", ()), ("sharded", ("--shards", "3"))):
        assert once(env, "catchup", "--job", job, "--every", "day", *extra, "--since",
                    day(-9), "--until", day(-8), "--", "true") == 0
        assert once(env, "catchup", "--job", job, "--every", "day", *extra, "--since",
                    day(-5), "--until", day(-5), "--", "true") == 0

    def found() -> list[tuple[str, int, object, object]]:
        with Snapshot.open(parse_url(ledger_url)) as snap:
            states = survey(snap, snap.job_rows(None, None), snap.db_now())
        return [(s.name, s.no_row, s.no_row_listed, s.no_row_last) for s in states]

    read_at_once = found()
    assert [(name, missing) for name, missing, *_ in read_at_once] == [("gappy", 6),
                                                                        ("sharded", 18)]
    assert [key for _, key in read_at_once[0][2]] == [day(n) for n in (-7, -6, -4, -3, -2, -1)]
    assert read_at_once[1][3] == (read_at_once[0][3][0], f"{day(-1)}#2")  # the last: its end
    monkeypatch.setattr(surveying, "PREFETCH", 0)
    assert found() == read_at_once
