"""Scenario 5, bad input, second part: hostile values through every command, and after each
one every report must still read the ledger.

Inputs come in families, each value at an edge or past it (a seeded random draw picks among
the generated ones; TORTURE_SCALE scales how many):

- URLs: odd hosts (`[::1`, `[zz]`, a port past 65535, 300 characters, a socket path, a
  name with rich markup) and every query parameter the README names (`sslmode`, `host`,
  `options` for PostgreSQL; `charset`, `unix_socket`, `ssl_ca`/`ssl_cert`/`ssl_key`,
  `connect_timeout` for MySQL/MariaDB), with good, bad and absent values, to `once run`
  and to every report;
- secret files (`--db-password-file`, `ONCE_DATABASE_URL_FILE`, `--ping-url-file`): binary,
  empty, over 64 KiB, a NUL, control characters, trailing line breaks;
- lengths around every limit of docs/reference/run.md "Input limits": job names and namespaces of
  200/201, `NS:JOB` of 255/256, `ONCE_OWNER` of 255/256 (multi-byte too), `--cron` of
  255/256, `--reason` of 1000/1001, a watermark of 64 KiB and one byte more;
- periods at the edges: the years 1, 999 and 9999, a period whose end is past 9999, a zone
  14 hours ahead at the year 1, the future (with and without `--allow-future`), through
  `rerun`, `catchup` and `periods`;
- control characters and rich markup in every text field: job, namespace, owner, reason,
  watermark, URL;
- `once state` (read, set, seed) and `once prune` with edge durations.

After each input: never a traceback, an exit status the README documents for the command
(and, when not 0, one `once:` line on stderr), the marker command never run when the answer
was 2 or 75, and no raw control character (but line breaks and tabs) on any output, except
`once state JOB`'s stdout in a pipe, which is the watermark as stored, for scripts. Then every
report (status, its --json and --timeline, check and --json, metrics, history and --json,
logs, state) reads the ledger with a documented status and no control character, and text
stored from a hostile input is shown literally (never read as markup).
"""

from __future__ import annotations

import os
import random
import subprocess
import unicodedata
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from common import ONCE, Backend, Config, Row, base_env, histogram

# The statuses the README documents, per command (the marker command exits 0).
# The statuses the README documents, per command (the marker command exits 0); 2 is a
# usage error for every command.
DOCUMENTED = {
    "run": {0, 2, 75}, "catchup": {0, 2, 75}, "rerun": {0, 2, 69, 75}, "state": {0, 2, 75},
    "prune": {0, 2, 75}, "periods": {0, 2}, "status": {0, 2, 75}, "history": {0, 2, 75},
    "check": {0, 1, 2, 3, 75}, "metrics": {0, 2, 75}, "logs": {0, 2, 75},
    "schema": {0, 2, 75},
}

ESC = "\x1b"
HOSTILE = [f"{ESC}]0;pwned\x07", f"{ESC}[2J", "a\nOK forged", "tab\there", "\x7fdel",
           "\u009bcsi", "\r\rcr", "bell\x07", "\u202eevil", "zw\u200bj"]
MARKUP = ["[link=https://evil.example/]nightly", "x[/]y", "[bold red]loud[/]", "[/]",
          "[[x]]", "\\[escaped]", "[link=file:///etc/passwd]l[/link]"]


@dataclass
class Input:
    family: str
    label: str
    argv: list[str]  # after `once`
    env: dict[str, str] = field(default_factory=dict)  # added to the ledger's environment
    drop: tuple[str, ...] = ()  # variables removed from it
    expect: set[int] | None = None  # None: any documented status
    marker: str = ""  # a file the command creates when it runs
    literal: str = ""  # text that, stored, must be shown as it is by `status`/`history`
    job: str = ""  # the job the reports look at afterwards

    @property
    def elsewhere(self) -> bool:
        """It names another ledger: the scenario's own cannot have changed."""
        return "--db" in self.argv or "ONCE_DATABASE_URL_FILE" in self.env


