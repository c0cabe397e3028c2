"""once.run.guard.ready, the wait of the wrapper's loop and the guard's: a signal whose
handler runs past the wait's timeout (one handled after a stop) must not hide a descriptor
that became readable meanwhile (PEP 475 ends such a poll with nothing, without looking).
Found with a SIGCONT handler tried in the wrapper (not kept): a stopped owner whose command
had ended woke to see no report, only its deadline past, and stepped down (exit 70)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from once.run.guard import ready


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    try:
        yield read, write
    finally:
        os.close(read)
        os.close(write)


def test_a_descriptor_readable_when_a_slow_handler_ends_the_wait_is_seen(
        pipe: tuple[int, int]) -> None:
    read, write = pipe

    def handler(*_: object) -> None:  # past the wait's timeout, then the pipe speaks
        time.sleep(0.3)
        os.write(write, b"x")

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        assert ready([read], 0.1) == {read}
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_nothing_readable_is_nothing(pipe: tuple[int, int]) -> None:
    assert ready([pipe[0]], 0.01) == set()
