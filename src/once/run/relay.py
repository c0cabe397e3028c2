"""The command's output: relayed to where it was going, its last bytes kept for the ledger.

When --output-tail is not 0 and once's stdout or stderr is not a terminal, the command writes
that stream into a pipe of once's own, and a thread per stream copies it to the original
descriptor as it comes (os.read, os.write, no buffering of ours), so that each stream keeps
its order and a stalled reader of one never holds up the other; stdout and stderr that are
one file get one pipe. The last `limit` bytes of both streams together are kept (a deque of
the chunks read: bounded by limit + CHUNK), in the order the command wrote them as far as
the pipes tell (Order: not the order the threads happened to read them). A terminal is left
alone. The threads never touch the lease, and os.read and os.write release the GIL. Where the
relay stops (the command's end and DRAIN, a reader gone or one that stops reading) is
docs/concepts/output.md, "Where the relay stops".

Stdlib only: imported by `once run` when it relays.
"""

from __future__ import annotations

import os
import select
import stat
import threading
import time
from collections import deque
from collections.abc import Callable

CHUNK = 64 * 1024  # a pipe's default capacity: one read takes whatever it holds
DRAIN = 1.0  # seconds the relay goes on reading after the command's end


# Where a chunk goes in the tail: (the look that first saw it, its stream's rank); Order.
Key = tuple[int, int]
_END: Key = (1 << 62, 0)  # after every other: a chunk added in the order it was read


