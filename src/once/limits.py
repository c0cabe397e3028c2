"""What `once` accepts from outside, in one place for the command line and the Python API.

Each limit is one the ledger's columns impose (the same on every backend, so that a value
never passes on SQLite and fails on PostgreSQL, nor is silently cut short by a MySQL server
without strict mode) or one a later command needs to read the value back. A value outside
them is an InputError (a ValueError): the CLI turns it into one `once:` line and exit 2, the
Python API raises it; either way before anything is sent to the ledger.

This module is on the hot path of every cron fire: standard library only, nothing imported.
"""

from __future__ import annotations

NAME_MAX = 200  # characters of a job name, and of a namespace
KEY_MAX = 255  # characters of a stored name (NS:JOB): once_runs.job is VARCHAR(255)
OWNER_MAX = 255  # characters of ONCE_OWNER: once_runs.owner is VARCHAR(255)
SCHEDULE_MAX = 255  # characters of a cron expression: once_jobs.schedule is VARCHAR(255)
TZ_MAX = 64  # characters of a zone name: once_jobs.tz is VARCHAR(64)
REASON_MAX = 1000  # characters of a rerun --reason (MySQL's TEXT ends at 64 KiB of bytes)
STATE_LIMIT = 64 * 1024  # bytes of UTF-8 in a watermark
SECRET_MAX = 64 * 1024  # bytes of a --db-password-file or ONCE_DATABASE_URL_FILE
LAG_MAX = 100_000  # --lag is counted out period by period: a typo must not spin for hours
CATCHUP_MAX = LAG_MAX  # --catchup N: the window of N periods is counted out the same way
ATTEMPTS_MAX = 2**31 - 1  # once_runs.attempt is a 32-bit integer
SHARDS_MAX = 1000
DURATION_MAX = 36500 * 86400  # seconds: the OS's timers overflow past about 292 years
OUTPUT_TAIL = 16 * 1024  # --output-tail's default: bytes of output kept with an attempt
OUTPUT_TAIL_MAX = 1024 * 1024  # once_attempts.output holds this (MEDIUMTEXT on MySQL)
PING_BODY_MAX = 10 * 1024  # --ping-body-tail's default is at most this (healthchecks.io: 100 KB)


class InputError(ValueError):
    """A value `once` refuses (usage: exit 2); the message is one line for the user."""


