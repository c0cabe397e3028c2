"""A leader's child for the tests of `once lead`, and the judge of its log.

The child writes a line every 100 ms to the shared log (O_APPEND: lines of many writers never
mix): `tick TERM PID TIME`, TIME on CLOCK_MONOTONIC (one clock for every process of the
machine). The judge reads the terms' spans from the lines alone: whatever once says, two
children that both wrote within one span were alive at once.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CHILD = """
import os, sys, time
term, pid = os.environ["ONCE_TERM"], os.getpid()
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
while True:
    os.write(fd, f"tick {term} {pid} {time.monotonic():.6f}\\n".encode())
    time.sleep(0.1)
"""


def child(log: Path) -> list[str]:
    """The command line of a child that logs to `log` until it is stopped."""
    return [sys.executable, "-c", CHILD, str(log)]


@dataclass
class Span:
    term: int
    pid: int
    first: float
    last: float


def spans(log: Path) -> list[Span]:
    """Each child's first and last line, in the order they began."""
    found: dict[tuple[int, int], Span] = {}
    if not log.exists():
        return []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[0] != "tick":
            continue
        term, pid, at = int(parts[1]), int(parts[2]), float(parts[3])
        span = found.setdefault((term, pid), Span(term, pid, at, at))
        span.first, span.last = min(span.first, at), max(span.last, at)
    return sorted(found.values(), key=lambda s: s.first)


def judge(log: Path) -> list[Span]:
    """The spans, after asserting that no two overlap and that the terms strictly grow."""
    found = spans(log)
    for before, after in itertools.pairwise(found):
        assert after.first > before.last, (
            f"two leaders' children alive at once: term {before.term} (pid {before.pid}) "
            f"wrote until {before.last:.3f}, term {after.term} (pid {after.pid}) from "
            f"{after.first:.3f}")
        assert after.term > before.term, f"term {after.term} after term {before.term}"
    return found


def leading_children(log: Path, since: float = 0.0) -> set[tuple[int, int]]:
    """(term, pid) of every child that wrote after `since`."""
    return {(s.term, s.pid) for s in spans(log) if s.last > since}


def stop_leads(procs: list[subprocess.Popen[str]] | list[subprocess.Popen[bytes]],
               timeout: float = 60) -> list[str]:
    """SIGCONT and SIGTERM to every `once lead` still alive, SIGKILL to one that has not
    ended within timeout; what each said on stderr (when it was piped), in order."""
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a stopped one must hear the SIGTERM
            proc.terminate()
    said = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        except ValueError:  # its stderr was read already
            err = ""
        said.append(err.decode() if isinstance(err, bytes) else err or "")
    return said
