"""Telling the world: dead-man pings (healthchecks.io, Cronitor, Uptime Kuma, any URL) and
--on-success / --on-failure / --on-skip hooks.

Neither ever changes the outcome, the claim or the exit status. Pings are bounded: once the
outcome is known, they delay `once run` by at most PING_BUDGET seconds in all (each request
times out after PING_TIMEOUT, a failed one is tried PING_TRIES times with backoff), and what
fails is one `once:` line on stderr that never shows the URL's path (it holds the key). A hook
runs in a process group of its own, which is killed whole after HOOK_TIMEOUT (a child it
left behind would hold once's stdout and stderr, and cron would wait for it); its failure
is one `once:` line. Only the standard library is
used (urllib), and only when a ping or hook is configured; of once, the words of an outcome
(once.outcomes).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from once.messages import say
from once.outcomes import SKIPS, Result

PING_TIMEOUT = 3.0  # seconds per request
PING_TRIES = 3
BACKOFF = (0.5, 1.0)  # seconds before the second and the third try
PING_BUDGET = PING_TRIES * PING_TIMEOUT + sum(BACKOFF)  # the most pings delay the exit
HOOK_TIMEOUT = 30.0  # _ONCE_HOOK_TIMEOUT shortens it, for the test suite only
SHELL = "/bin/sh"

Log = Callable[[str, str], None]  # (message, event): how a failure is told (--log-format)

SUCCESS = ("done",)
HOOK_OPTIONS = {"success": "--on-success", "failure": "--on-failure", "skip": "--on-skip"}


@dataclass
class Notifier:
    """What to tell, and where, for one `once run`."""

    ping_url: str | None = None
    ping_on_skip: bool = False
    ping_exit_status: bool = False  # healthchecks' URL/N form instead of URL/fail
    on_success: str | None = None
    on_failure: str | None = None
    on_skip: str | None = None
    body_tail: int = 0  # --ping-body-tail: bytes of the output sent with a result ping
    _start: threading.Thread | None = field(default=None, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _start_error: list[str] = field(default_factory=list, init=False, repr=False)

    @property
    def active(self) -> bool:
        return bool(self.ping_url or self.on_success or self.on_failure or self.on_skip)

    def started(self) -> None:
        """The command starts: ping URL/start, in the background (never delays the command)."""
        if not self.ping_url:
            return
        url = with_suffix(self.ping_url, "start")
        stop = self._stop = threading.Event()
        errors: list[str] = []
        self._start_error = errors
        self._start = threading.Thread(
            target=lambda: errors.append(ping(url, stop=stop)), daemon=True)
        self._start.start()

    def finished(self, outcome: Result, status: int, env: Mapping[str, str],
                 log: Log | None = None, output: bytes | None = None) -> None:
        """The period's outcome is known: ping (within PING_BUDGET), then run the hook.
        Failures are told through log (default: a plain `once:` line). output: the tail of
        the command's output (None: not captured), the result ping's body (POST) and the
        hook's ONCE_OUTPUT_FILE."""
        log = log or _plain
        deadline = time.monotonic() + PING_BUDGET
        failures: list[tuple[str, str]] = []  # (which ping, why)
        if self._start is not None:
            # The start ping makes no new try now; one in flight may end (it is bounded by
            # PING_TIMEOUT) so that the monitor sees start before the result.
            self._stop.set()
            self._start.join(PING_TIMEOUT + 0.5)
            error = ("no answer" if self._start.is_alive()
                     else next(iter(self._start_error), "failed"))
            if error:
                failures.append(("start", error))
            self._start = None
        url, which = self._result_url(outcome, status)
        if url:
            box: list[str] = []
            body = ping_body(output, self.body_tail)
            worker = threading.Thread(target=lambda: box.append(ping(url, deadline,
                                                                     body=body)),
                                      daemon=True)
            worker.start()
            worker.join(max(0.0, deadline - time.monotonic()) + 0.5)  # a hard bound
            error = box[0] if box else "no answer"
            if error:
                failures.append((which, error))
        if failures and self.ping_url:
            log(f"ping {redact_ping(self.ping_url)} failed: {_summary(failures)}",
                "ping-failed")
        kind = "skip" if outcome in SKIPS else "success" if outcome in SUCCESS else "failure"
        hook = {"success": self.on_success, "failure": self.on_failure,
                "skip": self.on_skip}[kind]
        if hook:
            # The output's file goes before a stop signal ends once (it held the output).
            with _HookStops() as stops, output_file(output, HOOK_OPTIONS[kind], log) as path:
                extra = {"ONCE_OUTPUT_FILE": path} if path else {}
                run_hook(hook, {**env, "ONCE_OUTCOME": outcome, "ONCE_STATUS": str(status),
                                **extra}, HOOK_OPTIONS[kind], log, stops)

    def _result_url(self, outcome: Result, status: int) -> tuple[str | None, str]:
        """The URL that tells outcome, and what to call it in a message."""
        if not self.ping_url:
            return None, ""
        if outcome in SKIPS:
            if not self.ping_on_skip:
                return None, ""
            if outcome == "skipped-failed":  # attempts used up: never report it as alive
                return with_suffix(self.ping_url, "fail"), "fail"
            return self.ping_url, "skip"
        if outcome in SUCCESS:
            return self.ping_url, "success"
        suffix = str(status) if self.ping_exit_status else "fail"
        return with_suffix(self.ping_url, suffix), suffix


