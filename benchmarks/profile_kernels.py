"""Where the time of chosen benchmark cases goes, kernel by kernel (CUDA):

    python benchmarks/profile_kernels.py --ops scatter_nd --match "U=1e+07 N=1e+07 float32 deterministic"

The cases are the benchmarks' own (``bench_<op>.cases``) of the modules
``--ops`` names, picked by a substring of ``op case`` (``--match``,
repeatable). A module makes every case's inputs before the match is known
(``compiled`` compiles every chain), so ``--ops`` names the few needed.
Each side, ours and the native one, is warmed up, then called ``--calls``
times under torch.profiler; for each it prints every kernel (and memset or
copy) with its launches and mean device time per call, then the sum of
those against the wall time per call. A gap between the two is time the
device spent idle: launch overhead, host work or a host sync between
kernels.
"""
import argparse
import collections
import importlib
import os
import re
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import torch_masked  # noqa: E402,F401
from run import OPS  # noqa: E402


def short_name(name):
    """A kernel's name without return type, namespaces or parameter list
    (other activities, such as "Memset (Device)", as they are)."""
    if name.startswith("void "):
        name = name[len("void "):]
        depth = 0
        for i in range(len(name) - 1, -1, -1):  # the parameter list's opening parenthesis
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
        name = re.sub(r"\(anonymous namespace\)::|\b\w+::", "", name)
    return name if len(name) <= 90 else name[:87] + "..."


def device_events(fn, calls):
    """(name, device microseconds) of every device activity of `calls` calls of
    fn, and the wall seconds of one call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / calls
    events = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return events, wall


def print_side(label, fn, calls):
    events, wall = device_events(fn, calls)
    launches = collections.Counter(name for name, _ in events)
    micros = collections.Counter()
    for name, us in events:
        micros[name] += us
    print(f"  {label}:")
    for name, total in micros.most_common():
        print(f"    {total / calls:9.1f} us  x{launches[name] / calls:<4g} {short_name(name)}")
    busy = sum(micros.values()) / calls
    print(f"    {busy:9.1f} us on the device of {wall * 1e6:.1f} us a call (wall, profiled)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", required=True, help="the modules to make cases from, comma-separated, from: "
                        + ", ".join(OPS))
    parser.add_argument("--match", action="append", required=True, help="substring of 'op case' (repeatable)")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("profile_kernels.py: no CUDA device")
    print(f"kernel profile on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    unmatched = set(args.match)
    for op in args.ops.split(","):
        for case in importlib.import_module(f"bench_{op}").cases("cuda", False):
            title = f"{case.op} {case.name}"
            found = {m for m in args.match if m in title}
            if found:
                unmatched -= found
                print(f"\n{title} (native: {case.native_name})")
                print_side("ours", case.ours, args.calls)
                print_side("native", case.native, args.calls)
    for m in sorted(unmatched):
        print(f"\nno case of {args.ops} matched {m!r}")


if __name__ == "__main__":
    main()
