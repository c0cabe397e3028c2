"""Scenario 5, bad input: hypothesis-generated argument vectors for `once run`,
`once catchup` and `once periods`, run as real processes.

An argument vector is built from components (job name, schedule, zone, URL, durations,
counts, --since/--until, --from/--to, stray options), each drawn as valid, invalid (outside
the contract: a spec, zone, duration, URL... that the README does not allow, or a ledger that
cannot be reached), or edge (allowed or refused, the contract does not say: extreme dates,
huge numbers, odd spellings). Options come in random order.

- With an invalid component: exit 2 or 75, one `once:` line on stderr, no traceback, and the
  command (a marker: `touch FILE`) never ran.
- With valid and edge components only (one example in five): no traceback; `once periods`
  exits 0 when every component is valid, 0 or 2 with an edge; `run`/`catchup` exit 0, 2 or
  75, and never run the marker when they exit 2 or 75.

Every process must end within a minute (a hang is a loss too). Examples are not shrunk: each
is a process or four, and every failing vector is reported as it was.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
import zoneinfo
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import hostile
from common import ONCE, Backend, Config, Row, base_env, histogram

VALID, INVALID, EDGE = "valid", "invalid", "edge"


@dataclass
class Example:
    command: str
    argv: list[str]
    classes: dict[str, str] = field(default_factory=dict)  # component -> class
    marker: str = ""

    @property
    def invalid(self) -> list[str]:
        return [k for k, v in self.classes.items() if v == INVALID]

    @property
    def all_valid(self) -> bool:
        return all(v == VALID for v in self.classes.values())


# -- components ----------------------------------------------------------------------------------

EVERY_VALID = ["minute", "5m", "15m", "30m", "60m", "hour", "2h", "6h", "24h", "day", "week",
               "month", "quarter", "year"]
EVERY_INVALID = ["7m", "13m", "0m", "45m", "5h", "7h", "25h", "0h", "48h", "-1m", "1.5h", "m",
                 "h", "hours", "fortnight", "", "  ", "1 m", "60s", "minutes", "Day", "HOUR",
                 "05m", "+5m", "5M", "１m", "day\n", "dia"]
CRON_VALID = ["*/5 * * * *", "0 2 * * *", "30 1 1 * *", "0 0 * * 1", "15 */6 * * *",
              "0 9-17 * * 1-5", "* * * * 7"]
CRON_INVALID = ["* * * *", "* * * * * *", "61 * * * *", "* 24 * * *", "* * 0 * *",
                "* * 32 * *", "* * * 13 *", "* * * * 8", "hello", "", "@reboot", "@daily",
                "0 0 31 2 *", "0 0 30 2 *", "*/0 * * * *", "1-0 * * * *", "a b c d e"]
TZ_VALID = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
            "Asia/Kathmandu", "Pacific/Apia", "America/Santiago", "Pacific/Chatham"]
TZ_INVALID = ["Mars/Olympus", "", "Europe/Berln", "../../../etc/passwd", "/etc/localtime",
              "Europe", "UTC/", "Etc/GMT+15", " UTC", "Europe//Berlin", "America/New York"]
TZ_EDGE = ["utc", "posix/Europe/Berlin", "right/UTC", "Etc/GMT-14", "EST5EDT", "localtime",
           "Factory", "GMT0", "Zulu"]
DURATION_VALID = ["90", "90s", "5m", "2h", "1d", "1h30m", "45s", "3m"]
DURATION_INVALID = ["", "0", "0s", "0m0s", "-5", "5x", "1.5s", "s", "m5", "5 s", "１０s",
                    "1h1h", "1m1h", "5sec", " 5s", "5s ", "1e3", "inf", "nan", "-1m", "5S"]
DURATION_EDGE = ["9" * 30, "99999999999999999999d", "1000000d", "0090", "00001s"]
COUNT_INVALID = ["-1", "x", "1.5", "", "+", "1e3", "0x10"]
# Python's int() reads "٣" (Arabic-Indic three), "1_000" and " 2": click takes them as numbers.
COUNT_EDGE = ["9" * 25, "+3", "03", "1_000", " 2", "٣"]
INSTANT_INVALID = ["yesterday", "2026-13-01", "2026-02-30", "", "2026-03-08T25:00", "x",
                   "2026/03/08", "08-03-2026", "2026-03-08T01:30:99", "2026-Q0", "2026-W99",
                   "2026-00"]
# Pairs for --from/--to, close together: a range of centuries of minutes would be a flood of
# output, not a fault.
INSTANT_EDGE = [("9999-12-31", "9999-12-31T23:59"), ("0001-01-01", "0001-01-01T00:30"),
                ("0001-01-01", "0001-01-02"), ("9999-12-30", "9999-12-31"),
                ("9999-12-31T23:00", "9999-12-31T23:59:59"), ("1970-01-01T00:00Z", "1970-01-02"),
                ("2025-W53", "2026-01-05"), ("2026-Q5", "2026-Q6"), ("9999-12", "9999-12-31"),
                ("2024-02-29T24:00", "2024-03-01"), ("-0001-01-01", "0001-01-01"),
                ("+12026-01-01", "+12026-01-02"), ("2026-03-08T02:30", "2026-03-08T03:30"),
                ("2026-11-01T01:30", "2026-11-01T01:45"), ("2026-02-29", "2026-03-01"),
                ("0001-01-01T00:00+14:00", "0001-01-01T01:00+14:00"),
                ("9999-12-31T23:59-12:00", "9999-12-31T23:59:59-12:00")]
# --since/--until of a catch-up: near now, whatever they say (a catch-up over centuries is
# a long job, not a fault).
CATCHUP_EDGE = ["2025-W53", "2026-Q5", "2026-02-29", "2024-02-29T24:00", "2026-13", "9999-99"]
# Unknown options only: an option that takes a value would be overridden by a later one.
OPTION_JUNK = ["--bogus", "-x", "--no-such-option", "--jobs", "-Z", "--every-day"]


def _strategies(backend_url: str, now: datetime):  # type: ignore[no-untyped-def]
    """The hypothesis strategies, built here so that importing this module costs nothing."""
    from hypothesis import strategies as st

    def cls(valid, invalid, edge=None):  # type: ignore[no-untyped-def]
        options = [st.tuples(st.just(VALID), valid), st.tuples(st.just(INVALID), invalid)]
        if edge is not None:
            options.append(st.tuples(st.just(EDGE), edge))
        return options

    printable = st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp", "Cf", "Co",
                                                    "Cn"), blacklist_characters="\x00")
    job_valid = st.builds(lambda s: f"j{uuid.uuid4().hex[:8]}{s}",
                          st.text(printable, max_size=12))
    job_invalid = st.one_of(
        st.sampled_from(["", " x", "a b", "x" * 201, "tab\tname", "\x01ctrl", "zw\u200bsp",
                         "nl\nx", "é\u00a0x"]),
        st.text(printable, min_size=1, max_size=5).map(lambda s: s + " " + s))
    every_invalid = st.one_of(
        st.sampled_from(EVERY_INVALID),
        st.text(max_size=10).filter(lambda s: "\x00" not in s and not _maybe_every(s)))
    tz_names = zoneinfo.available_timezones()
    tz_invalid = st.one_of(
        st.sampled_from(TZ_INVALID),
        st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=20).filter(
            lambda s: s not in tz_names and s not in TZ_EDGE and s.strip("/. ") == s
            and not Path("/usr/share/zoneinfo", s).exists()))
    host = st.sampled_from(["127.0.0.1", "localhost", "[::1]", ""])
    text = st.text(st.characters(blacklist_characters="\x00/@?#"), max_size=8)
    url_invalid = st.one_of(
        st.sampled_from([
            "postgresql://postgres@127.0.0.1:1/x", "mariadb://root@127.0.0.1:1/x",
            "mysql://root@127.0.0.1:2/x", "sqlite:////nonexistent-torture-dir/x.db",
            "nonsense", "http://x/y", "sqlite://x", "sqlite:///", "mysql://127.0.0.1",
            "mysql://127.0.0.1/db?bogus=1", "mysql://127.0.0.1:99999/db",
            "mysql://127.0.0.1:port/db", "mariadb://[::1/db", "postgresql://[/x",
            "oracle://127.0.0.1/x", "", "://", "sqlite", "mysql://u:p@127.0.0.1:0/db",
            "postgresql://nobody@127.0.0.1:1/x?sslmode=bogus"]),
        st.builds(lambda s, h, t: f"{s}://{t}@{h}:1/{t or 'd'}",
                  st.sampled_from(["postgresql", "mysql", "mariadb", "postgres"]), host, text),
        st.builds(lambda t: f"mysql://root@127.0.0.1:1/d?{t}=1",
                  st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1,
                          max_size=6).filter(lambda t: not t.startswith("ssl")
                                             and t not in ("charset", "unix_socket",
                                                           "connect_timeout"))))
    duration = cls(st.sampled_from(DURATION_VALID),
                   st.one_of(st.sampled_from(DURATION_INVALID),
                             st.text(max_size=6).filter(
                                 lambda s: "\x00" not in s and not re.fullmatch(
                                     r"[0-9]+|([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?", s))),
                   st.sampled_from(DURATION_EDGE))

    def count(low: int, high: int, invalid_extra: list[str]):  # type: ignore[no-untyped-def]
        return cls(st.integers(low, high).map(str),
                   st.sampled_from(COUNT_INVALID + invalid_extra), st.sampled_from(COUNT_EDGE))

    recent = st.integers(0, 600).map(
        lambda s: (now - timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%MZ"))
    instant_invalid = st.one_of(st.sampled_from(INSTANT_INVALID),
                                st.text(st.characters(blacklist_characters="\x00"),
                                        max_size=12).filter(_not_instantish))
    return {
        "job": cls(job_valid, job_invalid),
        "every": cls(st.sampled_from(EVERY_VALID), every_invalid),
        "cron": cls(st.sampled_from(CRON_VALID), st.sampled_from(CRON_INVALID)),
        "tz": cls(st.sampled_from(TZ_VALID), tz_invalid, st.sampled_from(TZ_EDGE)),
        "db": cls(st.just(backend_url), url_invalid),
        "duration": duration,
        "lag": count(0, 3, []),
        "catchup": count(0, 3, []),
        "max-attempts": count(1, 5, ["0"]),
        "skipped-exit-code": count(0, 255, ["256", "-1", "1000"]),
        "max": count(1, 5, ["0"]),
        "since": cls(recent, instant_invalid, st.sampled_from(CATCHUP_EDGE)),
        "until": cls(st.just(now.strftime("%Y-%m-%dT%H:%MZ")), instant_invalid,
                     st.sampled_from(CATCHUP_EDGE)),
        "instant_invalid": instant_invalid,
        "junk": st.sampled_from(OPTION_JUNK),
    }


def _maybe_every(text: str) -> bool:
    """Might this be a valid --every spec (then it is no invalid example)?"""
    return bool(re.fullmatch(r"[0-9]+[mh]|minute|hour|day|week|month|quarter|year", text))


def _not_instantish(text: str) -> bool:
    """Surely no date, instant or period key (digits, dashes, colons... could be one)."""
    return bool(text) and "\x00" not in text and not re.search(r"[0-9]", text)


def _examples(strategies, command: str, data, marker_dir: Path) -> Example:  # type: ignore[no-untyped-def]
    """One argument vector for `once COMMAND`, built from drawn components."""
    from hypothesis import strategies as st

    draw = data.draw
    forced = draw(st.integers(0, 2)) != 0  # two in three vectors hold an invalid part
    parts: list[tuple[str, str, list[str]]] = []  # (component, class, tokens)

    # Without a forced invalid part, the vector explores valid and edge values only.
    weight_invalid, weight_edge = (15, 15) if forced else (0, 35)

    def pick(name: str, option: str, key: str | None = None) -> None:
        options = strategies[key or name]
        roll = draw(st.integers(0, 99))
        index = 0
        if roll < weight_invalid:
            index = 1
        elif roll < weight_invalid + weight_edge and len(options) > 2:
            index = 2
        klass, value = draw(options[index])
        parts.append((name, klass, [option, value]))

    if command in ("run", "catchup"):
        if forced and draw(st.integers(0, 19)) == 0:
            parts.append(("job", INVALID, []))  # --job missing
        else:
            pick("job", "--job")
    schedule = draw(st.sampled_from(["every", "every", "every", "cron", "both", "none"]
                                    if forced else ["every", "every", "cron"]))
    if schedule in ("every", "both"):
        pick("every", "--every")
    if schedule in ("cron", "both"):
        pick("cron", "--cron")
    if schedule in ("both", "none"):
        parts.append(("schedule", INVALID, []))
    if draw(st.booleans()):
        pick("tz", "--tz")
    if command in ("run", "catchup"):
        if draw(st.integers(0, 3)) == 0:
            pick("db", "--db")
        for option in ("--stale-after", "--kill-after", "--timeout"):
            if draw(st.integers(0, 3)) == 0:
                pick(option, option, "duration")
        for option in ("lag", "max-attempts"):
            if draw(st.integers(0, 3)) == 0:
                pick(option, f"--{option}")
    if command == "run":
        for option in ("catchup", "skipped-exit-code"):
            if draw(st.integers(0, 3)) == 0:
                pick(option, f"--{option}")
    if command == "catchup":
        if not forced or draw(st.integers(0, 4)) != 0:
            pick("since", "--since")
        else:
            parts.append(("since", INVALID, []))  # a fresh job needs --since
        if draw(st.booleans()):
            pick("until", "--until")
        if draw(st.integers(0, 3)) == 0:
            pick("max", "--max")
    if command == "periods":
        base = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(
            minutes=draw(st.integers(0, 60 * 24 * 400)))
        span = timedelta(minutes=draw(st.integers(0, 60 * 24 * 3)))
        edge = draw(st.sampled_from(INSTANT_EDGE)) if draw(st.integers(0, 4)) == 0 else None
        for i, (name, option, at) in enumerate((("from", "--from", base),
                                                 ("to", "--to", base + span))):
            roll = draw(st.integers(0, 99))
            if forced and roll < 12:
                parts.append((name, INVALID, [option, draw(strategies["instant_invalid"])]))
            elif edge is not None:
                parts.append((name, EDGE, [option, edge[i]]))
            else:
                form = draw(st.sampled_from(["%Y-%m-%d", "%Y-%m-%dT%H:%M",
                                             "%Y-%m-%dT%H:%M:%S+00:00", "%Y-%m-%dT%H:%MZ"]))
                parts.append((name, VALID, [option, at.strftime(form)]))
        if draw(st.booleans()):
            parts.append(("json", VALID, ["--json"]))
    if forced and draw(st.integers(0, 14)) == 0:
        parts.append(("junk", INVALID, [draw(strategies["junk"])]))
    if forced and not any(k == INVALID for _, k, _ in parts):
        # Make one of the components invalid (or add a stray option).
        choices = [i for i, (name, _, tokens) in enumerate(parts)
                   if tokens and name in strategies]
        if choices and draw(st.booleans()):
            i = draw(st.sampled_from(choices))
            name, _, tokens = parts[i]
            _, value = draw(strategies[name][1])
            parts[i] = (name, INVALID, [tokens[0], value])
        else:
            parts.append(("junk", INVALID, [draw(strategies["junk"])]))
    order = draw(st.permutations(range(len(parts))))
    argv = [ONCE, command]
    for i in order:
        argv += parts[i][2]
    marker = ""
    if command in ("run", "catchup"):
        marker = str(marker_dir / f"m-{uuid.uuid4().hex}")
        argv += ["--", "touch", marker]
    classes: dict[str, str] = {}
    for name, klass, _ in parts:  # a component drawn twice keeps its worst class
        if classes.get(name) != INVALID:
            classes[name] = klass if classes.get(name) != EDGE or klass == INVALID else EDGE
    return Example(command, argv, classes, marker)


def _run(example: Example, env: dict[str, str], cwd: Path) -> list[str]:
    """Run one example; what went wrong (nothing: an empty list)."""
    try:
        done = subprocess.run(example.argv, env=env, cwd=cwd, capture_output=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return ["hung for 60s"]
    except ValueError as exc:  # an argument the OS cannot pass (never generated)
        return [f"cannot start: {exc}"]
    err = done.stderr.decode(errors="replace")
    code = done.returncode
    ran = bool(example.marker) and os.path.exists(example.marker)
    problems = []
    if "Traceback" in err:
        problems.append("traceback: " + err.strip().splitlines()[-1][:200])
    if example.invalid:
        allowed = {2, 75}
    elif example.command == "periods":
        allowed = {0} if example.all_valid else {0, 2}
    else:
        allowed = {0, 2, 75}
    if code not in allowed:
        problems.append(f"exit {code} (expected {sorted(allowed)})")
    if ran and (example.invalid or code in (2, 75)):
        problems.append("the command ran")
    if code in (2, 75):
        lines = [line for line in err.splitlines() if line.strip()]
        if len(lines) != 1 or not lines[0].startswith("once: "):
            problems.append(f"stderr is not one once: line: {err.strip()[:200]!r}")
    return problems


def run(config: Config, backend: Backend, outdir: Path) -> list[Row]:
    outdir.mkdir(parents=True, exist_ok=True)
    url = backend.new_ledger()
    env = base_env(url, outdir)
    cwd = outdir / "cwd"
    cwd.mkdir(exist_ok=True)
    markers = outdir / "markers"
    markers.mkdir(exist_ok=True)
    strategies = _strategies(url, datetime.now(UTC))
    rows = []
    for command, base in (("run", 200), ("catchup", 120), ("periods", 120)):
        rows.append(_explore(config, command, base, strategies, env, cwd, markers))
    return rows + hostile.run(config, backend, outdir / "hostile")


def _explore(config: Config, command: str, base: int, strategies,  # type: ignore[no-untyped-def]
             env: dict[str, str], cwd: Path, markers: Path) -> Row:
    """Let hypothesis draw argument vectors for one command, four processes at a time."""
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    row = Row(f"bad input: `once {command}`")
    kinds: list[str] = []
    batch = 4
    with ThreadPoolExecutor(batch) as pool:

        @settings(max_examples=max(1, config.count(base) // batch), deadline=None,
                  database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @seed(config.seed)
        @given(st.data())
        def explore(data) -> None:  # type: ignore[no-untyped-def]
            examples = [_examples(strategies, command, data, markers) for _ in range(batch)]
            results = pool.map(lambda e: _run(e, env, cwd), examples)
            for example, problems in zip(examples, results, strict=True):
                bad = ",".join(example.invalid) or "none"
                row.judge(problems, f"{example.argv[1:]!r} (invalid: {bad})")
                kinds.append("with an invalid part" if example.invalid else "valid/edge")

        explore()
    row.note(f"vectors: {histogram(kinds)}")
    return row
