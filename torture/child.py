"""The command the torture's wrappers run: a unit of work that logs what it did.

It appends `start` when it begins, then works (sleeps) for a time drawn from its period and
fence, then appends `done`: a `done` line means the work was finished, and nothing else does.
A child that is stopped by SIGTERM, SIGINT or SIGHUP appends `term` and exits without `done`;
one killed by SIGKILL appends nothing more. Each line is one O_APPEND write to $TORTURE_LOG:

    WORD PERIOD FENCE ATTEMPT PID WALL_TIME WORK_SECONDS

With $TORTURE_LOCKS (a directory) it also holds an exclusive flock on the period's file there
for as long as it lives, which the kernel lets go of the instant the process ends, however it
ends (SIGKILL included). A child that finds the lock taken as it starts runs beside another
attempt of its period: it appends `overlap` (before `start`), and `clear` when the other has
ended and the lock is its own, so the seconds two attempts ran side by side are measured by
the kernel, whatever the clocks say and however the other child died.

The work's length is drawn from TORTURE_WORK_MIN..TORTURE_WORK_MAX (seconds), seeded by the
period and the fence, so the torture knows, from the start line, when the work would end.
"""

import fcntl
import os
import random
import signal
import sys
import threading
import time

LOG = os.environ["TORTURE_LOG"]
LOCKS = os.environ.get("TORTURE_LOCKS")
PERIOD = os.environ.get("ONCE_PERIOD", "?")
FENCE = os.environ.get("ONCE_FENCE", "0")
ATTEMPT = os.environ.get("ONCE_ATTEMPT", "0")
LOW = float(os.environ.get("TORTURE_WORK_MIN", "0.5"))
HIGH = float(os.environ.get("TORTURE_WORK_MAX", "3"))
WORK = random.Random(f"{PERIOD}/{FENCE}").uniform(LOW, HIGH)


def log(word: str) -> None:
    line = f"{word} {PERIOD} {FENCE} {ATTEMPT} {os.getpid()} {time.time():.6f} {WORK:.3f}\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def stopped(signum: int, _frame: object) -> None:
    log("term")
    os._exit(128 + signum)


def hold_period() -> None:
    """Take the period's lock; when another attempt's child holds it, say so, and say when
    it is ours (a thread waits for it while the work goes on)."""
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in PERIOD)
    fd = os.open(os.path.join(LOCKS or ".", f"{name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log("overlap")

        def wait() -> None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            log("clear")

        threading.Thread(target=wait, daemon=True).start()


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, stopped)
if LOCKS:
    hold_period()
log("start")
time.sleep(WORK)
# The work is finished: block the stop signals so that `done` is always the last line.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
log("done")
sys.exit(0)
