"""The command's output: relayed to where it was going, its last bytes kept for the ledger.

When --output-tail is not 0 and once's stdout or stderr is not a terminal, the command writes
that stream into a pipe of once's own, and a thread per stream copies it to the original
descriptor as it comes (os.read, os.write, no buffering of ours), so that each stream keeps
its order and a stalled reader of one never holds up the other; stdout and stderr that are
one file get one pipe. The last `limit` bytes are kept (a deque of the chunks read: bounded by
limit + CHUNK). A terminal is left alone. The threads never touch the lease, and os.read and
os.write release the GIL. Where the relay stops (the command's end and DRAIN, a reader gone
or one that stops reading) is docs/concepts/output.md, "Where the relay stops".

Stdlib only: imported by `once run` when it relays.
"""

from __future__ import annotations

import os
import select
import stat
import threading
import time
from collections import deque

CHUNK = 64 * 1024  # a pipe's default capacity: one read takes whatever it holds
DRAIN = 1.0  # seconds the relay goes on reading after the command's end


class Tail:
    """The last `limit` bytes written to it, from any thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self.truncated = False

    def add(self, data: bytes) -> None:
        with self._lock:
            self._chunks.append(data)
            self._size += len(data)
            while self._size - len(self._chunks[0]) >= self.limit:
                self._size -= len(self._chunks.popleft())
                self.truncated = True

    def value(self) -> bytes:
        with self._lock:
            data = b"".join(self._chunks)
            cut = self.truncated or len(data) > self.limit
        return lead_trimmed(data[-self.limit:]) if cut else data


def lead_trimmed(data: bytes) -> bytes:
    """data cut at its start, without the continuation bytes of a character cut in two."""
    start = 0
    while start < min(3, len(data)) and 0x80 <= data[start] <= 0xBF:
        start += 1
    return data[start:]


def text(data: bytes) -> str:
    """The tail as stored: UTF-8 with replacement characters, NUL too (PostgreSQL's text
    cannot hold it)."""
    return data.decode("utf-8", "replace").replace("\0", "\ufffd")


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _relayable(fd: int) -> os.stat_result | None:
    """fd's status when it is open and not a terminal (then it is relayed)."""
    try:
        info = os.fstat(fd)
    except OSError:  # closed: the command inherits it closed
        return None
    if stat.S_ISCHR(info.st_mode) and os.isatty(fd):
        return None
    return info


