"""`once serve` in a real browser: headless Chromium (Debian's `chromium`) loads `/` and
`/job/NAME` of a fleet with every kind of trouble, lets the pages refresh themselves, and
must log nothing to its console (no script error, no Content-Security-Policy violation, no
failed load). At a phone's, a laptop's and a desktop's width (390, 1366, 1920 px) no element
of a page reaches past the screen's edge or scrolls its content sideways, no period key
wraps, the ledger's URL breaks only after a separator or a hyphen, and a daily job's
timeline is a row a month (issue 36). Screenshots are kept in ONCE_TEST_ARTIFACTS (default:
test-artifacts/).

Without chromium the tests skip, unless ONCE_TEST_BROWSER=required (CI: .ci/run installs
chromium and sets it), where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import quote
from zoneinfo import ZoneInfo

import pytest

from devtools import Browser
from helpers import ARTIFACTS, run_once, wait_for
from procs import start_once
from serving import Served

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<script>console.error('escaped?')</script>"
OWNER = "batch-worker-eu-west-1c-7f9d8b6c4-x2kqp:48213"  # a pod's name: long, as owners are


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("ONCE_TEST_BROWSER") == "required":
        pytest.fail("ONCE_TEST_BROWSER=required, but there is no chromium: "
                    "apt-get install chromium")
    pytest.skip("no chromium (Debian: apt-get install chromium; CI requires it)")


def day(n: int) -> str:
    return (datetime.now(UTC).date() + timedelta(days=n)).isoformat()


def hour(n: int) -> str:
    at = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=n)
    return at.strftime("%Y-%m-%dT%H:00")


def once(env: dict[str, str], *args: str) -> None:
    result = run_once(*args, env=env, timeout=120)
    assert result.returncode not in (2, 69, 70, 75), result.stderr


def build_fleet(env: dict[str, str], tmp_path: Path,
                hostile: bool = True) -> subprocess.Popen[str]:
    """A fleet with done, missing, failed, failed-out, running and stale periods; returns the
    `once run` left running (the caller stops it)."""
    once(env, "catchup", "--job", "nightly-invoices", "--every", "day", "--tz",
         "Europe/Berlin", "--since", day(-40), "--until", day(-4), "--", "true")
    once(env, "catchup", "--job", "nightly-invoices", "--every", "day", "--tz",
         "Europe/Berlin", "--since", day(-1), "--until", day(-1), "--", "true")
    once(env, "catchup", "--job", "hourly-sync", "--every", "hour", "--since", hour(-40),
         "--until", hour(-1), "--", "true")
    once(env, "catchup", "--job", "weekly-report", "--every", "week", "--since", day(-60),
         "--until", day(-8), "--", "true")
    once(env, "run", "--job", "weekly-report", "--every", "week", "--max-attempts", "1", "--",
         "sh", "-c", "echo 'loading 1,204 rows'; echo 'error: relation \"orders_2026\" does "
         "not exist (SQLSTATE 42P01) while building the weekly report'; exit 1")
    once(env, "catchup", "--job", "backup", "--every", "day", "--since", day(-20), "--until",
         day(-1), "--", "true")
    once(env, "catchup", "--job", "report-lag", "--every", "hour", "--lag", "1", "--since",
         hour(-30), "--until", hour(-3), "--", "true")  # its NEXT is a period due later
    once(env, "lead", "--name", "celery-beat", "--", "true")  # a lead name, none leading
    stuck = start_once("run", "--job", "backup", "--every", "day", "--stale-after", "1s", "--",
                       "sh", "-c", f"touch {tmp_path}/stuck; exec sleep 60", env=env)
    wait_for(lambda: (tmp_path / "stuck").exists(), what="the backup's claim")
    stuck.kill()  # its owner dies mid-run: the row goes stale
    stuck.wait()
    if hostile:
        once(env, "run", "--job", HOSTILE, "--every", "day", "--", "true")
    running = start_once("run", "--job", "hourly-sync", "--every", "hour", "--", "sh", "-c",
                         f"touch {tmp_path}/running; exec sleep 120",
                         env={**env, "ONCE_OWNER": OWNER})
    wait_for(lambda: (tmp_path / "running").exists(), what="the running sync")
    return running


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """A SQLite ledger (the page is the same on every backend: tests/integration/test_serve)."""
    chromium()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["ONCE_DATABASE_URL"] = f"sqlite:///{tmp_path}/ledger.db"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    running = build_fleet(env, tmp_path)
    time.sleep(1.2)  # the backup's heartbeat is older than its --stale-after
    server = Served("--refresh", "1s", env=env)
    try:
        yield server
    finally:
        status, err = server.stop()
        running.terminate()
        running.communicate(timeout=60)
    assert status == 0, err


def browse(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on url, JavaScript running for 4 s of its virtual time."""
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp_path}/chromium",
         "--enable-logging=stderr", "--v=0", "--window-size=1400,900",
         "--virtual-time-budget=4000", *args, url],
        capture_output=True, text=True, timeout=180)


