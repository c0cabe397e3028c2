"""`make bench`'s output rows (issue 18): what relaying the command's output costs.

1. throughput: `head -c SIZE /dev/zero` into `wc -c`, through `once run` and directly;
   the ratio of the direct time to once's (goal >= 0.8), for the whole run and for the
   relay alone (once's fixed cost, a claimed `once run -- true`, taken off);
2. latency: a command writes a line every 10 ms, stamped with CLOCK_MONOTONIC (one clock
   for every process); the delay from its write to the reader's read, through once and
   directly, and the difference: what the relay adds (median and p99; goal p99 < 5 ms on
   an idle machine);
3. memory: PSS of `once run` and its guard while `yes` writes as fast as it can, with
   capture on (the default 16KiB) and off (--output-tail 0) (goal: within 2 MiB).

Knobs, for a quick run: BENCH_OUTPUT_MIB (default 1024), BENCH_OUTPUT_ROUNDS (3),
BENCH_LATENCY_LINES (1000). `BENCH_ONLY=output make bench` runs these rows alone, on SQLite.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ONCE = str(Path(sys.executable).with_name("once"))
OUTPUT_MIB = int(os.environ.get("BENCH_OUTPUT_MIB", "1024"))
OUTPUT_ROUNDS = int(os.environ.get("BENCH_OUTPUT_ROUNDS", "3"))
LATENCY_LINES = int(os.environ.get("BENCH_LATENCY_LINES", "1000"))

THROUGHPUT_GOAL = 0.8  # direct time / once's time
LATENCY_GOAL = 5.0  # ms added at p99
PSS_DELTA_GOAL = 2 * 1024  # KiB more with capture on than off

# One line every 10 ms, each the CLOCK_MONOTONIC nanoseconds of its write.
TICKER = """
import os, sys, time
for _ in range({lines}):
    os.write(1, b"%d\\n" % time.monotonic_ns())
    time.sleep(0.01)
"""

_jobs = iter(range(1_000_000))


def _job() -> str:
    return f"bench-output-{os.getpid()}-{next(_jobs)}"


def _once(*command: str, tail: str | None = None) -> str:
    """`once run` of a fresh job (it claims and runs) as a shell word list."""
    flags = f" --output-tail {tail}" if tail is not None else ""
    return f"{ONCE} run --job {_job()} --every day{flags} -- " + " ".join(command)


def _wall(pipeline: str, env: dict[str, str], expect: str | None = None) -> float:
    start = time.perf_counter()
    result = subprocess.run(["sh", "-c", pipeline], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0 or (expect is not None and result.stdout.strip() != expect):
        raise SystemExit(f"bench: {pipeline!r} failed: {result.stdout} {result.stderr}")
    return elapsed


def throughput(env: dict[str, str]) -> None:
    size = OUTPUT_MIB * 1024 * 1024
    writer = f"head -c {size} /dev/zero"
    _wall(f"{_once('true')} | wc -c", env, "0")  # the ledger's tables are created here
    direct, through, fixed = [], [], []
    for _ in range(OUTPUT_ROUNDS):  # interleaved, so that machine noise hits both alike
        direct.append(_wall(f"{writer} | wc -c", env, str(size)))
        through.append(_wall(f"{_once(writer)} | wc -c", env, str(size)))
        fixed.append(_wall(f"{_once('true')} | wc -c", env, "0"))
    d, o, f = (statistics.median(x) for x in (direct, through, fixed))
    relay = max(o - f, 1e-9)
    ratio = d / relay
    verdict = "ok" if ratio >= THROUGHPUT_GOAL else "UNDER GOAL"
    print(f"output      {OUTPUT_MIB} MiB through once run {o:6.2f} s, directly {d:6.2f} s: "
          f"{size / relay / 2**20:6.0f} vs {size / d / 2**20:6.0f} MiB/s; ratio {d / o:4.2f} "
          f"whole run, {ratio:4.2f} relay alone (goal >= {THROUGHPUT_GOAL})  {verdict}")


def _delays(argv: list[str], env: dict[str, str]) -> list[float]:
    """ms from each line's write to its read here."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    delays = []
    for line in proc.stdout:
        arrived = time.monotonic_ns()
        delays.append((arrived - int(line)) / 1e6)
    if proc.wait() != 0:
        raise SystemExit(f"bench: {argv[:3]} failed")
    return delays


def latency(env: dict[str, str]) -> None:
    ticker = [sys.executable, "-c", TICKER.format(lines=LATENCY_LINES)]
    direct = _delays(ticker, env)
    through = _delays([ONCE, "run", "--job", _job(), "--every", "day", "--", *ticker], env)

    def p(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]

    added50 = statistics.median(through) - statistics.median(direct)
    added99 = p(through, 99) - p(direct, 99)
    verdict = "ok" if added99 < LATENCY_GOAL else "OVER GOAL"
    print(f"output      per-line delay, {len(through)} lines every 10 ms: through once "
          f"median {statistics.median(through):5.2f} ms p99 {p(through, 99):5.2f} ms, "
          f"directly {statistics.median(direct):5.2f} / {p(direct, 99):5.2f} ms; added "
          f"{added50:5.2f} / {added99:5.2f} ms (goal p99 < {LATENCY_GOAL:g} ms)  {verdict}")


def _drain(stream: object) -> None:
    read = stream.read  # type: ignore[attr-defined]
    while read(1 << 20):
        pass


def _pss_while_writing(env: dict[str, str], tail: str) -> int:
    """KiB of PSS of once run and its guard, a second into `yes` writing flat out."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench import _children, _pss

    proc = subprocess.Popen([ONCE, "run", "--job", _job(), "--every", "day", "--output-tail",
                             tail, "--", "yes"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)  # its line about the SIGTERM below
    reader = threading.Thread(target=_drain, args=(proc.stdout,), daemon=True)
    reader.start()
    try:
        time.sleep(1.5)  # claimed, started, the relay (if any) at full speed
        return _pss(proc.pid) + sum(_pss(pid) for pid in _children(proc.pid))
    finally:
        proc.send_signal(signal.SIGTERM)  # forwarded to `yes`
        proc.wait(60)
        reader.join(10)


def memory(env: dict[str, str]) -> None:
    off = _pss_while_writing(env, "0")
    on = _pss_while_writing(env, "16KiB")
    verdict = "ok" if on - off <= PSS_DELTA_GOAL else "OVER GOAL"
    print(f"output      wrapper memory while the command writes: capture on {on / 1024:5.1f} "
          f"MiB, off {off / 1024:5.1f} MiB PSS: {(on - off) / 1024:+5.1f} MiB (goal <= "
          f"+{PSS_DELTA_GOAL // 1024} MiB)  {verdict}")


def run(url: str) -> None:
    env = {**os.environ, "ONCE_DATABASE_URL": url}
    throughput(env)
    latency(env)
    memory(env)
