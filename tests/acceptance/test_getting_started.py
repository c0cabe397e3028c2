"""docs/getting-started.md is a tour whose commands really work as shown: this runs its
`$ once ...` lines on SQLite (the sections before "A fleet on PostgreSQL"), in order, each
as a shell runs it on a terminal 100 columns wide, as the page's outputs were taken, in a
directory of its own. Each must exit as the page says (`$ echo $?` under it, else 0), and
each line of output the page shows must be one the command printed, durations, seconds,
owners, the port and the directory aside (MASKS). Table rows are left out (their widths
follow the data), and so are progress bars and lines the page shortened (`…`).

The host's clock is set (libfaketime) to the page's first minute, its third second, for the
first commands, and four minutes on from the first `once check`, the page's "leave the tour
for three minutes": the same periods are done and missing as in the page's run, at once.
`once serve` listens on a port of its own; the page's `curl` lines are sent to it, and
Ctrl-C stops it.
"""

from __future__ import annotations

import http.client
import os
import re
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from helpers import ONCE
from procs import Terminal

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"
COLUMNS = 100
START = datetime(2026, 12, 6, 2, 14, 3, tzinfo=UTC)  # the first commands' clock
OUTAGE = 240  # seconds on, from the first `once check`


@dataclass
class Step:
    """A `$` line of the page, what the page shows under it, and the status it says."""

    command: str
    shown: list[str] = field(default_factory=list)
    status: int = 0


def tour() -> list[Step]:
    """The `$` lines of the page's literal blocks before its PostgreSQL section, each with
    the lines under it and the status a `$ echo $?` under it says."""
    text = PAGE.read_text(encoding="utf-8").split("\n## A fleet on PostgreSQL", 1)[0]
    steps: list[Step] = []
    current: Step | None = None
    status_next = False
    for line in text.splitlines():
        row = line[4:] if line.startswith("    ") else None
        if row is None:
            current = None
        elif status_next:
            steps[-1].status, status_next = int(row), False
        elif row == "$ echo $?":
            current, status_next = None, True
        elif row.startswith("$ "):
            current = Step(row[2:])
            steps.append(current)
        elif row.startswith("^C"):  # Ctrl-C stopped a server: what it said then is its own
            current = next(s for s in reversed(steps) if s.command.startswith("once serve"))
            current.shown.append(row)
        elif current is not None:
            current.shown.append(row)
    return steps


def checked(line: str) -> bool:
    """A line the page shows that must appear as it is: not a table's (cells apart by two
    spaces or more, rules), a bar or an elision."""
    return bool(line.strip()) and not re.search(r"\S {2,}\S|[─━╸╺…]", line.strip())


# What differs from run to run, the clock made START aside.
MASKS = (
    (r"sqlite:///\S*?/once\.db", "sqlite:///DIR/once.db"),  # the tour's directory
    (r"127\.0\.0\.1:\d+", "127.0.0.1:PORT"),  # once serve's port
    (r"(?<!\d)(\d\d:\d\d):\d\d(?!\d)", r"\1:SS"),  # the second of a time
    (r"\b\d+(?:\.\d+)?s\b", "Ns"),  # a duration
    (r"owner [^\s,]+", "owner OWNER"),  # host:pid
    (r"version \S+", "version V"),
)


def masked(line: str) -> str:
    for pattern, mask in MASKS:
        line = re.sub(pattern, mask, line)
    return re.sub(r"\s+", " ", line).strip()


