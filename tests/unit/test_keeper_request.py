"""A period's request reaches the kept guard whole (once.run.keeper: one message, its length
first, the command's descriptors with it), also when it is larger than the socket takes at
once: an environment of a megabyte, twice, through one real kept guard, and the command sees
every byte of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from once.run import wrapper
from once.run.keeper import Keeper

PIECE = 100_000  # bytes a variable (one environment string may not pass 128 KiB)


def test_a_request_larger_than_the_socket_buffer_reaches_the_kept_guard(tmp_path: Path) -> None:
    kept = Keeper()
    if not kept.usable:
        pytest.skip("no kept guard here (not Linux, or no interpreter to start)")
    big = {f"ONCE_TEST_BIG{n}": str(n) * PIECE for n in range(10)}  # a megabyte in all
    try:
        guards = set()
        for period in range(2):
            out = tmp_path / f"out{period}"
            env = {**os.environ, **big, "OUT": str(out)}
            outcome = wrapper.run(["sh", "-c", 'printf %s "${#ONCE_TEST_BIG9}$ONCE_TEST_BIG0"'
                                   ' > "$OUT"'], env, None, keeper=kept)
            assert (outcome.kind, outcome.status) == ("exited", 0)
            assert out.read_text() == f"{PIECE}{'0' * PIECE}"
            guards.add(kept.pid)
        assert len(guards) == 1 and 0 not in guards  # one guard, kept for the second period
    finally:
        kept.close()


def test_the_kept_guard_imports_no_threading() -> None:
    # threading's fork hook runs in the child of every command the guard forks, and doubled
    # that fork's CPU (once.deadlines keeps its thread-local bound without it).
    import subprocess
    import sys

    import once

    root = os.path.dirname(os.path.dirname(os.path.abspath(once.__file__)))
    found = subprocess.run(
        [sys.executable, "-I", "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "import once.run.keeper; print(sorted(m for m in sys.modules if 'thread' in m))",
         root], capture_output=True, text=True, check=True).stdout.strip()
    assert "'threading'" not in found, found


def test_a_request_read_past_its_step_down_starts_nothing(tmp_path: Path) -> None:
    # A guard stopped (or starved) with a request waiting reads it past the step-down's
    # moment: the period may be another's by then, and its command must not start. The
    # guard's death before `started` says so to the wrapper.
    from once.deadlines import lease_now

    kept = Keeper()
    if not kept.usable or kept.session() is None:
        pytest.skip("no kept guard here (not Linux, or no interpreter to start)")
    ran = tmp_path / "ran"
    try:
        out = os.open(os.devnull, os.O_WRONLY)
        watch = (-1, lease_now() - 1.0, 0.5)  # its deadline passed a second ago
        pid, report = kept.spawn(["touch", str(ran)], dict(os.environ), None, "t", frozenset(),
                                 watch, (), {1: out, 2: out})
        os.close(out)
        said = b""
        while chunk := os.read(report, 512):
            said += chunk
        assert b"started" not in said
        assert os.waitpid(pid, 0)[1] == 9  # killed by itself: SIGKILL to its group
    finally:
        kept.ended(kept=False, stranded=False)
        kept.close()
    assert not ran.exists()
