"""The order of the tail across stdout and stderr (once.run.relay.Order, Tail), on real pipes
read in the order a loaded machine may read them: the threads' order is not the command's."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from once.run.relay import Order, Tail


@pytest.fixture
def pipes() -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
    """(read, write) of the command's stdout and of its stderr."""
    out, err = os.pipe(), os.pipe()
    yield out, err
    for fd in (*out, *err):
        try:
            os.close(fd)
        except OSError:
            pass  # an end the test closed


def read(order: Order, tail: Tail, fd: int) -> bytes:
    """What a stream's thread does: look, read, keep each piece where it goes."""
    with order.lock:
        order.look()
        data = os.read(fd, 1 << 16)
        pieces = order.took(fd, data)
    for key, piece in pieces:
        tail.add(piece, key)
    return data


def look(order: Order) -> None:
    with order.lock:
        order.look()


def test_the_tail_keeps_its_keys_order_and_its_last_bytes() -> None:
    tail = Tail(6)
    tail.add(b"late", (2, 0))
    tail.add(b"early", (1, 1))  # read after, written before
    assert tail.value() == b"lylate"
    tail.add(b"older", (0, 0))  # before all the tail keeps: never in it
    assert tail.value() == b"lylate"
    tail.add(b"!", (2, 0))  # equal keys: in the order added
    assert tail.value() == b"ylate!"


def test_stdout_read_late_still_comes_before_the_error_written_after_it(
        pipes: tuple[tuple[int, int], tuple[int, int]]) -> None:
    # Issue 34: 2,000 lines, then the error, then the end; the stderr thread reads first.
    (out_r, out_w), (err_r, err_w) = pipes
    order, tail = Order((out_r, err_r)), Tail(13)
    os.write(out_w, b"line-1\nline-2\n")
    look(order)  # the stdout thread saw them, and did not get to read them
    os.write(err_w, b"ERROR\n")
    assert read(order, tail, err_r) == b"ERROR\n"
    assert read(order, tail, out_r) == b"line-1\nline-2\n"
    assert tail.value() == b"line-2\nERROR\n"


def test_bytes_first_seen_by_one_look_put_stdout_first(
        pipes: tuple[tuple[int, int], tuple[int, int]]) -> None:
    (out_r, out_w), (err_r, err_w) = pipes
    order, tail = Order((out_r, err_r)), Tail(100)
    os.write(out_w, b"out ")
    os.write(err_w, b"err ")
    read(order, tail, err_r)  # one look saw both: which came first no pipe tells
    read(order, tail, out_r)
    assert tail.value() == b"out err "


def test_a_chunk_that_spans_looks_is_cut_where_the_other_stream_spoke(
        pipes: tuple[tuple[int, int], tuple[int, int]]) -> None:
    (out_r, out_w), (err_r, err_w) = pipes
    order, tail = Order((out_r, err_r)), Tail(100)
    os.write(out_w, b"one ")
    look(order)
    os.write(err_w, b"warning ")
    look(order)
    os.write(out_w, b"two ")
    look(order)
    read(order, tail, out_r)  # "one two " in one read: cut in two
    read(order, tail, err_r)
    assert tail.value() == b"one warning two "


def test_stderr_read_late_comes_after_stdout_written_before_it_too(
        pipes: tuple[tuple[int, int], tuple[int, int]]) -> None:
    (out_r, out_w), (err_r, err_w) = pipes
    order, tail = Order((out_r, err_r)), Tail(100)
    os.write(err_w, b"starting ")
    look(order)
    os.write(out_w, b"result")
    read(order, tail, out_r)
    read(order, tail, err_r)
    assert tail.value() == b"starting result"


def test_bytes_moved_past_the_tail_keep_the_rest_in_place(
        pipes: tuple[tuple[int, int], tuple[int, int]]) -> None:
    # A fast writer's bytes before the pipe's last `limit` are spliced on, never kept: the
    # count goes on, so that the rest keeps the look that first saw it.
    (out_r, out_w), (err_r, err_w) = pipes
    order, tail = Order((out_r, err_r)), Tail(100)
    os.write(out_w, b"x" * 1000 + b"end of output ")
    look(order)
    os.write(err_w, b"ERROR")
    read(order, tail, err_r)
    os.read(out_r, 1000)  # what splice moves on
    order.passed(out_r, 1000)
    read(order, tail, out_r)
    assert tail.value() == b"end of output ERROR"


def test_a_closed_stream_is_looked_at_no_more(
        pipes: tuple[tuple[int, int], tuple[int, int]]) -> None:
    (out_r, out_w), (err_r, err_w) = pipes
    order, tail = Order((out_r, err_r)), Tail(100)
    os.close(err_w)
    order.close(err_r)  # its number may be another file's from now on
    os.write(out_w, b"alone")
    assert read(order, tail, out_r) == b"alone"
    assert tail.value() == b"alone"