def screen(output: bytes) -> list[str]:
    """What a terminal shows, line by line, colour and carriage returns aside."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode(errors="replace"))
    return [piece.rstrip() for line in text.replace("\r\n", "\n").split("\n")
            for piece in line.split("\r")]


def faketime(shift: int) -> dict[str, str]:
    """libfaketime's variables for a host whose clock is `shift` seconds off (and runs on;
    the monotonic clocks stay true)."""
    import libfaketime

    library = os.path.join(os.path.dirname(libfaketime.__file__), "vendor", "libfaketime",
                           "src", "libfaketime.so.1")
    return {"LD_PRELOAD": library, "FAKETIME": f"{shift:+d}", "DONT_FAKE_MONOTONIC": "1"}


def on_terminal(command: str, workdir: Path, env: dict[str, str]) -> Terminal:
    return Terminal(["/bin/sh", "-c", f"cd {shlex.quote(str(workdir))} && {command}"], env,
                    columns=COLUMNS)


def assert_shows(step: Step, printed: list[str]) -> None:
    said = {masked(line) for line in printed}
    for line in filter(checked, step.shown):
        assert masked(line) in said, (
            f"docs/getting-started.md shows, under `$ {step.command}`:\n  {line}\n"
            "which it did not print; it printed:\n" + "\n".join(printed))


def fetch(command: str, port: int) -> list[str]:
    """A page's `curl -s [-H 'Host: NAME'] URL` line, sent to the port `once serve` got."""
    words = shlex.split(command)
    headers = {}
    for i, word in enumerate(words[:-1]):
        if word == "-H":
            name, _, value = words[i + 1].partition(":")
            headers[name] = value.strip()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", urlsplit(words[-1]).path or "/", headers=headers)
        return connection.getresponse().read().decode().splitlines()
    finally:
        connection.close()


@dataclass
class Served:
    step: Step
    term: Terminal
    port: int

    def stop(self) -> None:
        """Ctrl-C, as the page does; then what it printed since it started."""
        self.term.write(b"\x03")
        status = self.term.wait(timeout=60)
        printed = screen(self.term.output)
        assert status == self.step.status, (self.step.command, status, printed)
        assert_shows(self.step, printed)


def serve(step: Step, workdir: Path, env: dict[str, str]) -> Served:
    term = on_terminal(f"exec {step.command} --listen 127.0.0.1:0", workdir, env)
    term.expect("/ for the ledger", timeout=60)
    port = re.search(rb"http://127\.0\.0\.1:(\d+)/", term.output)
    assert port, term.output
    return Served(step, term, int(port.group(1)))


def test_the_getting_started_tour_runs_as_shown() -> None:
    steps = tour()
    commands = [step.command for step in steps]
    for start in ("once run", "once status", "once history", "once logs", "once check",
                  "once catchup", "once serve", "curl "):
        assert any(c.startswith(start) for c in commands), (start, commands)
    assert [s.status for s in steps if s.command.startswith("once check")] == [2, 0]
    owner = re.search(r"owner (\S+:\d+)", PAGE.read_text(encoding="utf-8"))
    assert owner, "the page shows no owner"
    base = Path(tempfile.mkdtemp(prefix="tour-", dir="/tmp"))  # short: a ledger line fits
    try:
        workdir = base / "once-tour"
        workdir.mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ONCE_") and k not in ("COLUMNS", "LINES")}
        env.update(HOME=str(base), TERM="xterm-256color",
                   PATH=f"{Path(ONCE).parent}:{env.get('PATH', '/usr/bin:/bin')}",
                   ONCE_OWNER=owner.group(1))  # as wide as the page's: the tables' widths
        run_tour(steps, workdir, env)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_tour(steps: list[Step], workdir: Path, env: dict[str, str]) -> None:
    shift = round(START.timestamp() - time.time())  # the host's clock, made START
    outage_begun = False
    served: Served | None = None
    for step in steps:
        if step.command.startswith("curl "):
            assert served, f"`{step.command}` with no once serve running"
            assert_shows(step, fetch(step.command, served.port))
            continue
        if not step.command.startswith("once "):
            continue  # mkdir, ls, pipx: the test's own directory and once stand in
        if served:
            served.stop()
            served = None
        if step.command.startswith("once check") and not outage_begun:
            shift, outage_begun = shift + OUTAGE, True
        clock = faketime(shift)
        if step.command.startswith("once serve"):
            served = serve(step, workdir, {**env, **clock})
            continue
        term = on_terminal(step.command, workdir, {**env, **clock})
        status = term.wait(timeout=120)
        printed = screen(term.output)
        assert status == step.status, (step.command, status, printed)
        assert_shows(step, printed)
    if served:
        served.stop()
