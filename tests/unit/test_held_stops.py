"""once.run.stops.Stop with real signals to this process: what a single run holds back, for
how long, and what it leaves to act on (once.run.flow._stops_noted acts)."""

from __future__ import annotations

import signal
import threading

from once.run.stops import Stop


def test_a_second_signal_is_overdue_at_once() -> None:
    called: list[int] = []
    stop = Stop(60.0, called.append)
    with stop.caught():
        signal.raise_signal(signal.SIGTERM)
        assert (stop.signal, called) == (signal.SIGTERM, [])  # held back: the timer runs
        signal.raise_signal(signal.SIGINT)
        assert called == [signal.SIGINT]
    assert stop.held_back() == signal.SIGTERM  # the first, to act on; its timer stopped


def test_a_signal_held_back_past_its_grace_is_overdue() -> None:
    overdue = threading.Event()
    stop = Stop(0.05, lambda number: overdue.set())
    with stop.caught():
        signal.raise_signal(signal.SIGTERM)
        assert overdue.wait(30.0)


def test_a_signal_the_command_had_is_not_held_back() -> None:
    stop = Stop(60.0, lambda number: None)
    stop.note(signal.SIGTERM, forwarded=True)  # the wrapper's: forwarded to the command
    assert stop.held_back() is None


def test_a_catch_ups_stop_notes_without_a_timer() -> None:
    stop = Stop()  # overdue None: held for the whole run
    with stop.caught():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    assert stop.signal == signal.SIGTERM and stop.held_back() == signal.SIGTERM