def _control(text: str) -> list[str]:
    """The raw control characters in output (line breaks and tabs are text)."""
    return sorted({f"U+{ord(ch):04X}" for ch in text
                   if ch not in "\n\t" and unicodedata.category(ch) == "Cc"})


class Hostile:
    def __init__(self, config: Config, backend: Backend, outdir: Path) -> None:
        self.config = config
        self.backend = backend
        self.outdir = outdir
        self.rng = random.Random(config.seed ^ 0x5EED)
        self.url = backend.new_ledger()
        self.env = base_env(self.url, outdir)
        self.files = outdir / "files"
        self.files.mkdir(parents=True, exist_ok=True)
        self.markers = outdir / "markers"
        self.markers.mkdir(exist_ok=True)
        self.now = datetime.now(UTC)
        self.known = "hostile-base"  # a job that has run: reports and reruns name it

    # -- processes ---------------------------------------------------------------------------

    def once(self, argv: list[str], env: dict[str, str] | None = None,
             drop: tuple[str, ...] = ()) -> tuple[int, str, str]:
        full = {k: v for k, v in {**self.env, **(env or {})}.items() if k not in drop}
        try:
            done = subprocess.run([ONCE, *argv], env=full, capture_output=True, timeout=120,
                                  stdin=subprocess.DEVNULL, cwd=self.outdir)
        except subprocess.TimeoutExpired:
            return -1, "", "hung for 120s"
        return (done.returncode, done.stdout.decode("utf-8", "replace"),
                done.stderr.decode("utf-8", "replace"))

    def marker(self) -> str:
        return str(self.markers / f"m-{uuid.uuid4().hex}")

    def file(self, content: bytes) -> str:
        path = self.files / uuid.uuid4().hex
        path.write_bytes(content)
        return str(path)

    # -- judging -----------------------------------------------------------------------------

    def judge(self, item: Input) -> tuple[int, list[str]]:
        """The input's exit status, and what went wrong with it (nothing: an empty list).
        A refused input (2 or 75) must have left the ledger as it was."""
        command = item.argv[0]
        before = self.counts()
        code, out, err = self.once(item.argv, item.env, item.drop)
        problems = self.answer_problems(command, code, out, err,
                                        raw_stdout=command == "state" and len(item.argv) == 2)
        if item.expect is not None and code not in item.expect and code != -1:
            problems.append(f"exit {code}, expected {sorted(item.expect)}: "
                            f"{err.strip()[:160]!r}")
        if item.marker and code in (2, 75) and os.path.exists(item.marker):
            problems.append(f"exit {code} but the command ran")
        if code in (2, 75) and self.counts() != before:
            problems.append(f"exit {code} but the ledger changed: {before} -> {self.counts()}")
        return code, problems

    def counts(self) -> tuple[int, ...]:
        """Rows and watermark versions in the ledger: what a refused input must not change."""
        try:
            rows = self.backend.query(self.url, """
                SELECT (SELECT count(*) FROM once_runs), (SELECT count(*) FROM once_attempts),
                       (SELECT count(*) FROM once_jobs),
                       (SELECT coalesce(sum(state_version), 0) FROM once_jobs)""")
        except Exception:  # no tables yet
            return ()
        return tuple(int(value) for value in rows[0])

    @staticmethod
    def answer_problems(command: str, code: int, out: str, err: str,
                        raw_stdout: bool = False) -> list[str]:
        problems = []
        if code == -1:
            return ["hung for 120s"]
        if "Traceback" in err:
            problems.append("traceback: " + err.strip().splitlines()[-1][:200])
        if code not in DOCUMENTED[command]:
            problems.append(f"exit {code}, not documented for once {command}: "
                            f"{err.strip()[-160:]!r}")
        lines = [line for line in err.splitlines() if line.strip()]
        if code == 2 and command != "check" and (
                len(lines) != 1 or not lines[0].startswith("once: ")):
            problems.append(f"exit 2 without one once: line: {err.strip()[:200]!r}")
        if code in (69, 75) and (not lines or not all(line.startswith("once: ")
                                                      for line in lines)):
            problems.append(f"exit {code} without once: lines: {err.strip()[:200]!r}")
        raw = _control(err) + ([] if raw_stdout else _control(out))
        if raw:
            problems.append(f"raw control characters {raw} in the output of once {command}")
        return problems

    def reports(self, item: Input) -> list[str]:
        """Every report after the input: it reads the ledger, prints no control character,
        and shows stored hostile text as it is."""
        job = item.job or self.known
        known = self.known
        plans: list[list[str]] = [
            ["status"], ["status", "--json"], ["status", known, "--timeline"], ["check"],
            ["check", "--json"], ["metrics"], ["history", known], ["history", job],
            ["history", job, "--json"], ["logs", known], ["state", known]]
        if job != known:
            plans += [["status", job], ["check", job]]
        problems: list[str] = []
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(self.once, plans))
        for argv, (code, out, err) in zip(plans, answers, strict=True):
            found = self.answer_problems(argv[0], code, out, err,
                                         raw_stdout=argv[0] == "state")
            if code == 75:
                found.append(f"the ledger cannot be read: {err.strip()[:160]!r}")
            if code == 2 and argv[1:2] == [known]:
                found.append(f"the known job is unknown: {err.strip()[:160]!r}")
            problems += [f"then once {' '.join(argv)[:80]!r}: {p}" for p in found]
        if item.literal:
            shown = answers[0][1] + answers[7][1]
            if item.literal not in shown:
                problems.append(f"{item.literal!r} is not shown as it is by status/history")
        return problems

    # -- inputs ------------------------------------------------------------------------------

    def families(self) -> dict[str, Callable[[], list[Input]]]:
        return {"urls": self.urls, "secret files": self.secrets, "limits": self.limits,
                "period edges": self.periods, "hostile text": self.text,
                "state and prune": self.state_prune}

    def run_cmd(self, job: str, *extra: str, marker: str = "") -> list[str]:
        return ["run", "--job", job, "--every", "day", *extra, "--", "touch",
                marker or str(self.files / "ran")]

    def urls(self) -> list[Input]:
        base = self.url
        found: list[Input] = []
        hosts = ["[::1", "[zz]", "[::1]:99999", "host:port", "h" * 300, "%2Fnonexistent",
                 "[link=https://evil.example/]db", "b\u00fccher.example", "@@", ":", "[]"]
        if base.startswith("sqlite"):
            paths = [str(self.files / "[bold]x[/].db"), str(self.files / "a%1b[2Jb.db"),
                     "/nonexistent-dir/x.db", str(self.files), "", str(self.files / "d?x=1")]
            urls = [f"sqlite:///{p}" for p in paths] + ["sqlite://x", "sqlite:///"] + [
                f"postgresql://u@{h}/x" for h in hosts[:4]]
        elif base.startswith("postgresql"):
            scheme, rest = base.split("://", 1)
            userinfo = rest.partition("@")[0]
            urls = [f"{scheme}://{userinfo}@{h}/x" for h in hosts]
            params = ["sslmode=disable", "sslmode=require", "sslmode=bogus",
                      "host=/nonexistent", "host=", "options=-csearch_path%3Dpublic",
                      "options=-cbogus", "connect_timeout=abc", "connect_timeout=-1",
                      "application_name=%1b%5b2J", "bogus=1", "password=secret",
                      "sslrootcert=/nonexistent"]
            urls += [f"{base}{'&' if '?' in base else '?'}{p}" for p in params]
        else:
            scheme, rest = base.split("://", 1)
            userinfo = rest.partition("@")[0]
            urls = [f"{scheme}://{userinfo}@{h}/x" for h in hosts]
            params = ["charset=utf8mb4", "charset=UTF8MB4", "charset=latin1", "charset=",
                      "unix_socket=/nonexistent", "ssl_ca=/nonexistent",
                      f"ssl_ca={self.file(b'not a certificate')}", "ssl_cert=/nonexistent",
                      "ssl_key=x&ssl_cert=y", "connect_timeout=abc", "connect_timeout=0",
                      "connect_timeout=-1", "connect_timeout=5", "bogus=1", "ssl_bogus=1"]
            urls += [f"{base}{'&' if '?' in base else '?'}{p}" for p in params]
        urls += ["nonsense", "://", "oracle://x/y", f"{base}\x1b[2J", f"{base}#frag"]
        for url in urls:
            command = self.rng.choice([["status"], ["check"], ["history", "x"], ["metrics"],
                                       ["prune", "--older-than", "400d"], ["schema"],
                                       ["state", "x"], ["logs", "x"]])
            marker = self.marker()
            found.append(Input("urls", f"run --db {url[:60]!r}",
                               self.run_cmd(f"u{uuid.uuid4().hex[:6]}", "--db", url,
                                            marker=marker), marker=marker))
            found.append(Input("urls", f"{command[0]} --db {url[:60]!r}",
                               [*command, "--db", url]))
        return found

    def secrets(self) -> list[Input]:
        contents = {"binary": b"\xff\xfe\x00\x01pw", "empty": b"", "newlines": b"\n\n",
                    "huge": b"x" * (65 * 1024), "nul": b"pw\x00x", "escape": b"p\x1b[2Jw",
                    "trailing": b"pw\r\n\n"}
        found = []
        for name, content in contents.items():
            path = self.file(content)
            marker = self.marker()
            found.append(Input("secret files", f"--db-password-file ({name})",
                               self.run_cmd("s-pw", "--db-password-file", path, marker=marker),
                               marker=marker))
            url_file = self.file(content if name != "trailing" else
                                 self.url.encode() + b"\r\n\n")
            found.append(Input("secret files", f"ONCE_DATABASE_URL_FILE ({name})", ["status"],
                               env={"ONCE_DATABASE_URL_FILE": url_file},
                               drop=("ONCE_DATABASE_URL",),
                               expect={0} if name == "trailing" else {2}))
            marker = self.marker()
            found.append(Input("secret files", f"--ping-url-file ({name})",
                               self.run_cmd("s-ping", "--ping-url-file", path, marker=marker),
                               marker=marker, expect={2}))
        return found

    def limits(self) -> list[Input]:
        found = []
        for n, ok in ((199, True), (200, True), (201, False)):
            job = "j" * n
            found.append(Input("limits", f"job of {n}", self.run_cmd(job),
                               expect={0} if ok else {2}, job=job if ok else ""))
        for ns, job, ok in ((200, 54, True), (200, 55, False), (201, 1, False), (1, 200, True)):
            found.append(Input("limits", f"NS:JOB of {ns}+1+{job}",
                               self.run_cmd("k" * job, "--namespace", "n" * ns),
                               expect={0} if ok else {2},
                               job=f"{'n' * ns}:{'k' * job}" if ok else ""))
        # An empty ONCE_OWNER is an unset one: the default owner.
        for owner, ok in (("o" * 255, True), ("o" * 256, False), ("\u00e9" * 255, True),
                          ("\u00e9" * 256, False), ("", True), (" pod", True)):
            found.append(Input("limits", f"ONCE_OWNER of {len(owner)}",
                               self.run_cmd(f"owner-{len(owner)}-{ok}"),
                               env={"ONCE_OWNER": owner}, expect={0} if ok else {2}))
        for length, ok in ((255, True), (256, False)):
            rest = " * * * *"
            minutes = ("0," * length)[: length - len(rest)]
            spec = (minutes.rstrip(",") + rest).rjust(length, "0")
            found.append(Input("limits", f"--cron of {len(spec)}",
                               ["run", "--job", f"cron-{length}", "--cron", spec, "--", "true"],
                               expect={0} if ok else {2}))
        for length, ok in ((1000, True), (1001, False)):
            found.append(Input("limits", f"--reason of {length}",
                               ["rerun", "--job", self.known, "--period",
                                self.now.strftime("%Y-%m-%d"), "--reason", "r" * length, "--",
                                "true"], expect={0, 69} if ok else {2}))
        for size, ok in ((64 * 1024, True), (64 * 1024 + 1, False)):
            found.append(Input("limits", f"a watermark of {size} bytes",
                               ["state", self.known], env={"ONCE_STATE_SET": "w" * size},
                               expect={0} if ok else {2}))
        found.append(Input("limits", "--tz of 65", self.run_cmd("tz65", "--tz", "Z" * 65),
                           expect={2}))
        found.append(Input("limits", "--lag past its limit", self.run_cmd("lag", "--lag",
                                                                          "100001"),
                           expect={2}))
        return found

    def periods(self) -> list[Input]:
        future = (self.now + timedelta(days=3)).strftime("%Y-%m-%d")
        found = []
        for key, expect in (("0001-01-01", {0}), ("0999-12-31", {0}), ("9999-12-31", {2}),
                            ("9999-12-30", {2}), (future, {2}), ("2026-02-30", {2}),
                            ("0000-12-31", {2}), ("10000-01-01", {2})):
            found.append(Input("period edges", f"rerun --period {key}",
                               ["rerun", "--job", self.known, "--period", key, "--", "true"],
                               expect=expect))
        found.append(Input("period edges", "rerun --period 9999-12-30 --allow-future",
                           ["rerun", "--job", self.known, "--period", "9999-12-30",
                            "--allow-future", "--", "true"], expect={0}))
        found.append(Input("period edges", "rerun --period 9999-12-31 --allow-future",
                           ["rerun", "--job", self.known, "--period", "9999-12-31",
                            "--allow-future", "--", "true"], expect={0, 2}))
        job = "edge-year"
        for since, until, extra, expect in (
                ("0001", "0003", [], {0}), ("9997", "9999", [], {2}),
                ("9997", "9999", ["--allow-future"], {0, 2}),
                ("0998", "1001", [], {0})):
            found.append(Input("period edges", f"catchup --every year {since}..{until}",
                               ["catchup", "--job", job, "--every", "year", "--since", since,
                                "--until", until, *extra, "-q", "--", "true"], expect=expect,
                               job=job))
        found.append(Input("period edges", "catchup --until the future",
                           ["catchup", "--job", "edge-day", "--every", "day", "--since",
                            self.now.strftime("%Y-%m-%d"), "--until", future, "--", "true"],
                           expect={2}))
        found.append(Input("period edges", "catchup at the year 1, 14 hours ahead",
                           ["catchup", "--job", "edge-kiritimati", "--every", "hour", "--tz",
                            "Pacific/Kiritimati", "--since", "0001-01-01T00:00",
                            "--until", "0001-01-01T02:00", "--", "true"], expect={0, 2},
                           job="edge-kiritimati"))
        for first, last in (("0001-01-01", "0001-01-02"), ("9999-12-31", "9999-12-31T23:59"),
                            ("9999-12-31T23:00+14:00", "9999-12-31T23:59-12:00")):
            found.append(Input("period edges", f"periods {first}..{last}",
                               ["periods", "--every", "hour", "--tz", "Pacific/Kiritimati",
                                "--from", first, "--to", last]))
        return found

    def text(self) -> list[Input]:
        found = []
        for value in self.rng.sample(HOSTILE, 3) + self.rng.sample(MARKUP, 3):
            control = bool(_control(value)) or not value.isprintable()
            job_ok = not control and " " not in value and "\u200b" not in value
            found.append(Input("hostile text", f"job {value!r}", self.run_cmd(value),
                               expect={0} if job_ok else {2}, job=value if job_ok else "",
                               literal=value if job_ok else ""))
            found.append(Input("hostile text", f"namespace {value!r}",
                               self.run_cmd("nsjob", "--namespace", value),
                               expect={0} if job_ok else {2},
                               job=f"{value}:nsjob" if job_ok else ""))
            owner_ok = value.isprintable()
            owned = f"own-{uuid.uuid4().hex[:6]}"
            found.append(Input("hostile text", f"owner {value!r}", self.run_cmd(owned),
                               env={"ONCE_OWNER": value}, expect={0} if owner_ok else {2},
                               job=owned if owner_ok else "",
                               literal=value if owner_ok and "[" in value else ""))
            found.append(Input("hostile text", f"reason {value!r}",
                               ["rerun", "--job", self.known, "--period",
                                self.now.strftime("%Y-%m-%d"), "--reason", value, "--",
                                "true"], expect={0, 69}, job=self.known))
            found.append(Input("hostile text", f"watermark {value!r}",
                               ["state", self.known, "--set", value], expect={0}))
            found.append(Input("hostile text", f"URL {value!r}",
                               ["status", "--db", f"sqlite:///{self.files}/{value}.db"]))
        return found

    def state_prune(self) -> list[Input]:
        return [
            Input("state and prune", "state of an unknown job", ["state", "never-ran"],
                  expect={2}),
            Input("state and prune", "state --set of an unknown job",
                  ["state", "never-ran", "--set", "x"], expect={2}),
            Input("state and prune", "state --set, seeded", ["state", "seeded", "--set",
                                                             "x", "--every", "5m"],
                  expect={0}, job="seeded"),
            Input("state and prune", "state --set ''", ["state", self.known, "--set", ""],
                  expect={0}),
            Input("state and prune", "state --set of a job past its limit",
                  ["state", "j" * 201, "--set", "x", "--every", "day"], expect={2}),
            Input("state and prune", "state --set not UTF-8",
                  ["state", self.known, "--set", "\udcff"], expect={2}),
            Input("state and prune", "prune --older-than 1s", ["prune", "--older-than", "1s",
                                                               "--dry-run"], expect={0}),
            Input("state and prune", "prune --older-than 0", ["prune", "--older-than", "0"],
                  expect={2}),
            Input("state and prune", "prune --older-than 36500d",
                  ["prune", "--older-than", "36500d"], expect={0}),
            Input("state and prune", "prune --older-than 36501d",
                  ["prune", "--older-than", "36501d"], expect={2}),
            Input("state and prune", "prune --older-than 400d", ["prune", "--older-than",
                                                                 "400d"], expect={0}),
        ]


def run(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    hostile = Hostile(config, backend, outdir)
    code, _out, err = hostile.once(hostile.run_cmd(hostile.known))
    if code != 0:
        row = Row("bad input: hostile values, then every report")
        row.fail(f"the first run failed: {err.strip()[:200]}")
        return [row]
    rows = []
    for family, make in hostile.families().items():
        row = Row(f"bad input: {family}, then every report")
        inputs = make()
        wanted = config.count(len(inputs), least=min(len(inputs), 4))
        if wanted < len(inputs):
            inputs = hostile.rng.sample(inputs, wanted)
        exits: list[str] = []
        for n, item in enumerate(inputs, 1):
            code, problems = hostile.judge(item)
            # A refused input left the ledger as it was (judge counts its rows), and one
            # that named another ledger did not touch it: the reports are read again after
            # every other input, and after the family's last.
            if (code not in (2, 75) and not item.elsewhere) or n == len(inputs):
                problems += hostile.reports(item)
            row.judge(problems, f"{item.label} ({' '.join(item.argv)[:100]!r})")
            exits.append(f"{item.argv[0]} {code}")
        row.note(f"exits: {histogram(exits)}")
        rows.append(row)
    return rows