def ping_body(output: bytes | None, limit: int) -> bytes | None:
    """The result ping's body: the last `limit` bytes of the output as UTF-8 text (as the
    ledger stores it); None (a GET) when nothing was captured or limit is 0."""
    if output is None or limit <= 0:
        return None
    from once.run.relay import lead_trimmed, text

    body = text(lead_trimmed(output[-limit:])).encode()
    return body if len(body) <= limit else lead_trimmed(body[-limit:])


@contextlib.contextmanager
def output_file(output: bytes | None, option: str = "hook",
                log: Log | None = None) -> Iterator[str]:
    """A file (mode 0600) holding the output's tail as captured, for a hook's
    ONCE_OUTPUT_FILE, removed when the hook is done; '' when nothing was captured, or when
    it cannot be written (a full or read-only temporary directory: told through log, and the
    hook runs without it, as hooks never change the outcome)."""
    if output is None:
        yield ""
        return
    import tempfile

    path = ""
    try:
        fd, path = tempfile.mkstemp(prefix="once-output-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(output)
    except OSError as exc:
        _remove(path)
        path = ""
        (log or _plain)(f"{option} hook: ONCE_OUTPUT_FILE could not be written "
                      f"({exc.strerror or exc}); the hook runs without it", "hook-failed")
    try:
        yield path
    finally:
        _remove(path)


def _remove(path: str) -> None:
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _summary(failures: list[tuple[str, str]]) -> str:
    """'start, fail: timed out' or 'start: timed out; fail: HTTP 404'."""
    if len({error for _, error in failures}) == 1:
        return f"{', '.join(which for which, _ in failures)}: {failures[0][1]}"
    return "; ".join(f"{which}: {error}" for which, error in failures)


def _plain(message: str, event: str) -> None:
    """The default Log: a plain `once:` line (once.messages.say; the event is JSON's alone)."""
    say(message, event=event)


def with_suffix(url: str, suffix: str) -> str:
    """URL/suffix, keeping a query string at the end (…/KEY/fail?rid=…)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{suffix}"))


def ping(url: str, deadline: float | None = None, stop: threading.Event | None = None,
         body: bytes | None = None) -> str:
    """GET url (POST body, when given), tried PING_TRIES times with backoff, until deadline
    (monotonic) if given.

    Returns '' on success, else why it failed (never the URL). A 4xx answer is not retried:
    the server would say the same again. stop, once set, ends the tries.
    """
    import urllib.error
    import urllib.request

    error = "no time left"
    for attempt in range(PING_TRIES):
        if attempt:
            pause = BACKOFF[attempt - 1]
            if deadline is not None and time.monotonic() + pause + 0.1 >= deadline:
                break
            if stop is not None:
                if stop.wait(pause):
                    break  # the result is known: a late start would come after it
            else:
                time.sleep(pause)
        timeout = PING_TIMEOUT
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout < 0.1:
                break
        try:
            headers = {"User-Agent": "once"}
            if body is not None:
                headers["Content-Type"] = "text/plain; charset=utf-8"
            request = urllib.request.Request(url, data=body, headers=headers)
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read(1024)
            return ""
        except urllib.error.HTTPError as exc:
            error = f"HTTP {exc.code}"
            if exc.code < 500:
                break
        except Exception as exc:  # refused, timed out, bad URL: retry, then report
            error = _why(exc)
    return error


def _why(exc: Exception) -> str:
    """A request's failure in words that never include the URL (its path holds the key)."""
    import http.client
    import urllib.error

    reason: object = exc
    while isinstance(inner := getattr(reason, "reason", None), BaseException):
        reason = inner  # URLError(reason=OSError(...)) and the like
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and isinstance(reason.strerror, str) and reason.strerror:
        return reason.strerror  # "Connection refused", "Name or service not known", …
    if isinstance(reason, http.client.HTTPException):
        return f"bad answer from the server ({type(reason).__name__})"
    if isinstance(reason, OSError | EOFError) and not isinstance(reason, urllib.error.URLError):
        return type(reason).__name__
    return "bad URL"  # URLError('no host given'), ValueError, InvalidURL: they quote the URL


def run_hook(command: str, env: Mapping[str, str], option: str = "hook",
             log: Log | None = None, stops: _HookStops | None = None) -> int | None:
    """Run a hook through /bin/sh with the run's environment; report, never raise.

    The hook leads a process group of its own: at the time limit, or when a stop signal ends
    once meanwhile, the whole group is killed, so that nothing it started keeps running (and
    keeps once's stdout and stderr open).
    Messages name the option, not the command, which may hold secrets of its own. `stops`:
    the caller's _HookStops, entered around what it must clean up first (ONCE_OUTPUT_FILE).
    """
    import signal
    import subprocess

    if stops is None:
        with _HookStops() as own:
            return run_hook(command, env, option, log, own)
    log = log or _plain
    limit = hook_timeout()
    if stops.numbers:  # a stop signal before it: it does not start
        raise _Stopped
    try:
        proc = subprocess.Popen([SHELL, "-c", command], env=dict(env),
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except (OSError, ValueError) as exc:
        log(f"{option} hook could not start: {getattr(exc, 'strerror', None) or exc}",
            "hook-failed")
        return None
    try:
        stops.arm()
        code = proc.wait(timeout=limit)
        stops.armed = False  # the hook is done: a signal now is noted, its file removed first
    except BaseException as exc:  # the limit, or once itself stopped: end the group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        log(f"{option} hook timed out after {limit:g}s and was killed, with every "
            f"process it started", "hook-failed")
        return None
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
        log(f"{option} hook {how}", "hook-failed")
    return code


class _Stopped(Exception):
    """A stop signal reached once while a hook ran."""


class _HookStops:
    """While a hook runs, a SIGTERM, SIGHUP or SIGINT that would end once where it is (its
    handler the default, or Python's KeyboardInterrupt: once's own have been given back by
    then) ends the hook's group first: the hook, in a session of its own, outlived once and
    kept its stderr open (cron waited). `arm()` once the hook has started: from then on the
    first such signal raises _Stopped (one that came while it started raises at `arm`), and
    the caller kills the group; the ones after it are noted only (one raised while the group
    was being killed left the hook alive). On leaving, once ends as the first would have
    ended it: it dies of it, or SIGINT's KeyboardInterrupt goes on (`once: interrupted`),
    and as PID 1, spared its own signals, it exits 128+N. A handler of someone else's (the
    Python API's caller, a catch-up that holds its stops) is left alone, as is a thread not
    the main one."""

    def __init__(self) -> None:
        self.numbers: list[int] = []
        self.armed = False
        self.previous: dict[int, Any] = {}

    def arm(self) -> None:
        self.armed = True
        if self.numbers:
            raise _Stopped

    def _on_signal(self, number: int, _frame: object) -> None:
        self.numbers.append(number)
        if self.armed and len(self.numbers) == 1:
            raise _Stopped

    def __enter__(self) -> _HookStops:
        import signal

        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                if signal.getsignal(number) in (signal.SIG_DFL, signal.default_int_handler):
                    self.previous[number] = signal.signal(number, self._on_signal)
        return self

    def __exit__(self, *_: object) -> None:
        """Ends once when a signal came (_Stopped, raised only then, goes no further)."""
        import signal

        from once.run.stops import die_of

        self.armed = False
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        if self.numbers:
            die_of(self.numbers[0])


def hook_timeout() -> float:
    """HOOK_TIMEOUT, or _ONCE_HOOK_TIMEOUT seconds (a test knob: 30 s is long for a test)."""
    try:
        return float(os.environ.get("_ONCE_HOOK_TIMEOUT") or HOOK_TIMEOUT)
    except ValueError:
        return HOOK_TIMEOUT


def redact_ping(url: str) -> str:
    """A ping URL usually embeds a secret key (healthchecks' UUID): show only its host."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…"
    except ValueError:
        return "(bad URL)"


def check_url(url: str) -> str | None:
    """Why url cannot be a ping URL (never quoting its path), or None when it can."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises on a bad port
    except ValueError:
        return "it is not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "expected http://HOST/… or https://HOST/…"
    if any(c.isspace() or ord(c) < 32 or c == "\x7f" for c in url):
        return "it holds whitespace or control characters (percent-encode them)"
    return None


def read_url_file(path: str) -> str:
    """--ping-url-file: the URL from a file, so that keys stay out of crontabs and `ps`."""
    with open(os.path.expanduser(path), encoding="utf-8") as handle:
        return handle.read().strip()
