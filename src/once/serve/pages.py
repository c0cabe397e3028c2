"""The HTML of `once serve`: the fleet's overview (`/`) and a job's page (`/job/NAME`).

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
from collections.abc import Iterable, Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from once import __version__, report
from once.periods import Period
from once.report import timeline
from once.serve.data import Fleet, JobPage

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
       "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
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
h1 { font-size: 1.35rem; margin: 0 0 .2rem; } h2 { font-size: 1.1rem; margin: 1.6rem 0 .5rem; }
.sub, .dim { color: var(--dim); }
.banner { padding: .6rem .9rem; border-radius: 6px; margin: 1rem 0; background: var(--bad-bg);
  border: 1px solid var(--failed); font-weight: 600; }
table { border-collapse: collapse; width: 100%; margin-top: .8rem; }
th, td { text-align: left; vertical-align: top; padding: .35rem .6rem;
  border-bottom: 1px solid var(--line); }
th { background: var(--head); font-weight: 600; white-space: nowrap; }
td:first-child { white-space: nowrap; }
tr.critical td:first-child { box-shadow: inset 4px 0 var(--failed); }
tr.warning td:first-child { box-shadow: inset 4px 0 var(--stale); }
tr.ok td:first-child { box-shadow: inset 4px 0 var(--done); }
.bad { color: var(--failed); font-weight: 600; } .warn { color: #9a6700; font-weight: 600; }
.run { color: var(--running); }
.badge { display: inline-block; font-size: .75rem; font-weight: 700; padding: 0 .4rem;
  border-radius: 1em; margin-left: .4rem; color: #fff; }
.badge.critical { background: var(--failed); } .badge.warning { background: var(--stale); }
.badge.ok { background: var(--done); }
.strip { white-space: nowrap; }
.cell { display: inline-block; width: 6px; height: 14px; margin-right: 1px;
  border-radius: 2px; vertical-align: middle; }
.key, .nowrap { white-space: nowrap; }
.wide { overflow-x: auto; }
.s-done { background: var(--done); } .s-failed { background: var(--failed); }
.s-missing { background: transparent; box-shadow: inset 0 0 0 2px var(--missing); }
.s-running { background: var(--running); } .s-stale { background: var(--stale); }
.s-pending { background: var(--pending); } .s-none { background: transparent; }
pre.timeline { font: 13px/1.3 ui-monospace, "DejaVu Sans Mono", monospace; overflow-x: auto;
  background: var(--head); padding: .8rem; border-radius: 6px; }
pre .g-done { color: var(--done); } pre .g-failed { color: var(--failed); }
pre .g-missing { color: var(--missing); } pre .g-running { color: var(--running); }
pre .g-stale { color: var(--stale); } pre .g-pending { color: var(--dim); }
ul.findings { padding-left: 1.2rem; } code { font-family: ui-monospace, monospace; }
footer { margin-top: 2rem; color: var(--dim); font-size: .85rem; }
"""

SEVERITY_CLASS = {report.OK: "ok", report.WARNING: "warning", report.CRITICAL: "critical"}


def job_href(name: str) -> str:
    return "/job/" + quote(name, safe="")


def _page(title: str, body: str, refresh: float) -> str:
    seconds = f"{refresh:g}" if refresh > 0 else "0"
    return (f'<!DOCTYPE html>\n<html lang="en" data-refresh="{seconds}">\n<head>\n'
            f'<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<link rel="icon" href="data:,">\n<title>{escape(title)}</title>\n'
            f"<style>\n{STYLE}</style>\n<script>{SCRIPT}</script>\n</head>\n"
            f"<body>\n{body}\n</body>\n</html>\n")


def _header(heading: str, ledger: str, sub: str) -> str:
    return (f"<h1>{heading}</h1>\n"
            f'<div class="sub">ledger <code>{escape(ledger)}</code>{sub}</div>\n'
            '<div id="offline" class="banner" hidden>this page could not be refreshed: '
            "once serve does not answer</div>\n")


def _footer(now: datetime, refresh: float) -> str:
    every = f"; refreshes every {report.age(refresh)}" if refresh > 0 else ""
    return (f'<footer>once {escape(__version__)}; as of {escape(_clock(now))} by the '
            f"ledger's clock{every}</footer>")


