"""Telling the world: dead-man pings (healthchecks.io, Cronitor, Uptime Kuma, any URL) and
--on-success / --on-failure / --on-skip hooks.

Neither ever changes the outcome, the claim or the exit status: each request and each hook has
a short timeout, a failed request is retried a few times with backoff, and what still fails is
one `once:` line on stderr. Only the standard library is used (urllib), and only when a ping or
hook is configured.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

PING_TIMEOUT = 3.0  # seconds per request
PING_TRIES = 3  # so a ping costs at most about 3 x 3 s + 1.5 s of backoff
HOOK_TIMEOUT = 30.0

SUCCESS = ("done",)
SKIPS = ("skipped-done", "skipped-held", "skipped-failed")


@dataclass
class Notifier:
    """What to tell, and where, for one `once run`."""

    ping_url: str | None = None
    ping_on_skip: bool = False
    ping_exit_status: bool = False  # healthchecks' URL/N form instead of URL/fail
    on_success: str | None = None
    on_failure: str | None = None
    on_skip: str | None = None

    def __post_init__(self) -> None:
        self._start_ping: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return bool(self.ping_url or self.on_success or self.on_failure or self.on_skip)

    def started(self) -> None:
        """The command starts: ping URL/start, in the background (never delays the command)."""
        if self.ping_url:
            self._start_ping = threading.Thread(
                target=ping, args=(self.ping_url.rstrip("/") + "/start",), daemon=True)
            self._start_ping.start()

    def finished(self, outcome: str, status: int, env: Mapping[str, str]) -> None:
        """The period's outcome is known: ping and run the matching hook."""
        if self._start_ping is not None:  # keep the order start, then result
            self._start_ping.join(timeout=PING_TIMEOUT * PING_TRIES + 2)
        skipped = outcome in SKIPS
        if self.ping_url and (not skipped or self.ping_on_skip):
            base = self.ping_url.rstrip("/")
            if outcome in SUCCESS or skipped:
                ping(self.ping_url)
            else:
                ping(f"{base}/{status}" if self.ping_exit_status else f"{base}/fail")
        hook = self.on_skip if skipped else (
            self.on_success if outcome in SUCCESS else self.on_failure)
        if hook:
            run_hook(hook, {**env, "ONCE_OUTCOME": outcome, "ONCE_STATUS": str(status)})


def ping(url: str) -> bool:
    """GET url, retried with backoff; a failure is one `once:` line, never an exception."""
    import urllib.error
    import urllib.request

    error = ""
    for attempt in range(PING_TRIES):
        if attempt:
            time.sleep(0.5 * attempt)
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "once"})
            with urllib.request.urlopen(request, timeout=PING_TIMEOUT) as response:
                response.read(1024)
            return True
        except urllib.error.HTTPError as exc:
            error = f"HTTP {exc.code}"
            if exc.code < 500:
                break  # the server answered: a retry would get the same answer
        except Exception as exc:  # refused, timed out, bad URL: retry, then report
            error = str(getattr(exc, "reason", exc)) or type(exc).__name__
    print(f"once: ping {redact_ping(url)} failed: {error}", file=sys.stderr, flush=True)
    return False


def run_hook(command: str, env: Mapping[str, str]) -> int | None:
    """Run a hook through /bin/sh with the run's environment; report, never raise."""
    import subprocess

    try:
        done = subprocess.run(["/bin/sh", "-c", command], env=dict(env), timeout=HOOK_TIMEOUT,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        print(f"once: hook {command!r} timed out after {HOOK_TIMEOUT:g}s", file=sys.stderr,
              flush=True)
        return None
    except OSError as exc:
        print(f"once: hook {command!r} could not start: {exc.strerror}", file=sys.stderr,
              flush=True)
        return None
    if done.returncode != 0:
        print(f"once: hook {command!r} exited {done.returncode}", file=sys.stderr, flush=True)
    return done.returncode


def redact_ping(url: str) -> str:
    """A ping URL usually embeds a secret key (healthchecks' UUID): show only its host."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…" if parts.netloc else "(bad URL)"


def read_url_file(path: str) -> str:
    """--ping-url-file: the URL from a file, so that keys stay out of crontabs and `ps`."""
    with open(os.path.expanduser(path), encoding="utf-8") as handle:
        return handle.read().strip()
