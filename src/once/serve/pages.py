"""The HTML of `once serve`: the frame every page shares (style, script, header, footer), a
job's page (`/job/NAME`) and an attempt's output (`/logs/NAME?period=P&attempt=N`); the
fleet's overview (`/`) is once.serve.overview's.

Plain HTML with its CSS and a few lines of JavaScript inline: nothing is fetched from anywhere
else (many clusters have no internet access), and the Content-Security-Policy allows nothing
but the inline style and this exact script (by its hash). Everything from the ledger (job
names, owners, periods, reasons, error messages) goes through html.escape: a job named
`<script>` is text.

What each page says comes from once.report (status_object, findings, attempt entries, the
timeline's cells and drawing), so that the pages and the commands cannot disagree.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from once import __version__, report
from once.escape import shown_lines
from once.periods import Period
from once.report import timeline
from once.report.logs import header as logs_header
from once.serve.data import JobPage, Output

OUTPUT_SHOWN = 64 * 1024  # characters of an attempt's output a page shows (its end)

# Reloads the page's body every data-refresh seconds while the tab is visible, keeping the
# scroll position; says so when the server cannot be reached. No other script runs. (The
# hash covers the element's whole text: the newline after <script> too.)
SCRIPT = """
(function () {
  var every = Number(document.documentElement.dataset.refresh) * 1000;
  if (!every) return;
  function tick() {
    if (document.hidden) { setTimeout(tick, 1000); return; }
    fetch(location.href, {cache: "no-store", credentials: "same-origin"})
      .then(function (r) { return r.text(); })
      .then(function (html) {
        var page = new DOMParser().parseFromString(html, "text/html");
        document.body.replaceWith(document.adoptNode(page.body));
      })
      .catch(function () {
        var note = document.getElementById("offline");
        if (note) note.hidden = false;
      })
      .finally(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
"""
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP = (f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{SCRIPT_HASH}'; "
       "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")

STYLE = """\
:root { --bg: #fff; --fg: #1d2329; --dim: #6a737d; --line: #e1e4e8; --head: #f6f8fa;
  --done: #2da44e; --failed: #cf222e; --missing: #cf222e; --running: #0969da;
  --stale: #d4a72c; --pending: #d0d7de; --bad-bg: #ffebe9; --warn-bg: #fff8c5; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #0d1117; --fg: #e6edf3; --dim: #8b949e; --line: #30363d; --head: #161b22;
    --pending: #30363d; --bad-bg: #3c1618; --warn-bg: #3b2e0a; } }
body { background: var(--bg); color: var(--fg); margin: 1.5rem;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
a { color: var(--running); text-decoration: none; } a:hover { text-decoration: underline; }
h1 { font-size: 1.35rem; margin: 0 0 .2rem; overflow-wrap: anywhere; }
h2 { font-size: 1.1rem; margin: 1.6rem 0 .5rem; }
.sub, .dim { color: var(--dim); } .sub { overflow-wrap: break-word; }
.banner { padding: .6rem .9rem; border-radius: 6px; margin: 1rem 0; background: var(--bad-bg);
  border: 1px solid var(--failed); font-weight: 600; }
table { border-collapse: collapse; width: 100%; margin-top: .8rem; }
th, td { text-align: left; vertical-align: top; padding: .35rem .5rem;
  border-bottom: 1px solid var(--line); }
th { background: var(--head); font-weight: 600; white-space: nowrap; }
td:first-child { max-width: 24rem; overflow-wrap: anywhere; }
tr.critical td:first-child { box-shadow: inset 4px 0 var(--failed); }
tr.warning td:first-child { box-shadow: inset 4px 0 var(--stale); }
tr.ok td:first-child { box-shadow: inset 4px 0 var(--done); }
.bad { color: var(--failed); font-weight: 600; } .warn { color: #9a6700; font-weight: 600; }
.run { color: var(--running); } .ok-text { color: var(--done); }
.badge { display: inline-block; font-size: .75rem; font-weight: 700; padding: 0 .4rem;
  border-radius: 1em; margin-left: .4rem; color: #fff; }
.badge.critical { background: var(--failed); } .badge.warning { background: var(--stale); }
.badge.ok { background: var(--done); }
.strip { white-space: nowrap; }
.cell { display: inline-block; width: 6px; height: 14px; margin-right: 1px;
  border-radius: 2px; vertical-align: middle; }
.nowrap, .key { white-space: nowrap; } .owner { overflow-wrap: anywhere; }
.line { display: inline-block; max-width: 26ch; overflow: hidden; text-overflow: ellipsis;
  white-space: nowrap; vertical-align: bottom; font: 12px ui-monospace, monospace;
  color: var(--dim); }
td.lastline .line { max-width: 40ch; } a.line { color: var(--running); }
.s-done { background: var(--done); } .s-failed { background: var(--failed); }
.s-missing { background: transparent; box-shadow: inset 0 0 0 2px var(--missing); }
.s-running { background: var(--running); } .s-stale { background: var(--stale); }
.s-pending { background: var(--pending); } .s-none { background: transparent; }
pre.output { font: 13px/1.3 ui-monospace, "DejaVu Sans Mono", monospace;
  overflow-x: auto; background: var(--head); padding: .8rem; border-radius: 6px;
  white-space: pre-wrap; overflow-wrap: anywhere; }
div.timeline { background: var(--head); padding: .8rem; border-radius: 6px;
  font: 12px/1.3 ui-monospace, "DejaVu Sans Mono", monospace; }
div.timeline p { margin: 0; overflow-wrap: anywhere; }
.rows { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 2px .6rem;
  align-items: center; margin: .7rem 0; }
.slots { display: flex; min-width: 0; }
.slot { flex: 1 1 0; min-width: 1px; max-width: 14px; height: 14px; margin-right: 1px;
  border-radius: 2px; }
.rows.few .slot { max-width: 28px; }
.marks .slot { height: auto; border-radius: 0; overflow: visible; white-space: nowrap;
  color: var(--dim); }
.legend { display: flex; flex-wrap: wrap; gap: .2rem 1rem; align-items: center; }
.legend .slot { flex: none; width: 10px; display: inline-block; vertical-align: middle;
  margin-right: .3rem; }
.g-done { background: var(--done); } .g-failed { background: var(--failed); }
.g-missing { box-shadow: inset 0 0 0 2px var(--missing); }
.g-running { background: var(--running); } .g-stale { background: var(--stale); }
.g-pending { background: var(--pending); }
ul.findings { padding-left: 1.2rem; } code { font-family: ui-monospace, monospace; }
form.filter { display: flex; flex-wrap: wrap; gap: .4rem 1rem; align-items: center;
  margin: 1rem 0 0; } form.filter input { width: 16rem; max-width: 60vw; }
.count { margin: .5rem 0 0; } nav.pager { margin: .8rem 0; }
footer { margin-top: 2rem; color: var(--dim); font-size: .85rem; }
@media (max-width: 760px) {
  body { margin: .8rem; }
  table.cards thead { display: none; }
  table.cards, table.cards tbody, table.cards tr, table.cards td { display: block; }
  table.cards tr { border: 1px solid var(--line); border-radius: 8px; margin: .7rem 0;
    padding: .3rem 0; }
  table.cards td { border: 0; padding: .15rem .7rem; white-space: normal;
    overflow-wrap: anywhere; }
  table.cards td[data-label] { position: relative; padding-left: 7.6rem; min-height: 1.45em; }
  table.cards td[data-label]::before { content: attr(data-label); position: absolute;
    left: .7rem; width: 6.6rem; color: var(--dim); font-weight: 600; white-space: nowrap;
    overflow: hidden; text-overflow: ellipsis; }
  table.cards td:empty { display: none; }
  table.cards td:first-child { font-size: 1.05rem; padding-bottom: .3rem; }
  tr.critical, tr.warning, tr.ok { box-shadow: none; }
  tr.critical td:first-child, tr.warning td:first-child, tr.ok td:first-child {
    box-shadow: none; }
  tr.critical { border-left: 4px solid var(--failed) !important; }
  tr.warning { border-left: 4px solid var(--stale) !important; }
  tr.ok { border-left: 4px solid var(--done) !important; }
  .line, td.lastline .line { max-width: 100%; } }
"""

SEVERITY_CLASS = {report.OK: "ok", report.WARNING: "warning", report.CRITICAL: "critical"}


def job_href(name: str) -> str:
    return "/job/" + quote(name, safe="")


def output_href(name: str, period: str, attempt: int) -> str:
    """The page of an attempt's output: once logs NAME --period P --attempt N."""
    return ("/logs/" + quote(name, safe="") + "?"
            + urlencode({"period": period, "attempt": attempt}))


def severity(s: report.JobState) -> int:
    """The job's verdict, as `once check` gives it. Kept on the state: a page of a fleet asks
    for it of every job several times (to count, filter and order them). Missing periods are
    critical whether or not their keys were read (once.report.survey's detail)."""
    known: int | None = getattr(s, "_severity", None)
    if known is None:
        found = (report.OK if s.sched is not None and not s.open_rows  # most jobs, at once
                 else max((f.severity for f in report.findings([s])), default=report.OK))
        known = report.CRITICAL if s.no_row else found
        setattr(s, "_severity", known)  # noqa: B010 (JobState has no such field)
    return known


def schedule_text(s: report.JobState) -> str:
    text = s.schedule_text + (f", lag {s.lag}" if s.lag else "")
    return text + (f", {s.shards} shards" if s.shards > 1 else "")


def key_html(text: str, whole: bool = False) -> str:
    """A period key, never wrapped: a clock key without its UTC offset (`2026-12-01 23:00`:
    the job's zone is beside it; the whole key is its title), unless whole."""
    found = None if whole else _CLOCK_KEY.fullmatch(text)
    if found is None:
        return f'<span class="key">{escape(text)}</span>'
    date, clock, shard = found.group(1, 2, 4)
    return (f'<span class="key" title="{escape(text)}">{escape(date)} {escape(clock)}'
            f"{escape(shard or '')}</span>")


_CLOCK_KEY = re.compile(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d(?::\d\d)?)([+-]\d\d:\d\d(?::\d\d)?|Z)"
                        r"(#\d+)?")


def url_html(text: str) -> str:
    """A ledger's URL that a narrow screen breaks after a /, :, @, . or a hyphen, never in a
    word's middle while such a break fits."""
    return "<wbr>".join(escape(part) for part in _URL_BREAK.split(text))


_URL_BREAK = re.compile(r"(?<=[/:@.?&=])(?=[^/:@.?&=])")  # after a run of separators


def said_html(line: str | None, href: str | None) -> str:
    """What a failed attempt said last, one line cut short (its whole text as the title),
    linked to its output; without a line, `output` linked."""
    link = f' href="{escape(href)}"' if href else ""
    if not line:
        return f'<a{link}>output</a>' if href else ""
    return (f'<a class="line"{link} title="{escape(line)}: the whole output">{escape(line)}</a>'
            if href else f'<span class="line" title="{escape(line)}">{escape(line)}</span>')


def page(title: str, body: str, refresh: float) -> str:
    seconds = f"{refresh:g}" if refresh > 0 else "0"
    return (f'<!DOCTYPE html>\n<html lang="en" data-refresh="{seconds}">\n<head>\n'
            f'<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<link rel="icon" href="data:,">\n<title>{escape(title)}</title>\n'
            f"<style>\n{STYLE}</style>\n<script>{SCRIPT}</script>\n</head>\n"
            f"<body>\n{body}\n</body>\n</html>\n")


def header(heading: str, ledger: str, sub: str) -> str:
    return (f"<h1>{heading}</h1>\n"
            f'<div class="sub">ledger <code>{url_html(ledger)}</code>{sub}</div>\n'
            '<div id="offline" class="banner" hidden>this page could not be refreshed: '
            "once serve does not answer</div>\n")


def footer(now: datetime, refresh: float) -> str:
    every = f"; refreshes every {report.age(refresh)}" if refresh > 0 else ""
    return (f'<footer>once {escape(__version__)}; as of {escape(_clock(now))} by the '
            f"ledger's clock{every}</footer>")


def _clock(instant: datetime) -> str:
    return instant.strftime("%Y-%m-%d %H:%M:%S UTC")


def unreachable(heading: str, ledger: str, error: str, refresh: float, now: datetime) -> str:
    """A page that says the ledger cannot be read (and why) instead of its data."""
    body = (header(escape(heading), ledger, "")
            + f'<div class="banner">ledger unreachable: {escape(error)}</div>\n'
            + footer(now, refresh))
    return page("once: ledger unreachable", body, refresh)


def not_found(what: str, ledger: str, now: datetime) -> str:
    body = (header("not found", ledger, "")
            + f'<p>{escape(what)}</p>\n<p><a href="/">all jobs</a></p>\n' + footer(now, 0))
    return page("once: not found", body, 0)


# -- a job's page ----------------------------------------------------------------------------


def job_page(found: JobPage, ledger: str, refresh: float) -> str:
    """The job's check verdict, its timeline and its history."""
    s = found.state
    sev = max((f.severity for f in found.findings), default=report.OK)
    klass = SEVERITY_CLASS[sev]
    heading = (f'{escape(s.name)}<span class="badge {klass}">{report.SEVERITY[sev]}</span>')
    sub = f"; {escape(schedule_text(s))}, {escape(s.tz)}"
    body = [header(heading, ledger, sub), '<p><a href="/">all jobs</a></p>',
            "<h2>Check</h2>", _verdict(found.findings, s.name), "<h2>Timeline</h2>",
            _timeline(s, found.cells), "<h2>History</h2>",
            _history(s.name, found.tz, found.entries), footer(found.now, refresh)]
    return page(f"once: {s.name}", "\n".join(body), refresh)


def _verdict(found: Sequence[report.Finding], name: str) -> str:
    if not found:
        return f"<p class=\"ok\">OK: every due period of {escape(name)} is done.</p>"
    items = []
    for f in found:
        klass = "bad" if f.severity == report.CRITICAL else "warn"
        items.append(f'<li><span class="{klass}">{report.SEVERITY[f.severity]}</span> '
                     f"<code>{escape(f.period)}</code> {escape(f.problem)}"
                     + (f" ({escape(f.detail)})" if f.detail else "") + "</li>")
    return '<ul class="findings">' + "".join(items) + "</ul>"


def _timeline(s: report.JobState, cells: list[tuple[Period, str]]) -> str:
    """The periods `once status --timeline` draws, as rows of slots that share the page's
    width (once.report.timeline.grid): a daily job's month is one row, an hourly job's day;
    its title and legend wrap as text does. Each slot's title: its key and state."""
    if s.sched is None or not cells:  # the line that says why not
        why = "".join(text for text, _ in timeline.draw(s, cells, tty=False)[0])
        return f'<div class="timeline"><p>{escape(why)}</p></div>'
    title = (f"{escape(schedule_text(s))}, {escape(s.tz)}: "
             f"{key_html(cells[0][0].key, whole=True)} .. "
             f"{key_html(cells[-1][0].key, whole=True)} ({escape(timeline.summary(cells))})")
    drawn = timeline.grid(s.sched, cells)
    marks = dict(drawn.marks)
    rows = ['<span></span><span class="slots marks">' + "".join(
        f'<span class="slot">{escape(marks.get(i, ""))}</span>' for i in range(drawn.slots))
        + "</span>"] if marks else []
    for label, slots in drawn.rows:
        rows.append(f"<span>{escape(label)}</span><span class=\"slots\">"
                    + "".join(_slot(slot) for slot in slots) + "</span>")
    legend = "".join(f'<span><span class="slot g-{state}"></span>'
                     f"{escape(timeline.STATES[state][3])}</span>" for state in timeline.LEGEND)
    wide = " few" if drawn.slots <= 12 else ""  # a few slots a row: each wider
    return (f'<div class="timeline"><p>{title}</p>\n<div class="rows{wide}">'
            + "\n".join(rows) + f'</div>\n<p class="legend">{legend}</p></div>')


def _slot(slot: tuple[Period, str] | None) -> str:
    if slot is None:
        return '<span class="slot"></span>'
    period, state = slot
    return (f'<span class="slot g-{state}" title="{escape(period.key)}: '
            f'{escape(timeline.STATES[state][3])}"></span>')


_LAST = ' class="lastline"'
HISTORY_HEADINGS = ("period", "attempt", "fence", "owner", "started", "finished", "took",
                    "outcome", "exit", "reason", "last line")


def _history(name: str, tz: str, entries: list[dict[str, Any]]) -> str:
    """once history's table: a failed attempt's last line, every finished one's output."""
    if not entries:
        return "<p class=\"dim\">No attempts recorded.</p>"
    heads = [*HISTORY_HEADINGS]
    heads[4] = f"started ({tz})"
    rows = []
    for e in entries:
        word = report.status_word(e)
        # An interrupted attempt (a drain, a deploy) kept the period's budget: not a failure's red.
        klass = ("warn" if e["outcome"] in ("stale", "interrupted")
                 else "bad" if e["status"] == "failed"
                 else "run" if e["outcome"] == "running" else "")
        href = (output_href(name, e["period"], e["attempt"])
                if e["finished_at"] or e["outcome"] == "taken-over" else None)
        said = said_html(e["last_line"] if e["status"] == "failed" else None, href)
        cells = [key_html(e["period"], whole=True), str(e["attempt"]), str(e["fence"]),
                 f'<span class="owner">{escape(e["owner"])}</span>',
                 escape(_local(e["started_at"])), escape(_local(e["finished_at"])),
                 escape(report.took(e["duration_s"])),
                 f'<span class="{klass}">{escape(word)}</span>',
                 "-" if e["exit_code"] is None else str(e["exit_code"]),
                 escape(e["reason"] or ""), said]
        rows.append(f"<tr><td>{cells[0]}</td>" + "".join(
            f'<td data-label="{escape(h.split(" (")[0])}"{_LAST if h == "last line" else ""}>'
            f"{c}</td>"
            for h, c in zip(heads[1:], cells[1:], strict=True)) + "</tr>")
    return ('<table class="cards">\n<thead><tr>'
            + "".join(f"<th>{escape(h)}</th>" for h in heads)
            + "</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>")


def _local(text: str | None) -> str:
    return text[:19].replace("T", " ") if text else "-"


# -- an attempt's output ---------------------------------------------------------------------


def output_page(found: Output, ledger: str) -> str:
    """What an attempt said (once logs): its header line, then its stored output (the end of
    it past OUTPUT_SHOWN characters), escaped as once logs escapes it, then by html.escape.
    Never refreshes itself: a finished attempt's output does not change."""
    entry, text = found.entry, found.output
    name = entry["job"]
    body = [header(f'output of <a href="{escape(job_href(name))}">{escape(name)}</a>', ledger,
                   ""), f"<p><code>{escape(logs_header(entry))}</code></p>"]
    if text is None:
        body.append('<p class="dim">Nothing stored: the attempt is still running, never '
                    "finished, or its output was not captured (--output-tail 0, a "
                    "terminal).</p>")
    elif not text:
        body.append('<p class="dim">The command printed nothing.</p>')
    else:
        if len(text) > OUTPUT_SHOWN:
            body.append(f'<p class="dim">The last {OUTPUT_SHOWN // 1024} KiB of '
                        f"{len(text) // 1024} KiB stored; <code>once logs "
                        f"{escape(name)} --period {escape(entry['period'])} --attempt "
                        f"{entry['attempt']}</code> prints it all.</p>")
            text = text[-OUTPUT_SHOWN:]
        body.append(f'<pre class="output">{escape(shown_lines(text))}</pre>')
    body.append(footer(found.now, 0))
    return page(f"once: {name} {entry['period']} attempt {entry['attempt']}", "\n".join(body),
                0)