def console(stderr: str) -> list[str]:
    """What the page logged to its console (Chromium prints each as a CONSOLE line)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.parametrize("page", ["overview", "job", "hostile-job"])
def test_pages_load_in_chromium_without_console_errors(served: Served, tmp_path: Path,
                                                       page: str) -> None:
    path = {"overview": "/", "job": "/job/nightly-invoices",
            "hostile-job": "/job/" + quote(HOSTILE, safe="")}[page]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"serve-{page}.png"
    shot.unlink(missing_ok=True)
    result = browse(served.url + path, tmp_path, f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert console(result.stderr) == [], console(result.stderr)
    assert shot.stat().st_size > 10_000


def test_the_page_refreshes_itself_in_place(served: Served, tmp_path: Path) -> None:
    result = browse(served.url + "/", tmp_path, "--dump-dom")
    assert result.returncode == 0, result.stderr[-3000:]
    assert console(result.stderr) == [], console(result.stderr)
    dom = result.stdout
    # After the refreshes (every second of the four), the body is still the whole page.
    for job in ("nightly-invoices", "hourly-sync", "weekly-report", "backup"):
        assert f'href="/job/{job}"' in dom, job
    assert dom.count("<tbody>") == 2 and "STALE" in dom  # the jobs' and the lead names'
    assert dom.count('<table class="cards jobs">') == 1
    assert '<div id="offline" class="banner" hidden="">' in dom


# The widths the pages must fit without scrolling sideways: a phone, a laptop, a desktop.
VIEWPORTS = {"phone": (390, True), "laptop": (1366, False), "desktop": (1920, False)}
PAGES = (("overview", "/"), ("job", "/job/weekly-report"), ("daily", "/job/nightly-invoices"),
         ("hourly", "/job/hourly-sync"), ("filtered", "/?state=problems&sort=name"))

# Every element past the screen's edge, and every element that hides its content by
# scrolling it sideways (a cut timeline), but for the one cut on purpose: a last line cut
# short with an ellipsis (its whole text its title, linked to the whole output).
OVERFLOW = """(() => {
  const out = [];
  const name = e => e.tagName.toLowerCase() + (e.className ? '.' + e.className : '') + ' '
    + JSON.stringify((e.textContent || '').trim().slice(0, 40));
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (!r.width && !r.height) continue;
    if (r.right > innerWidth + 0.5 || r.left < -0.5) out.push(name(e) + ' to ' + r.right);
    if (getComputedStyle(e).overflowX !== 'visible' && !e.matches('.line')
        && e.scrollWidth > e.clientWidth + 1) out.push(name(e) + ' scrolls sideways');
  }
  return out;
})()"""

# The period keys on the page broken across lines: a clock key (2026-12-05T22:00+01:00), or
# the overview's form of one (2026-12-05 22:00), wherever its characters are in the DOM.
WRAPPED_KEYS = r"""(() => {
  const nodes = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let text = '', node;
  while ((node = walker.nextNode())) { nodes.push([node, text.length]); text += node.data; }
  const at = i => { let k = nodes.length - 1; while (nodes[k][1] > i) k--;
                    return [nodes[k][0], i - nodes[k][1]]; };
  const out = [];
  const key = /\d{4}-\d\d-\d\d(T\d\d:\d\d[+-]\d\d:\d\d| \d\d:\d\d(?![:\d]))/g;
  for (const m of text.matchAll(key)) {
    const range = document.createRange(), [end, offset] = at(m.index + m[0].length - 1);
    range.setStart(...at(m.index)); range.setEnd(end, offset + 1);
    const tops = [...range.getClientRects()].filter(r => r.width).map(r => r.top);
    if (Math.max(...tops) - Math.min(...tops) > 8) out.push(m[0]);  // another line
  }
  return out;
})()"""

# The characters before each line break inside the ledger's URL in the page's header: a
# separator (once.serve.pages.url_html) or a hyphen (where a browser breaks any text).
URL_BREAKS = """(() => {
  const code = document.querySelector('.sub code'), range = document.createRange();
  const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
  const before = []; let top = null, last = '', node;
  while ((node = walker.nextNode())) {
    for (let i = 0; i < node.length; i++) {
      range.setStart(node, i); range.setEnd(node, i + 1);
      const at = range.getBoundingClientRect().top;
      if (top !== null && at > top + 2) before.push(last);
      top = at; last = node.data[i];
    }
  }
  return before;
})()"""


@pytest.mark.parametrize("viewport", sorted(VIEWPORTS))
def test_the_pages_fit_the_screen_and_stack_into_cards_on_a_phone(
        served: Served, tmp_path: Path, viewport: str) -> None:
    width, phone = VIEWPORTS[viewport]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser = Browser(chromium(), tmp_path / "devtools")
    try:
        for page, path in PAGES:
            browser.open(served.url + path, width, mobile=phone)
            shot = ARTIFACTS / f"serve-{page}-{width}.png"
            browser.screenshot(shot)
            assert shot.stat().st_size > 10_000
            sideways = browser.evaluate("document.documentElement.scrollWidth - innerWidth")
            assert sideways <= 0, f"{path} at {width}px scrolls {sideways}px sideways"
            assert browser.evaluate(OVERFLOW) == [], (path, width)
            assert browser.evaluate(WRAPPED_KEYS) == [], (path, width)
            assert set(browser.evaluate(URL_BREAKS)) <= set("/:@.?&=-"), (path, width)
            rows = browser.evaluate("getComputedStyle(document.querySelector('tbody tr'))"
                                    ".display")
            assert rows == ("block" if phone else "table-row"), (path, rows)
        _the_pages_say(browser, served, width, phone)
    finally:
        browser.close()


def _the_pages_say(browser: Browser, served: Served, width: int, phone: bool) -> None:
    """What the fitted pages still say: keys whole where they are short, the lagging job's
    next period as a period, a daily job's timeline a row a month, the leads, the output."""
    browser.open(served.url + "/", width, mobile=phone)
    text = browser.evaluate("document.body.innerText")
    assert "relation" in text and OWNER in text.replace("\n", "") and "celery-beat" in text
    lagging = browser.evaluate("[...document.querySelectorAll('tr')].find(r => "
                               "r.textContent.includes('report-lag')).lastChild.innerText")
    assert lagging.startswith("period ") and "due in " in lagging, lagging
    titles = browser.evaluate("[...document.querySelectorAll('.key[title]')].map(e => e.title)")
    assert titles and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d[+-]\d\d:\d\d", t)
                          for t in titles), titles
    if width == 390:  # the tmp path's URL is wider than a phone: it breaks, at a separator
        assert browser.evaluate(URL_BREAKS), "the ledger's URL was expected to wrap"
    browser.open(served.url + "/job/nightly-invoices", width, mobile=phone)
    labels = browser.evaluate("[...document.querySelectorAll('.rows > span:nth-child(odd)')]"
                              ".map(e => e.textContent).filter(t => t)")
    berlin = datetime.now(ZoneInfo("Europe/Berlin")).date()  # the job's date now
    first = date.fromisoformat(day(-40))
    months = sorted({(first + timedelta(days=n)).isoformat()[:7]
                     for n in range((berlin - first).days + 1)})
    assert labels == months, labels  # a row a month, not a row a weekday
    link = _output_link(browser, served, width, phone)
    browser.open(link, width, mobile=phone)
    text = browser.evaluate("document.querySelector('pre.output').innerText")
    assert text.splitlines()[-1].startswith('error: relation "orders_2026"')
    browser.screenshot(ARTIFACTS / f"serve-output-{width}.png")
    assert browser.evaluate("document.documentElement.scrollWidth - innerWidth") <= 0
    assert browser.evaluate(OVERFLOW) == [], width