def utf8(label: str, value: str) -> str:
    """value, if it can be stored: UTF-8 text (a command line or an environment that is not
    UTF-8 reaches Python as lone surrogates) without NUL (PostgreSQL's text cannot hold it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{label} is not UTF-8 text") from None
    if "\0" in value:
        raise InputError(f"{label} holds a NUL character")
    return value


def text(label: str, value: object, optional: bool = False) -> None:
    """A parameter the Python API takes as text: a str (None too, when optional), so that
    a number passed by mistake is an InputError, never a TypeError from deep inside."""
    if not (isinstance(value, str) or (optional and value is None)):
        raise InputError(f"bad {label} {value!r}: give a string")


def name(label: str, value: str) -> str:
    """A job name or a namespace: 1 to NAME_MAX printable characters without whitespace."""
    if (not isinstance(value, str) or not value or len(value) > NAME_MAX
            or not value.isprintable() or any(ch.isspace() for ch in value)):
        raise InputError(f"bad {label} {value!r}: use 1 to {NAME_MAX} printable characters "
                         f"without whitespace")
    return value


def stored_name(job: str, namespace: str | None, kind: str = "job") -> str:
    """The job's (or, kind "lead", a lead name's) name as the ledger stores it (NS:JOB with a
    namespace), checked whole."""
    name(f"{kind} name", job)
    if namespace is None:
        return job
    name("namespace", namespace)
    stored = f"{namespace}:{job}"
    if len(stored) > KEY_MAX:
        raise InputError(f"namespace and {kind} name make {len(stored)} characters "
                         f"({namespace[:20]}:{job[:20]}…): the ledger keeps at most {KEY_MAX}")
    return stored


def owner(value: str) -> str:
    """ONCE_OWNER: 1 to OWNER_MAX printable UTF-8 characters (no control characters: it is
    printed in every report, one line per finding). Refused, never cut short: two owners
    cut to one name could not be told apart."""
    utf8("ONCE_OWNER", value)
    if not value or len(value) > OWNER_MAX or not value.isprintable():
        raise InputError(f"bad ONCE_OWNER {value[:40]!r}: use 1 to {OWNER_MAX} printable "
                         f"characters, no control characters")
    return value


def reason(value: str) -> str:
    """A rerun --reason: UTF-8 text of at most REASON_MAX characters."""
    utf8("--reason", value)
    if len(value) > REASON_MAX:
        raise InputError(f"--reason is {len(value)} characters: at most {REASON_MAX}")
    return value


def state_problem(data: bytes) -> str:
    """What keeps data from being stored as a job's watermark, '' when nothing does: more
    than STATE_LIMIT bytes, a NUL (PostgreSQL's text cannot hold it: refused on every
    backend), or not UTF-8. For a watermark set by hand and one a command leaves."""
    if len(data) > STATE_LIMIT:
        return "is over 64 KiB"
    if b"\0" in data:
        return "holds a NUL byte"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "is not UTF-8"
    return ""


def state(value: str) -> str:
    """A watermark set by hand: UTF-8 text of at most STATE_LIMIT bytes."""
    utf8("the watermark", value)  # as every text given: then only its length can be wrong
    if state_problem(value.encode("utf-8")):
        raise InputError("a watermark holds at most 64 KiB of UTF-8")
    return value


def schedule(spec: str, tz: str) -> None:
    """A schedule as once_jobs stores it: the spec (a cron expression as given) and the zone."""
    utf8("the schedule", spec)
    if len(spec) > SCHEDULE_MAX:
        raise InputError(f"--cron expression is {len(spec)} characters: the ledger keeps at "
                         f"most {SCHEDULE_MAX}")
    if len(tz) > TZ_MAX:
        raise InputError(f"zone name is {len(tz)} characters: the ledger keeps at most "
                         f"{TZ_MAX}")


def count(label: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"bad {label} {value!r}: use an integer from {low} to {high}")
    return value


def seconds(label: str, value: float, zero_ok: bool = False) -> float:
    """A duration in seconds: more than zero (or zero, when it turns a check off), at most
    DURATION_MAX. A --stale-after of 0 would renew in a tight loop."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"bad {label} {value!r}: give seconds") from None
    low_ok = number >= 0 if zero_ok else number > 0
    if isinstance(value, bool) or not low_ok or not number <= DURATION_MAX:
        floor = "0" if zero_ok else "more than 0"
        raise InputError(f"bad {label} {value!r}: use {floor} to {DURATION_MAX} seconds")
    return number


def job(lag: int, max_attempts: int, stale_after: float, shards: int = 1) -> None:
    """The numbers that go with a claim."""
    count("lag", lag, 0, LAG_MAX)
    count("max_attempts", max_attempts, 1, ATTEMPTS_MAX)
    count("shards", shards, 1, SHARDS_MAX)
    seconds("stale_after", stale_after)


_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024 * 1024,
               "mb": 1024 * 1024, "mib": 1024 * 1024}


def size(label: str, value: str | int, limit: int = OUTPUT_TAIL_MAX) -> int:
    """`16KiB`, `10k`, `1MiB`, `512`, `0`: bytes (K, KB and KiB are all 1024), at most
    limit."""
    if isinstance(value, bool):
        raise InputError(f"bad {label} {value!r}: give a number of bytes")
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip()
        digits = text.rstrip("bBiIkKmM ")
        unit = text[len(digits):].strip().lower()
        if not digits.isdigit() or unit not in _SIZE_UNITS:
            raise InputError(f"bad {label} {value!r}: give a number of bytes, or with K, KiB, "
                             f"M or MiB (16KiB)")
        number = int(digits) * _SIZE_UNITS[unit]
    if not 0 <= number <= limit:
        raise InputError(f"bad {label} {value!r}: use 0 to {limit // 1024} KiB")
    return number


def read_secret(path: str, label: str) -> str:
    """The text of a secret's file (trailing line breaks dropped): UTF-8, not empty, at
    most SECRET_MAX bytes. The message names the file and never its content."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(SECRET_MAX + 1)
    except OSError as exc:
        raise InputError(f"cannot read {label} {path}: {exc.strerror or exc}") from None
    if len(data) > SECRET_MAX:
        raise InputError(f"{label} {path} is over 64 KiB: not a secret")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{label} {path} is not UTF-8 text") from None
    text = text.rstrip("\r\n")
    if not text:
        raise InputError(f"{label} {path} is empty")
    if "\0" in text:
        raise InputError(f"{label} {path} holds a NUL byte")
    return text
