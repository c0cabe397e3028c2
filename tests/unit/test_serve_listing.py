"""once.serve.overview.Listing: the overview's filter, order and pages, read from a query
string; the jobs it shows, without a database."""

from __future__ import annotations

from report_states import day_job, row

from once.serve.overview import PAGE, Listing


def test_a_query_string_is_read_and_what_it_cannot_read_is_the_default() -> None:
    assert Listing.parse("") == Listing()
    assert Listing.parse("state=failed&name=+Sync+&sort=next&page=3") == Listing(
        "failed", "Sync", "next", 3)
    for query in ("state=%3Cscript%3E", "sort=evil", "page=-2", "page=0", "page=1e3",
                  "page=%D9%A3", "page=99999999999"):  # an Arabic-Indic 3 is no page number
        parsed = Listing.parse(query)
        assert (parsed.state, parsed.sort, parsed.page) == ("all", "problems", 1), query
    assert len(Listing.parse("name=" + "x" * 900).name) == 200


def test_its_address_keeps_what_differs_from_the_default() -> None:
    assert Listing().href() == "/"
    assert Listing("failed", "a b&c").href(page=2) == "/?state=failed&name=a+b%26c&page=2"
    assert Listing.parse(Listing("ok", "x", "name", 4).href()[2:]) == Listing("ok", "x", "name", 4)


def test_it_filters_by_state_and_name_and_pages_problems_first() -> None:
    jobs = [day_job(f"job-{i:03d}") for i in range(PAGE + 20)]
    broken = day_job("Zeta-broken", max_attempts=1)
    broken.open_rows = [row("2026-11-30", "failed", job="Zeta-broken", exit_code=1)]
    running = day_job("sync")
    running.open_rows = [row("2026-12-01", "running", job="sync")]
    fleet = [*jobs, broken, running]
    first = Listing().pick(fleet)
    assert len(first) == PAGE and first[0] is broken  # CRITICAL before the OK ones
    assert [s.name for s in Listing(page=2).pick(fleet)][-1] == "sync"
    assert Listing(page=7).pick(fleet) == Listing(page=2).pick(fleet)
    assert Listing(name="BROKEN").pick(fleet) == [broken]
    assert Listing("failed").pick(fleet) == [broken]
    assert Listing("problems").pick(fleet) == [broken]
    assert Listing("running").pick(fleet) == [running]
    assert Listing("missing").pick(fleet) == [] and Listing("stale").pick(fleet) == []
    assert len(Listing("ok").ordered(fleet)) == PAGE + 21
    assert Listing(sort="name").pick(fleet)[0].name == "Zeta-broken"  # by code point
    assert Listing().pages(0) == 1 and Listing().pages(PAGE) == 1 and Listing().pages(PAGE + 1) == 2
