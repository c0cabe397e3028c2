"""`once serve`'s ledger reads, shared and bounded: requests that want the same data while a
read is under way (or within FRESH seconds of one) share it, so a hundred clients cost one
read; at most READ_SLOTS different reads run at once (Busy beyond); and a request waits at
most its timeout (plus a little) for its read, then gets a LedgerError. The read itself gives
up by then too (once.serve.data), so stuck reads cannot pile up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from once.ledger import LedgerError

# Different ledger reads under way at once: the overview, a scrape (/metrics), /api/status,
# a job's page and /healthz, each its own read, all answered together.
READ_SLOTS = 5
FRESH = 1.0  # seconds a read's answer is shared with later requests


class Busy(Exception):
    """Too many different reads are under way: try again in a moment."""


class Reads:
    """Shared, bounded ledger reads (see the module's docstring)."""

    def __init__(self, timeout: float, slots: int = READ_SLOTS, fresh: float = FRESH) -> None:
        self.timeout, self.slots, self.fresh = timeout, slots, fresh
        self.lock = threading.Lock()
        self.running: dict[Any, Future[Any]] = {}
        self.recent: dict[Any, tuple[float, Future[Any]]] = {}

    def get(self, key: Any, read: Callable[[], Any]) -> Any:
        """The read's result; LedgerError when it failed or took too long; Busy."""
        with self.lock:
            now = time.monotonic()
            self.recent = {k: v for k, v in self.recent.items() if now - v[0] < self.fresh}
            if key in self.recent:
                future = self.recent[key][1]
            elif key in self.running:
                future = self.running[key]
            elif len(self.running) >= self.slots:
                raise Busy
            else:
                future = Future()
                self.running[key] = future
                threading.Thread(target=self._run, args=(key, future, read), daemon=True,
                                 name="once-serve-read").start()
        try:
            return future.result(timeout=self.timeout + 2.0)
        except FutureTimeout:
            raise LedgerError(f"no answer within {self.timeout:g}s") from None

    def _run(self, key: Any, future: Future[Any], read: Callable[[], Any]) -> None:
        try:
            future.set_result(read())
        except BaseException as exc:  # handed to every waiting request
            future.set_exception(exc)
        finally:
            with self.lock:
                self.running.pop(key, None)
                self.recent[key] = (time.monotonic(), future)
