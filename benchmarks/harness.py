"""Times our op and the native PyTorch way (and NumPy's, on the CPU) in the
same process, on the same inputs, and prints the ratio.

Each benchmarks/bench_<op>.py defines ``cases(device, quick)`` yielding Case
objects; benchmarks/run.py collects and prints them.
"""
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
    # Bytes a perfect implementation must read and write, for a bandwidth column.
    bytes_moved: Optional[int] = None


@dataclass
class Row:
    case: Case
    ours_s: float
    native_s: float
    numpy_s: Optional[float]

    @property
    def ratio(self):
        return self.ours_s / self.native_s

    def as_dict(self):
        return {"op": self.case.op, "case": self.case.name, "native": self.case.native_name,
                "ours_s": self.ours_s, "native_s": self.native_s, "numpy_s": self.numpy_s,
                "bytes_moved": self.case.bytes_moved}


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


def time_interleaved(fns, device, min_seconds=0.5, max_rounds=200, warmup=2):
    """Median seconds of one call of each fn. The calls take turns, one of
    each per round, so that a machine whose speed drifts (other tenants,
    frequency changes) slows every side alike instead of whichever ran in
    the slow moment; the round's first call rotates, so that no side always
    follows the same one (and finds its inputs in cache, or evicted). Every
    side allocates its outputs anew on every call, so page faults on fresh
    memory are paid alike."""
    is_cuda = torch.device(device).type == "cuda"
    for fn in fns:
        for _ in range(warmup):
            fn()
    if is_cuda:
        torch.cuda.synchronize()
    samples = [[] for _ in fns]
    start_all = time.perf_counter()
    rounds = 0
    while rounds < max_rounds and (rounds < 5 or time.perf_counter() - start_all < min_seconds):
        for k in range(len(fns)):
            side = (rounds + k) % len(fns)
            samples[side].append(time_one_call(fns[side], is_cuda))
        rounds += 1
    return [statistics.median(fn_samples) for fn_samples in samples]


def run_case(case, device):
    fns = [case.ours, case.native] + ([case.numpy] if case.numpy is not None else [])
    times = time_interleaved(fns, device)
    return Row(case, times[0], times[1], times[2] if case.numpy is not None else None)


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:9.3f}"


def print_table(rows, title):
    print(f"\n{title}")
    header = f"{'op':<22} {'case':<40} {'ours ms':>9} {'native ms':>9} {'ratio':>6} {'numpy ms':>9} {'ours GB/s':>9}  native"
    print(header)
    print("-" * len(header))
    for row in rows:
        c = row.case
        gbs = f"{c.bytes_moved / row.ours_s / 1e9:9.1f}" if c.bytes_moved else "        -"
        print(
            f"{c.op:<22} {c.name:<40} {fmt_ms(row.ours_s)} {fmt_ms(row.native_s)} {row.ratio:6.2f} "
            f"{fmt_ms(row.numpy_s)} {gbs}  {c.native_name}"
        )
