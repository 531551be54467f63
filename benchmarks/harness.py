"""Times our op and the native PyTorch way (and NumPy's, on the CPU, and
JAX's, where installed) in the same process, on the same inputs, and prints
the ratio.

Each benchmarks/bench_<op>.py defines ``cases(device, quick)`` yielding Case
objects; benchmarks/run.py collects and prints them.
"""
import ctypes
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass
class Case:
    op: str
    name: str
    ours: Callable[[], object]
    native: Callable[[], object]
    native_name: str
    numpy: Optional[Callable[[], object]] = None
    # From jax_peer.side: returns once JAX's results are ready.
    jax: Optional[Callable[[], object]] = None
    # Bytes a perfect implementation must read and write, for a bandwidth column.
    bytes_moved: Optional[int] = None
    # For the report's plots: the input's size (elements) on the x axis, and
    # the line the row belongs to (a case or density, without the size).
    size: Optional[int] = None
    series: Optional[str] = None


@dataclass
class Row:
    case: Case
    ours_s: float
    native_s: float
    numpy_s: Optional[float]
    jax_s: Optional[float] = None

    @property
    def ratio(self):
        return self.ours_s / self.native_s

    @property
    def jax_ratio(self):
        return None if self.jax_s is None else self.ours_s / self.jax_s

    def as_dict(self):
        return {"op": self.case.op, "case": self.case.name, "native": self.case.native_name,
                "ours_s": self.ours_s, "native_s": self.native_s, "numpy_s": self.numpy_s,
                "jax_s": self.jax_s, "bytes_moved": self.case.bytes_moved,
                "size": self.case.size, "series": self.case.series}


# glibc's mallopt parameters, and the values its own rule reaches once a
# process has freed a 32 MiB buffer (the largest it adapts to).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES = 32 * 2**20


def settle_heap():
    """Fixes where glibc puts large buffers and when it hands freed heap back
    to the kernel, at the state its own adaptive rule settles in: buffers
    under 32 MiB from the heap, which is given back once 64 MiB lie free at
    its top; larger ones mapped afresh on every call, on both sides alike.
    Left to adapt, the rule follows the sizes that the rows before happened
    to free, and a side whose output then lands at the heap's top has it
    given back and faulted in afresh on every call: the same compiled chain
    read 0.6 or 1.4 times native in different processes
    (benchmarks/METHODS.md). No-op where there is no glibc to load."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD_BYTES)


def time_one_call(fn, is_cuda):
    if is_cuda:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _settled(samples):
    """Whether every side's last call took at most 1.25 times its fastest."""
    return all(side[-1] <= 1.25 * min(side) for side in samples)


def _interleaved_rounds(fns, is_cuda, min_seconds, min_rounds, max_rounds, host_timed, settle_seconds=0.0):
    """Seconds of each timed call of each fn, one turn of each per round, for
    at least min_rounds rounds and min_seconds, then, up to settle_seconds in
    all, until every side has settled (_settled). A turn is two calls, only
    the second timed."""
    samples = [[] for _ in fns]
    start = time.perf_counter()
    rounds = 0

    def more():
        elapsed = time.perf_counter() - start
        return (rounds < min_rounds or elapsed < min_seconds
                or (elapsed < settle_seconds and not _settled(samples)))

    while rounds < max_rounds and more():
        for k in range(len(fns)):
            side = (rounds + k) % len(fns)
            fns[side]()
            if is_cuda:
                torch.cuda.synchronize()
            samples[side].append(time_one_call(fns[side], is_cuda and side not in host_timed))
        rounds += 1
    return samples


def time_interleaved(fns, device, min_seconds=0.5, max_rounds=200, host_timed=()):
    """Median seconds of one call of each fn. The sides take turns, one turn
    of each per round, so that a machine whose speed drifts (other tenants,
    frequency changes) slows every side alike instead of whichever ran in
    the slow moment; the round's first turn rotates. Each turn is an untimed
    call, then the timed one, so that every timed call follows a call of its
    own side: what another side left behind (glibc's heap trimmed after a
    large free, so the next large output is faulted in afresh; caches
    evicted) never lands on one side's timings more than another's (with
    three sides, rotation alone would have one side follow NumPy in two
    rounds of three and another in one). Every side allocates its outputs
    anew on every call, so first-touch page faults are paid alike.

    Untimed warm-up rounds come first: two on CUDA; on the CPU, 1.5 s of
    them, and then more until every side's last call is within 1.25 times
    its fastest, up to 10 s (at most max_rounds). On a virtual machine whose
    host takes back the guest's free 2 MiB blocks (free page reporting), the
    first few hundred megabytes of fresh huge-page memory that a process's
    large outputs land on cost about ten times the usual first touch; the
    warm-up lets that pass for every side before the timing
    (benchmarks/METHODS.md gives its size).

    On CUDA the calls are timed with CUDA events on torch's current stream,
    but those of the fns at the positions in host_timed (their work is on
    streams the events do not see, and they return once it is done) with
    the host's clock."""
    is_cuda = torch.device(device).type == "cuda"
    _interleaved_rounds(fns, is_cuda, 0.0 if is_cuda else 1.5, 2, max_rounds, host_timed,
                        settle_seconds=0.0 if is_cuda else 10.0)
    samples = _interleaved_rounds(fns, is_cuda, min_seconds, 5, max_rounds, host_timed)
    return [statistics.median(fn_samples) for fn_samples in samples]


def run_case(case, device):
    sides = [case.ours, case.native, case.numpy, case.jax]
    present = [k for k, fn in enumerate(sides) if fn is not None]
    # JAX works on its own CUDA streams: its side is timed on the host.
    times = time_interleaved([sides[k] for k in present], device,
                             host_timed=[present.index(3)] if case.jax is not None else [])
    seconds = dict(zip(present, times))
    return Row(case, seconds[0], seconds[1], seconds.get(2), seconds.get(3))


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:9.3f}"


def fmt(value, spec, suffix=""):
    return "-" if value is None else f"{value:{spec}}{suffix}"


def has_jax(rows):
    """Whether any of rows has JAX's figure (its columns are shown only then)."""
    return any(row.jax_s is not None for row in rows)


def print_table(rows, title):
    """One line a row; the JAX columns only where a row has JAX's figure."""
    with_jax = has_jax(rows)
    print(f"\n{title}")
    header = (f"{'op':<22} {'case':<40} {'ours ms':>9} {'native ms':>9} {'ratio':>6} {'numpy ms':>9} "
              + (f"{'jax ms':>9} {'ours/jax':>8} " if with_jax else "") + f"{'ours GB/s':>9}  native")
    print(header)
    print("-" * len(header))
    for row in rows:
        c = row.case
        gbs = f"{c.bytes_moved / row.ours_s / 1e9:9.1f}" if c.bytes_moved else "        -"
        jax = f"{fmt_ms(row.jax_s):>9} {fmt(row.jax_ratio, '8.2f'):>8} " if with_jax else ""
        print(
            f"{c.op:<22} {c.name:<40} {fmt_ms(row.ours_s)} {fmt_ms(row.native_s)} {row.ratio:6.2f} "
            f"{fmt_ms(row.numpy_s)} {jax}{gbs}  {c.native_name}"
        )