def _output_link(browser: Browser, served: Served, width: int, phone: bool) -> str:
    """The overview's link to what the weekly report's failure said."""
    browser.open(served.url + "/", width, mobile=phone)
    return str(browser.evaluate("[...document.querySelectorAll('a.line')].find(a => "
                                "a.href.includes('weekly')).href"))


# -- the docs site -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The docs site as `mkdocs build --strict` makes it, served over HTTP on loopback (its
    search loads its index by fetch, which a file:// page may not)."""
    import sys
    import threading
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    site = tmp_path_factory.mktemp("docs") / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "-d", str(site)], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


@pytest.mark.parametrize(("page", "path", "words"), [
    ("home", "/index.html", ("exactly once per period", "Getting started")),
    ("how-to", "/how-to/deploying.html", ("Kubernetes", "crontab")),
    ("reference", "/reference/commands.html", ("once run", "--stale-after")),
])
def test_the_docs_site_opens_in_chromium(docs_site: str, tmp_path: Path, page: str, path: str,
                                         words: tuple[str, ...]) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"docs-{page}.png"
    shot.unlink(missing_ok=True)
    result = browse(docs_site + path, tmp_path, f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert console(result.stderr) == [], console(result.stderr)
    assert shot.stat().st_size > 10_000
    dom = browse(docs_site + path, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-3000:]
    for word in words:
        assert word in dom.stdout, (path, word)
    assert 'class="md-nav' in dom.stdout  # the theme's navigation was drawn


def test_a_page_that_rebinds_its_name_to_the_server_reads_nothing(tmp_path: Path) -> None:
    """DNS rebinding as a browser does it: Chromium resolves rebind.example to 127.0.0.1
    (--host-resolver-rules stands for the attacker's DNS) and loads the output page there; its
    Host names rebind.example, so it gets the 421 and none of the output, which the same page
    under 127.0.0.1 shows."""
    chromium()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["ONCE_DATABASE_URL"] = f"sqlite:///{tmp_path}/ledger.db"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    once(env, "run", "--job", "leaky", "--every", "day", "--max-attempts", "1", "--", "sh",
         "-c", "echo API_TOKEN=tok-5e1f; exit 1")
    server = Served("--refresh", "0", env=env)
    try:
        rebound = browse(f"http://rebind.example:{server.port}/logs/leaky", tmp_path,
                         "--host-resolver-rules=MAP rebind.example 127.0.0.1", "--dump-dom")
        local = browse(f"{server.url}/logs/leaky", tmp_path, "--dump-dom")
    finally:
        status, err = server.stop()
    assert status == 0, err
    assert "not served under the name" in rebound.stdout, rebound.stdout + rebound.stderr
    assert "tok-5e1f" not in rebound.stdout and "leaky" not in rebound.stdout
    assert "tok-5e1f" in local.stdout, local.stdout + local.stderr