class Relay:
    """The pipes between the command and once's own stdout and stderr, and their threads.

    Made before the guard is forked (child_fds go to the command, own_fds are closed by the
    guard); forked() after the fork; end() once the command has ended, then running() and
    join() until the streams are delivered, and output() for the tail. A stream gets its
    thread when its first bytes arrive: until then the wrapper's wait loop watches its pipe
    (idle(), stirred()), so that a command that says nothing (most of a catch-up's) costs no
    thread. (A thread started while the guard lives copies, copy-on-write, every page it
    touches: most of a millisecond.)
    """

    def __init__(self, limit: int) -> None:
        self.tail = Tail(limit)
        self._idle: dict[int, int] = {}  # read end -> destination, until a thread takes it
        self._child: dict[int, int] = {}  # the command's fd -> write end
        self._threads: list[threading.Thread] = []
        self._until: float | None = None
        self._wake_r, self._wake_w = -1, -1
        out, err = _relayable(1), _relayable(2)
        if out is not None and err is not None and (out.st_dev, out.st_ino) == (
                err.st_dev, err.st_ino):
            self._pipe((1, 2), 1)  # one file or pipe: one pipe keeps their interleaving
        else:
            for fd, info in ((1, out), (2, err)):
                if info is not None:
                    self._pipe((fd,), fd)
        self._reads = tuple(self._idle)
        if self._idle:
            self._wake_r, self._wake_w = os.pipe()

    def _pipe(self, fds: tuple[int, ...], destination: int) -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)  # our own end: the thread polls it with the wake pipe
        self._idle[read] = destination
        for fd in fds:
            self._child[fd] = write

    @property
    def active(self) -> bool:
        return bool(self._reads)

    def child_fds(self) -> dict[int, int]:
        """The command's stdout/stderr that are relayed: {1: pipe, 2: pipe}."""
        return dict(self._child)

    def own_fds(self) -> tuple[int, ...]:
        """What the guard closes: the read ends and the wake pipe."""
        return tuple(fd for fd in (*self._reads, self._wake_r, self._wake_w) if fd >= 0)

    def forked(self) -> None:
        """The guard has the write ends: let go of ours, so that the command's end (and its
        group's) is the pipes' end."""
        for write in set(self._child.values()):
            os.close(write)
        self._child = {}

    def idle(self) -> list[int]:
        """The pipes no thread reads yet, for the wrapper's wait loop to watch."""
        return list(self._idle)

    def stirred(self, read: int) -> None:
        """The wait loop found an idle pipe readable: its first bytes (a thread takes the
        stream over) or its end (every writer closed it: nothing to relay)."""
        if _waiting(read) == 0:
            del self._idle[read]
            os.close(read)
        else:
            self._take(read)

    def _take(self, read: int) -> None:
        """A thread of its own for the stream from now on."""
        thread = threading.Thread(target=self._pump, args=(read, self._idle.pop(read)),
                                  name="once-relay", daemon=True)
        thread.start()
        self._threads.append(thread)

    def end(self, drain: float = DRAIN) -> None:
        """The command has ended: from `drain` seconds on, each stream relays what its pipe
        holds then and stops (see the module's docstring). Once only: a second call, as on
        the way out of an error, changes nothing."""
        if not self.active or self._until is not None:
            return
        self._until = time.monotonic() + drain
        os.write(self._wake_w, b"x")
        for read in self.idle():
            if _readable(read):
                self.stirred(read)  # its last bytes, or its end
            else:
                self._take(read)  # a process of the group holds it: wait for it to drain

    def running(self) -> bool:
        """Whether a stream is still being relayed."""
        return any(thread.is_alive() for thread in self._threads)

    def join(self, timeout: float) -> None:
        """Wait up to timeout seconds for the streams to end."""
        until = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, until - time.monotonic()))

    def output(self) -> bytes:
        """The tail; the wake pipe is closed once no stream is relayed (a thread left behind
        still writing to a reader that stopped reading closes its own pipe if it ever gets
        out)."""
        if self.active and self._wake_r >= 0 and not self.running():
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
        return self.tail.value()

    def close_unforked(self) -> None:
        """The guard could not be forked: close every pipe."""
        self.forked()
        for read in self._idle:
            os.close(read)
        self._idle = {}
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _pump(self, read: int, destination: int) -> None:
        poller = select.poll()
        poller.register(read, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        out = _Destination(destination)
        waking = True
        capacity = _pipe_size(read)
        budget: int | None = None  # past the drain's end: what the pipe held then, to relay
        try:
            while True:
                until = self._until
                if budget is None and until is not None and time.monotonic() >= until:
                    # The command's last bytes are all in the pipe by now (it has ended):
                    # they are relayed at the reader's pace; what its group writes later is
                    # not waited for.
                    budget = _waiting(read)
                if budget is not None:
                    if budget <= 0:
                        return
                    size = min(CHUNK, budget)
                else:
                    timeout = None if until is None else max(0.0, until - time.monotonic())
                    events = dict(poller.poll(None if timeout is None else timeout * 1000))
                    if waking and self._wake_r in events:
                        poller.unregister(self._wake_r)  # the drain's end is set: wait for it
                        waking = False
                        continue
                    if read not in events:
                        continue  # the drain's end: decided above
                    waiting = _waiting(read)
                    if waiting >= capacity > 0:  # a fast writer: a bigger pipe, fewer wake-ups
                        capacity = _grow(read, capacity)
                    # The bytes before the pipe's last `limit` can never be in the tail: they
                    # are moved without a copy where the kernel can (splice).
                    limit = self.tail.limit
                    if waiting > limit + SPLICE_MIN and out.moves(read, waiting - limit):
                        self.tail.truncated = True  # what went before the last `limit` bytes
                        continue
                    size = CHUNK
                try:
                    data = os.read(read, size)
                except BlockingIOError:
                    if budget is not None:
                        return
                    continue
                if not data:
                    return  # every writer has closed it
                if budget is not None:
                    budget -= len(data)
                # Kept before it is passed on: the command has said it, even if a reader
                # that never reads keeps it from going further.
                self.tail.add(data)
                out.write(data)
                if out.gone:
                    return  # the reader is gone: the command gets EPIPE from now on
        finally:
            os.close(read)


SPLICE_MIN = 64 * 1024  # what is worth moving without a copy
BIG_PIPE = 1024 * 1024  # a fast writer's pipe (Linux's default pipe-max-size)


def _waiting(fd: int) -> int:
    """How many bytes the pipe holds (0 if it cannot tell)."""
    import array
    import fcntl
    import termios

    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
    except OSError:
        return 0
    return count[0]


def _pipe_size(fd: int) -> int:
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except (OSError, AttributeError):  # not Linux
        return 0


def _grow(fd: int, capacity: int) -> int:
    """Make the pipe BIG_PIPE bytes, once, if the system lets us (0: do not try again).

    Only a writer that fills the pipe gets one: a big pipe counts against the user's quota
    of pipe memory (pipe-user-pages-soft) whether it is used or not."""
    import fcntl

    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, BIG_PIPE)
    except (OSError, AttributeError):
        pass
    return 0


class _Destination:
    """Where a stream goes: once's own stdout or stderr as it was given."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.ok = True  # False after a write error: the rest is dropped (the tail is kept)
        self.gone = False  # the reader went away (EPIPE)
        self.splice = hasattr(os, "splice")  # False once the kernel refused it for fd

    def moves(self, read: int, count: int) -> bool:
        """Move count bytes from the pipe read to fd without copying them; False when that
        cannot be done (then they are read and written)."""
        if not (self.ok and self.splice):
            return False
        while count > 0:
            try:
                moved = os.splice(read, self.fd, count)
            except BrokenPipeError:
                self.ok, self.gone = False, True
                return False
            except BlockingIOError:  # a non-blocking descriptor we were given: wait
                select.select([], [self.fd], [], 1.0)
                continue
            except OSError:  # EINVAL: a file opened O_APPEND, a device without splice
                self.splice = False
                return False
            if moved == 0:
                return True
            count -= moved
        return True

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self.ok:
            try:
                view = view[os.write(self.fd, view):]
            except BrokenPipeError:
                self.ok, self.gone = False, True
            except BlockingIOError:
                select.select([], [self.fd], [], 1.0)
            except OSError:
                self.ok = False
