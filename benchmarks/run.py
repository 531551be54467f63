"""One command for every op's benchmark:

    python benchmarks/run.py [--device cpu|cuda] [--ops nonzero,where,...] [--quick] [--json rows.json]

Each row times ours and the native PyTorch equivalent in this process on the
same inputs; ratio = ours / native (below 1.0: ours is faster). NumPy's time
(CPU runs) and JAX's (where JAX is installed with a backend for the device)
are shown beside them.
"""
import argparse
import importlib
import json
import os
import platform
import signal
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# The benchmark modules sit beside this file; the package (built in place or
# installed) is found from the repository root.
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import torch_masked  # noqa: E402,F401
from harness import print_table, run_case, settle_heap  # noqa: E402

OPS = ["nonzero", "where", "boolean_mask", "scatter_nd", "compiled", "overhead"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated, from: " + ", ".join(OPS))
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    parser.add_argument("--json", help="also write the rows there, for benchmarks/goals.py")
    args = parser.parse_args()
    settle_heap()

    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.processor() or 'cpu'}, {torch.get_num_threads()} threads"
    title = f"torch_masked benchmarks on {args.device} ({where}), torch {torch.__version__}"
    rows = []
    # The rows measured so far survive a case that fails or a run that is cut
    # short (`timeout` sends SIGTERM): the JSON is rewritten after every row,
    # the table printed anyway.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        for op in args.ops.split(","):
            module = importlib.import_module(f"bench_{op}")
            for case in module.cases(args.device, args.quick):
                row = run_case(case, args.device)
                rows.append(row)
                print(f"  {case.op} {case.name}: ours/native = {row.ratio:.2f}", file=sys.stderr, flush=True)
                if args.json:
                    write_json(args.json, title, args.device, rows)
    finally:
        print_table(rows, title)


def write_json(path, title, device, rows, runs=None):
    """The rows (and, from report.py, the records of the runs that measured
    them) as JSON, for goals.py and report.py --from-json."""
    saved = {"title": title, "device": device, "rows": [row.as_dict() for row in rows]}
    if runs:
        saved["runs"] = runs
    with open(path + ".part", "w") as f:
        json.dump(saved, f, indent=1)
    os.replace(path + ".part", path)


if __name__ == "__main__":
    main()