def _clock(instant: datetime) -> str:
    return instant.strftime("%Y-%m-%d %H:%M:%S UTC")


def unreachable(heading: str, ledger: str, error: str, refresh: float, now: datetime) -> str:
    """A page that says the ledger cannot be read (and why) instead of its data."""
    body = (_header(escape(heading), ledger, "")
            + f'<div class="banner">ledger unreachable: {escape(error)}</div>\n'
            + _footer(now, refresh))
    return _page("once: ledger unreachable", body, refresh)


def not_found(what: str, ledger: str, now: datetime) -> str:
    body = (_header("not found", ledger, "")
            + f'<p>{escape(what)}</p>\n<p><a href="/">all jobs</a></p>\n' + _footer(now, 0))
    return _page("once: not found", body, 0)


# -- the overview ----------------------------------------------------------------------------


def overview(fleet: Fleet, ledger: str, namespace: str | None, refresh: float) -> str:
    """Every job as a row, problems first."""
    ranked = sorted(fleet.states, key=lambda s: (-_severity(s), s.name))
    counts = {sev: sum(1 for s in ranked if _severity(s) == sev) for sev in SEVERITY_CLASS}
    space = f", namespace <code>{escape(namespace)}</code>" if namespace else ""
    summary = ", ".join(f"{n} {report.SEVERITY[sev]}" for sev, n in
                        sorted(counts.items(), reverse=True) if n)
    heading = f"once: {len(ranked)} job{'' if len(ranked) == 1 else 's'}"
    body = [_header(escape(heading), ledger, f"{space}; {escape(summary or 'no jobs yet')}")]
    if ranked:
        body.append('<div class="wide"><table>\n<thead><tr>' + "".join(f"<th>{h}</th>" for h in (
            "job, latest periods", "schedule", "last done", "running now", "failed", "missing",
            "next")) + "</tr></thead>\n<tbody>")
        body += [_row(s, fleet.now, fleet.strips.get(s.name, [])) for s in ranked]
        body.append("</tbody>\n</table></div>")
    else:
        body.append("<p>No job has run against this ledger yet"
                    + (" under this namespace" if namespace else "") + ".</p>")
    body.append(_footer(fleet.now, refresh))
    return _page(heading, "\n".join(body), refresh)


def _severity(s: report.JobState) -> int:
    return max((f.severity for f in report.findings([s])), default=report.OK)


def _row(s: report.JobState, now: datetime, strip: list[tuple[Period, str]]) -> str:
    sev = _severity(s)
    klass = SEVERITY_CLASS[sev]
    obj = report.status_object(s)
    name = (f'<a href="{escape(job_href(s.name))}">{escape(s.name)}</a>'
            f'<span class="badge {klass}">{report.SEVERITY[sev]}</span><br>{_strip(strip)}')
    schedule = f'{escape(_schedule(s))}<br><span class="dim">{escape(s.tz)}</span>'
    if s.sched is None:
        cells = [name, schedule,
                 f'<span class="bad">cannot read the schedule: {escape(s.error)}</span>',
                 "", "", "", ""]
    else:
        cells = [name, schedule, _last_done(s, now), _running(s), _failed(obj), _missing(obj),
                 _next(s, now)]
    return f'<tr class="{klass}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _schedule(s: report.JobState) -> str:
    text = s.schedule_text + (f", lag {s.lag}" if s.lag else "")
    return text + (f", {s.shards} shards" if s.shards > 1 else "")


def _last_done(s: report.JobState, now: datetime) -> str:
    last = s.last_done
    if last is None:
        return '<span class="warn">never</span>'
    ago = (f"finished {report.age((now - last.finished_at).total_seconds())} ago, "
           if last.finished_at else "")
    return (f'<span class="key">{escape(last.period)}</span><br>'
            f'<span class="dim">{ago}took {escape(report.took(last.duration))}</span>')


def _running(s: report.JobState) -> str:
    out = []
    for r in s.running:
        stale = s.is_stale(r)
        text = (f'<span class="key">{escape(r.period)}</span> {escape(r.owner)} #{r.attempt}, '
                f"heartbeat {report.age(s.heartbeat_age(r))} ago")
        out.append(f'<span class="warn">{text} STALE</span>' if stale
                   else f'<span class="run">{text}</span>')
    return "<br>".join(out) or '<span class="dim">-</span>'


