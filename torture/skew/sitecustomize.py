"""Loaded (PYTHONPATH) into the `once` processes the torture runs under libfaketime.

libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 rejects the absolute monotonic
clock_nanosleep() that time.sleep() uses (EINVAL); with the monotonic clock faked instead,
condition-variable waits hang. Neither is the wrong wall clock under test, so time.sleep falls
back to select(), which libfaketime leaves alone. Nothing else changes.
"""

import select
import time

_sleep = time.sleep


def _sleep_anyway(seconds: float) -> None:
    try:
        _sleep(seconds)
    except OSError:
        select.select([], [], [], seconds)


time.sleep = _sleep_anyway