class Tail:
    """The last `limit` bytes of the chunks added to it, in the order of their keys (equal
    keys: in the order they were added), from any thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: deque[tuple[Key, bytes]] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self.truncated = False

    def add(self, data: bytes, key: Key = _END) -> None:
        with self._lock:
            chunks = self._chunks
            at = len(chunks)
            while at and chunks[at - 1][0] > key:  # written before chunks read sooner
                at -= 1
            chunks.insert(at, (key, data))
            self._size += len(data)
            while self._size - len(chunks[0][1]) >= self.limit:
                self._size -= len(chunks.popleft()[1])
                self.truncated = True

    def value(self) -> bytes:
        with self._lock:
            data = b"".join(chunk for _, chunk in self._chunks)
            cut = self.truncated or len(data) > self.limit
        return lead_trimmed(data[-self.limit:]) if cut else data


class Order:
    """Which of the streams' bytes the command wrote first, as far as the pipes tell.

    A stream's thread reads when it gets to run, which under load can be long after the bytes
    arrived: a command's last lines on stdout were read after the error it then wrote on
    stderr, and the error fell out of the tail (issue 34). So before every read, and when an
    idle stream stirs, the relay looks at every pipe under one lock: the bytes a pipe holds at
    look N that look N-1 did not see were written between the two, after every byte look N-1
    saw in any pipe. A chunk read is keyed by the look that first saw its bytes (cut in two
    where it spans two looks). Bytes that one look first saw in both pipes were written
    between the same two looks, in an order no pipe tells: stdout's go first (the output, then
    the error that ends it)."""

    def __init__(self, reads: tuple[int, ...]) -> None:
        self.lock = threading.Lock()
        self._looks = 0
        self._streams = {read: _Stream(rank) for rank, read in enumerate(reads)}
        self._many = len(reads) > 1  # one stream: its own order is the pipe's

    def look(self) -> None:
        """Mark what each pipe holds now as seen by a new look (the lock held; no thread
        takes bytes out meanwhile, as that needs it).

        The pipes are asked one after the other, stdout last, and the command may write
        between two questions (a loaded machine can pause this thread there): what it wrote
        to stderr meanwhile goes to the next look, after what this one saw of stdout, and
        what it wrote to stdout to this one, before stderr's: the order of bytes first seen
        by one look either way (stdout's first), never stderr's words before stdout bytes
        written ahead of them."""
        if not self._many:
            return
        self._looks += 1
        for read, stream in reversed(self._streams.items()):
            if stream.open:  # a closed one's number may be another file's by now
                stream.saw(stream.taken + _waiting(read), self._looks)

    def took(self, read: int, data: bytes) -> list[tuple[Key, bytes]]:
        """data, just read from read's pipe (the lock held), keyed; bytes no look saw came
        after the last one."""
        return self._streams[read].took(data, self._looks + 1)

    def passed(self, read: int, count: int) -> None:
        """count bytes of read's pipe went on without being kept (spliced)."""
        with self.lock:
            self._streams[read].passed(count)

    def close(self, read: int) -> None:
        with self.lock:
            self._streams[read].open = False
            os.close(read)


MAX_MARKS = 4096  # a stream's marks of looks its thread has not read up to yet


class _Stream:
    """One pipe's bytes as the looks saw them: marks (end, look): the bytes before position
    end (counted from the stream's first byte) that no earlier look saw were first seen by
    look."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.open = True
        self.taken = 0  # bytes taken out of the pipe so far (read or spliced)
        self.marks: deque[tuple[int, int]] = deque()

    def saw(self, end: int, look: int) -> None:
        if end > (self.marks[-1][0] if self.marks else self.taken):
            if len(self.marks) >= MAX_MARKS:  # its bytes count as the next mark's: later
                self.marks.popleft()
            self.marks.append((end, look))

    def took(self, data: bytes, unseen: int) -> list[tuple[Key, bytes]]:
        pieces: list[tuple[Key, bytes]] = []
        start = 0
        while start < len(data):
            self._forget_passed()
            end, look = self.marks[0] if self.marks else (1 << 62, unseen)
            size = min(len(data) - start, end - self.taken)
            pieces.append(((look, self.rank), data[start:start + size]))
            start += size
            self.taken += size
        return pieces

    def passed(self, count: int) -> None:
        self.taken += count
        self._forget_passed()

    def _forget_passed(self) -> None:
        while self.marks and self.marks[0][0] <= self.taken:
            self.marks.popleft()


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
        self._order = Order(self._reads)
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
            self._order.close(read)
        else:
            with self._order.lock:
                self._order.look()  # its first bytes: as soon as they are seen
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
            self._order.close(read)
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
                    if waiting > limit + SPLICE_MIN and self._moved(read, out, waiting - limit):
                        self.tail.truncated = True  # what went before the last `limit` bytes
                        continue
                    size = CHUNK
                data = self._read(read, size)
                if data is None:  # nothing there after all
                    if budget is not None:
                        return
                    continue
                if not data:
                    return  # every writer has closed it
                if budget is not None:
                    budget -= len(data)
                out.write(data)
                if out.gone:
                    return  # the reader is gone: the command gets EPIPE from now on
        finally:
            self._order.close(read)

    def _read(self, read: int, size: int) -> bytes | None:
        """Up to size bytes of the pipe, kept in the tail where the command wrote them
        (Order); None when it holds none."""
        order = self._order
        with order.lock:  # the read does not block: the pipe is ours, non-blocking
            order.look()
            try:
                data = os.read(read, size)
            except BlockingIOError:
                return None
            pieces = order.took(read, data)
        # Kept before it is passed on: the command has said it, even if a reader that never
        # reads keeps it from going further.
        for key, piece in pieces:
            self.tail.add(piece, key)
        return data

    def _moved(self, read: int, out: _Destination, count: int) -> bool:
        """out.moves, the bytes it moves counted (Order): what the pipes hold is looked at
        first, so that what is left of this one keeps its place."""
        with self._order.lock:
            self._order.look()
        return out.moves(read, count, lambda moved: self._order.passed(read, moved))


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

    def moves(self, read: int, count: int,
              counted: Callable[[int], None] = lambda _moved: None) -> bool:
        """Move count bytes from the pipe read to fd without copying them, each move
        counted; False when that cannot be done (then they are read and written)."""
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
            counted(moved)
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