def _failed(obj: dict[str, Any]) -> str:
    if not obj["failed"]:
        return '<span class="dim">0</span>'
    out = f" ({obj['failed_out']} failed-out)" if obj["failed_out"] else ""
    keys = ", ".join(_key(f["period"]) for f in obj["failed_periods"][:3])
    return (f'<span class="bad nowrap">{obj["failed"]}{out}</span><br>'
            f'<span class="dim">{keys}</span>')


def _missing(obj: dict[str, Any]) -> str:
    if not obj["missing"]:
        return '<span class="dim">0</span>'
    more = "+" if obj["missing_at_least"] else ""
    keys = ", ".join(_key(k) for k in obj["missing_periods"][:3])
    last = obj["missing_last"]
    if last and last not in obj["missing_periods"][:3]:
        keys += f" … {_key(last)}"
    return f'<span class="bad">{obj["missing"]}{more}</span><br><span class="dim">{keys}</span>'


def _next(s: report.JobState, now: datetime) -> str:
    if s.next is None or s.next_at is None:
        return '<span class="dim">-</span>'
    return (f"{_key(s.next.key)}<br><span class=\"dim\">in "
            f"{report.age((s.next_at - now).total_seconds())}</span>")


def _key(text: str) -> str:
    return f'<span class="key">{escape(text)}</span>'


def _strip(cells: Iterable[tuple[Period, str]]) -> str:
    spans = [f'<span class="cell s-{state}" title="{escape(p.key)}: '
             f'{escape(timeline.STATES[state][3])}"></span>' for p, state in cells]
    return f'<span class="strip">{"".join(spans)}</span>'


# -- a job's page ----------------------------------------------------------------------------


def job_page(page: JobPage, ledger: str, refresh: float) -> str:
    """The job's check verdict, its timeline and its history."""
    s = page.state
    sev = max((f.severity for f in page.findings), default=report.OK)
    klass = SEVERITY_CLASS[sev]
    heading = (f'{escape(s.name)}<span class="badge {klass}">{report.SEVERITY[sev]}</span>')
    sub = f"; {escape(_schedule(s))}, {escape(s.tz)}"
    body = [_header(heading, ledger, sub), '<p><a href="/">all jobs</a></p>',
            "<h2>Check</h2>", _verdict(page.findings, s.name), "<h2>Timeline</h2>",
            _timeline(s, page.cells), "<h2>History</h2>", _history(page.tz, page.entries),
            _footer(page.now, refresh)]
    return _page(f"once: {s.name}", "\n".join(body), refresh)


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


_GLYPHS = {glyph: state for state, (_, glyph, style, _) in timeline.STATES.items() if style}


def _timeline(s: report.JobState, cells: list[tuple[Period, str]]) -> str:
    """The terminal's drawing (once status --timeline), its glyphs coloured by state."""
    lines = []
    for line in timeline.draw(s, cells, tty=True):
        out = []
        for chunk, _style in line:
            state = _GLYPHS.get(chunk)
            out.append(f'<span class="g-{state}">{escape(chunk)}</span>' if state
                       else escape(chunk))
        lines.append("".join(out).rstrip())
    return '<pre class="timeline">' + "\n".join(lines) + "</pre>"


def _history(tz: str, entries: list[dict[str, Any]]) -> str:
    if not entries:
        return "<p class=\"dim\">No attempts recorded.</p>"
    heads = ["period", "attempt", "fence", "owner", f"started ({tz})", "finished", "took",
             "outcome", "exit", "reason"]
    rows = []
    for e in entries:
        word = report.status_word(e)
        klass = ("bad" if e["status"] == "failed" else "warn" if e["outcome"] == "stale"
                 else "run" if e["outcome"] == "running" else "")
        cells = [escape(e["period"]), str(e["attempt"]), str(e["fence"]), escape(e["owner"]),
                 escape(_local(e["started_at"])), escape(_local(e["finished_at"])),
                 escape(report.took(e["duration_s"])),
                 f'<span class="{klass}">{escape(word)}</span>',
                 "-" if e["exit_code"] is None else str(e["exit_code"]),
                 escape(e["reason"] or "")]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return ("<table>\n<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in heads)
            + "</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>")


def _local(text: str | None) -> str:
    return text[:19].replace("T", " ") if text else "-"
