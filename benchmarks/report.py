"""The benchmark report: every op's rows, the copy bandwidth they are read
against, tables and plots, in one command.

    python benchmarks/report.py [--device cpu|cuda] [--ops nonzero,...] [--quick] [--out benchmarks/RESULTS.md]

    python benchmarks/report.py --device cuda --from-json first.json second.json

It first measures the memory-copy bandwidth of this device (a large float32
copy into a reused output, and into a fresh one), then runs the cases of
every module in run.py's OPS through the harness (ours, native, NumPy and,
where installed, JAX taking turns), and writes:
- the report's section for this device in --out (the other device's section
  is kept): a summary, then per op a table (ours, native, NumPy, JAX where a
  row has it, ours / native, ours / JAX, ours / fastest peer, GB/s and share
  of the copy bandwidth where the case counts its bytes) and its plot, then
  the speed goals (goals.py);
- a PNG per op beside it, plots/<device>/<op>.png (matplotlib; without it the
  report says so and has no plots): time ratio against size, and achieved
  GB/s against the copy bandwidth;
- the rows as JSON for goals.py (--json; plots/<device>/rows.json unless told).
A case that raises is reported as failed and the command exits with 1 after
writing the report. With --from-json it measures nothing: it writes the
section, plots and JSON again from the rows and run records that earlier
runs saved, in the order given (the calls of a GPU run split by a time
limit, say); the section names each run.
"""
import argparse
import datetime
import importlib
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import goals  # noqa: E402
import jax_peer  # noqa: E402
from harness import Case, Row, fmt, fmt_ms, has_jax, print_table, run_case, settle_heap, time_interleaved  # noqa: E402
from run import OPS, write_json  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "RESULTS.md")
# Methods and the GPU history are written by hand, beside the report.
HEADER = """# Benchmark results

Written by `python benchmarks/report.py` (one section per device; each run
rewrites its device's section). How the figures are taken:
[METHODS.md](METHODS.md). Earlier GPU figures and the CUDA changes not yet
timed on a GPU: [GPU_HISTORY.md](GPU_HISTORY.md).
"""


def section_markers(device):
    return f"<!-- report:{device} begin -->", f"<!-- report:{device} end -->"


# -- measuring ----------------------------------------------------------------


def copy_bandwidth(device, quick):
    """Bytes per second (read + write) of copying a large float32 tensor:
    (into a reused output, into a fresh one). The reused one is the ceiling
    the report reads bandwidths against; the fresh one also pays what a new
    output costs (first-touch page faults on the CPU)."""
    numel = 10**6 if quick else (10**8 if device == "cuda" else 25 * 10**6)
    x = torch.randn(numel, device=device)
    reused = torch.empty_like(x)
    times = time_interleaved([lambda: reused.copy_(x), lambda: x.clone()], device)
    return tuple(2 * x.nbytes / t for t in times), numel


def measure(ops, device, quick, json_path, title, rows, failures):
    """Appends every case of every op, measured, to rows (the JSON file
    rewritten after each), and to failures (op, case name or None, error
    text) what raised."""
    for op in ops:
        try:
            cases = iter(importlib.import_module(f"bench_{op}").cases(device, quick))
        except Exception as error:  # noqa: BLE001 - reported, the other ops still run
            failures.append((op, None, describe(error)))
            continue
        while True:
            try:
                case = next(cases)
            except StopIteration:
                break
            except Exception as error:  # noqa: BLE001 - a module whose case making fails
                failures.append((op, None, describe(error)))
                break
            try:
                row = run_case(case, device)
            except Exception as error:  # noqa: BLE001 - one case failing leaves the others
                failures.append((op, case.name, describe(error)))
                print(f"  {case.op} {case.name}: FAILED {describe(error)}", file=sys.stderr, flush=True)
                continue
            rows.append(row)
            print(f"  {case.op} {case.name}: ours/native = {row.ratio:.2f}", file=sys.stderr, flush=True)
            write_json(json_path, title, device, rows)


def describe(error):
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" ({os.path.basename(frame.filename)}:{frame.lineno})" if frame else ""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}{where}"


def machine(device):
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip()
        except (OSError, subprocess.SubprocessError):
            driver = ""
        return (f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
                + (f", driver {driver}" if driver else ""))
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"


# -- the tables ---------------------------------------------------------------


def fastest_peer(row):
    """(seconds, name) of the fastest of the native side, NumPy's and JAX's."""
    peers = [(row.native_s, "native"), (row.numpy_s, "NumPy"), (row.jax_s, "JAX")]
    return min((peer for peer in peers if peer[0] is not None), key=lambda peer: peer[0])


def peer_names(rows):
    """The sides that rows are compared with, as words: 'native or NumPy'."""
    names = ["native"] + [name for name, seconds in (("NumPy", "numpy_s"), ("JAX", "jax_s"))
                          if any(getattr(row, seconds) is not None for row in rows)]
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def group_by_op(rows):
    groups = {}
    for row in rows:
        groups.setdefault(row.case.op, []).append(row)
    return groups


def op_table(rows, copy):
    natives = sorted({row.case.native_name for row in rows})
    one_native = len(natives) == 1
    header = ["case"] + ([] if one_native else ["native"]) + [
        "ours ms", "native ms", "NumPy ms", "JAX ms", "ours / native", "ours / JAX", "ours / fastest", "ours GB/s",
        "of copy", "floor ms"]
    table = []
    for row in rows:
        c = row.case
        peer_s, _ = fastest_peer(row)
        gbs = c.bytes_moved / row.ours_s / 1e9 if c.bytes_moved else None
        share = c.bytes_moved / row.ours_s / copy if c.bytes_moved else None
        floor = c.bytes_moved / copy if c.bytes_moved else None
        ratio = row.ours_s / peer_s
        table.append([c.name] + ([] if one_native else [f"`{c.native_name}`"]) + [
            fmt_ms(row.ours_s).strip(), fmt_ms(row.native_s).strip(), fmt_ms(row.numpy_s).strip(),
            fmt_ms(row.jax_s).strip(), f"{row.ratio:.2f}", fmt(row.jax_ratio, ".2f"),
            f"**{ratio:.2f}**" if ratio > 1 else f"{ratio:.2f}", fmt(gbs, ".1f"), fmt(share, ".0%"),
            fmt_ms(floor).strip()])
    native = f"Native: `{natives[0]}`. " if one_native else ""
    return native, markdown_table(header, table, has_jax(rows))


def markdown_table(header, table, with_jax):
    """The table's lines, the first column left-aligned, the others right;
    the JAX columns only with_jax."""
    keep = [with_jax or "JAX" not in name for name in header]
    header, *table = [[cell for cell, kept in zip(cells, keep) if kept] for cells in [header] + table]
    rule = "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"
    return "\n".join(["| " + " | ".join(header) + " |", rule] + ["| " + " | ".join(cells) + " |" for cells in table])


def summary_table(groups):
    table = []
    for op, rows in groups.items():
        fastest = [row.ours_s / fastest_peer(row)[0] for row in rows]
        table.append([f"[{op}](#{anchor(op)})", str(len(rows)), span([row.ratio for row in rows]),
                      span([row.jax_ratio for row in rows if row.jax_s is not None]), span(fastest),
                      str(sum(r > 1 for r in fastest))])
    header = ["op", "rows", "ours / native", "ours / JAX", "ours / fastest peer", "rows a peer wins"]
    return markdown_table(header, table, any(has_jax(rows) for rows in groups.values()))


def span(ratios):
    return f"{min(ratios):.2f}–{max(ratios):.2f}" if ratios else "-"


def anchor(op):
    """GitHub's anchor of a '### op' heading."""
    return re.sub(r"[^a-z0-9 _-]", "", op.lower()).replace(" ", "-")


def goals_table(device, rows):
    found = goals.evaluate(device, [row.as_dict() for row in rows])
    lines = ["| goal | target | met | measured |", "|---|---|---|---|"]
    for name, measured, target, met in found:
        verdict = "" if not target else ("yes" if met else "**no**")
        lines.append(f"| {name} | {target} | {verdict} | {measured} |")
    return "\n".join(lines)


# -- the plots ----------------------------------------------------------------


def plot_name(op):
    return re.sub(r"[^A-Za-z0-9]+", "_", op).strip("_") + ".png"


def plot_op(plt, op, rows, copy, device, path):
    """Left: ours / fastest peer against size, a line per series, 1.0 marked.
    Right: our GB/s against size, the copy bandwidth marked. Rows without a
    size are drawn as bars, one per case."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    sized = [row for row in rows if row.case.size]
    series = {}
    for row in sized:
        series.setdefault(row.case.series or row.case.name, []).append(row)
    colors = plt.get_cmap("tab20" if len(series) > 10 else "tab10")
    peers = peer_names(rows)
    if sized:
        for k, (name, points) in enumerate(series.items()):
            points.sort(key=lambda row: row.case.size)
            sizes = [row.case.size for row in points]
            color = colors(k % colors.N)
            left.plot(sizes, [row.ours_s / fastest_peer(row)[0] for row in points], "o-", color=color, label=name)
            moved = [row for row in points if row.case.bytes_moved]
            if moved:
                right.plot([row.case.size for row in moved],
                           [row.case.bytes_moved / row.ours_s / 1e9 for row in moved], "o-", color=color)
        for axes in (left, right):
            axes.set_xscale("log")
            axes.xaxis.set_minor_formatter(plt.NullFormatter())
        left.set_xlabel("size (elements)")
        right.set_xlabel("size (elements)")
    else:
        names = [row.case.name for row in rows]
        left.barh(names, [row.ours_s / fastest_peer(row)[0] for row in rows])
        moved = [row for row in rows if row.case.bytes_moved]
        right.barh([row.case.name for row in moved], [row.case.bytes_moved / row.ours_s / 1e9 for row in moved])
    ratios = [row.ours_s / fastest_peer(row)[0] for row in rows] + [1.0]
    if max(ratios) / min(ratios) > 8:
        # A wide range on a log scale: 0.25 and 4 lie as far from parity.
        (left.set_yscale if sized else left.set_xscale)("log")
        ratio_axis = left.yaxis if sized else left.xaxis
        ratio_axis.set_major_locator(plt.LogLocator(subs=(1.0, 2.0, 5.0)))
        ratio_axis.set_major_formatter(plt.FormatStrFormatter("%g"))
        ratio_axis.set_minor_formatter(plt.NullFormatter())
    ratio_line = left.axhline if sized else left.axvline
    ratio_line(1.0, color="black", linestyle="--", linewidth=1)
    (left.set_ylabel if sized else left.set_xlabel)(f"time: ours / fastest peer ({peers})\nbelow 1: ours is faster")
    left.set_title(f"{op} on {device}: time ratio")
    copy_line = right.axhline if sized else right.axvline
    copy_line(copy / 1e9, color="black", linestyle="--", linewidth=1, label=f"copy {copy / 1e9:.1f} GB/s")
    (right.set_ylabel if sized else right.set_xlabel)("ours, GB/s (bytes a perfect kernel moves)")
    right.set_title(f"{op} on {device}: achieved bandwidth")
    if not any(row.case.bytes_moved for row in rows):
        right.clear()
        right.set_axis_off()
        right.text(0.5, 0.5, "these rows count no bytes", ha="center", transform=right.transAxes)
    else:
        right.legend(loc="upper left", fontsize=8)
    if sized:
        fig.legend(*left.get_legend_handles_labels(), loc="lower center", ncol=min(4, len(series)), fontsize=8)
        fig.tight_layout(rect=(0, 0.035 * math.ceil(len(series) / 4) + 0.03, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def load_pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# -- the report ---------------------------------------------------------------


def run_record(device, command, seconds, copies, copy_numel, load):
    """What the report says of the run that measured its rows, kept in the
    JSON beside them, so that a section can be written again from saved runs
    (--from-json)."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {"machine": machine(device), "when": when, "torch": torch.__version__, "numpy": np.__version__,
            "jax": jax_peer.jax.__version__ if jax_peer.jax is not None else None, "command": command,
            "seconds": round(seconds), "copies": list(copies), "copy_numel": copy_numel,
            # The load average at the start and the end, and the threads it is read against.
            "load": [load[0], os.getloadavg()[0], torch.get_num_threads()] if device == "cpu" else None}


def describe_run(run, with_jax):
    """One run as the section's line: when, versions, command, time, load."""
    line = (f"{run['when']}; torch {run['torch']}, NumPy {run['numpy']}"
            + (f", JAX {run['jax']}" if with_jax and run["jax"] else "") + f"; `{run['command']}`, {run['seconds']} s")
    if run["load"] is None:
        return line + "."
    start, end, threads = run["load"]
    busy = max(start, end) > threads
    return line + (f"; load average {start:.1f} at the start, {end:.1f} at the end"
                   + (" (above the thread count: other processes shared the cores, and the times are less sure)."
                      if busy else "."))


def device_section(device, rows, failures, runs, plots, plot_dir, out_dir):
    """The report's section for a device: rows measured by one run, or by
    several (--from-json), each of which the section names; the copy
    bandwidth is the first run's."""
    heading = "GPU" if device == "cuda" else "CPU"
    with_jax = has_jax(rows)
    if len(runs) == 1:
        when = [describe_run(runs[0], with_jax)]
    else:
        when = [f"Rows from {len(runs)} runs on this machine, in this order:", ""] + [
            f"- {describe_run(run, with_jax)}" for run in runs] + [""]
    copy_reused, copy_fresh = runs[0]["copies"]
    parts = [
        f"## {heading}: {runs[0]['machine']}",
        "",
        *when,
        f"Copy bandwidth (read + write, {runs[0]['copy_numel']:.0e} float32, median): "
        f"**{copy_reused / 1e9:.1f} GB/s** into a reused output, {copy_fresh / 1e9:.1f} GB/s into a fresh one. "
        f"Shares (`of copy`) and floors (the bytes a perfect kernel moves at that speed) are read against the reused "
        f"figure (rows whose data fit in the caches can pass it); every benchmark row allocates its outputs afresh.",
        "",
        f"Ratios below 1: ours is faster. `ours / fastest` is against the fastest of {peer_names(rows)} "
        "(bold where a peer is faster).",
        "",
    ]
    if plots is None:
        parts += ["**No plots: matplotlib is not installed** (`pip install -e .[bench]`).", ""]
    if failures:
        parts += ["**Failed:**", ""] + [f"- {op}{' ' + name if name else ''}: `{error}`" for op, name, error in failures] + [""]
    groups = group_by_op(rows)
    if groups:
        parts += ["### Summary", "", summary_table(groups), ""]
    for op, op_rows in groups.items():
        native, table = op_table(op_rows, copy_reused)
        parts += [f"### {op}", "", f"{native}Times in ms, median of turns.", "", table, ""]
        if plots is not None:
            plot_op(plots, op, op_rows, copy_reused, device, os.path.join(plot_dir, plot_name(op)))
            link = os.path.relpath(os.path.join(plot_dir, plot_name(op)), out_dir).replace(os.sep, "/")
            parts += [f"![{op} on {device}]({link})", ""]
    if rows:
        parts += ["### Speed goals", "", "From `benchmarks/goals.py`.", "", goals_table(device, rows), ""]
    return "\n".join(parts)


def merge(out, device, section):
    """The report file with this device's section replaced (or added), the
    other device's kept."""
    begin, end = section_markers(device)
    kept = {}
    if os.path.exists(out):
        with open(out) as f:
            old = f.read()
        for other in ("cpu", "cuda"):
            b, e = section_markers(other)
            match = re.search(re.escape(b) + r".*?" + re.escape(e), old, re.S)
            if match and other != device:
                kept[other] = match.group(0)
    kept[device] = f"{begin}\n{section}\n{end}"
    return HEADER + "".join(f"\n{kept[d]}\n" for d in ("cpu", "cuda") if d in kept)


def rows_from_json(path):
    """The rows and run records that a report saved (its --json): rows as
    measured, without their callables."""
    with open(path) as f:
        saved = json.load(f)
    rows = [Row(Case(r["op"], r["case"], None, None, r["native"], bytes_moved=r["bytes_moved"], size=r["size"],
                     series=r["series"]), r["ours_s"], r["native_s"], r["numpy_s"], r["jax_s"])
            for r in saved["rows"]]
    if not saved.get("runs"):
        raise SystemExit(f"report: {path} holds no run record (it was not written by report.py)")
    return saved, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated, from: " + ", ".join(OPS))
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="the report file (default benchmarks/RESULTS.md)")
    parser.add_argument("--plots", help="folder for the PNGs (default: plots/<device> beside --out)")
    parser.add_argument("--json", help="the rows, for goals.py (default: rows.json in the plots folder)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's own choice)")
    parser.add_argument("--from-json", nargs="+", metavar="ROWS_JSON",
                        help="measure nothing: write the section from the rows that earlier runs saved (--json), "
                             "in the order given, e.g. the calls of a GPU run split by a time limit")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    out = os.path.abspath(args.out)
    plot_dir = os.path.abspath(args.plots or os.path.join(os.path.dirname(out), "plots", args.device))
    os.makedirs(plot_dir, exist_ok=True)
    json_path = args.json or os.path.join(plot_dir, "rows.json")
    plots = load_pyplot()
    if plots is None:
        print("report: matplotlib is not installed; the report will have no plots", file=sys.stderr)
    if args.from_json:
        rows, runs = [], []
        for path in args.from_json:
            saved, saved_rows = rows_from_json(path)
            if saved["device"] != args.device:
                raise SystemExit(f"report: {path} holds rows of {saved['device']}, not {args.device}")
            rows += saved_rows
            runs += saved["runs"]
        write_sections(out, args.device, rows, [], runs, plots, plot_dir, json_path, saved["title"])
        return

    settle_heap()
    start, load = time.perf_counter(), os.getloadavg()
    title = f"torch_masked benchmarks on {args.device} ({machine(args.device)}), torch {torch.__version__}"
    copies, copy_numel = copy_bandwidth(args.device, args.quick)
    print(f"report: copy bandwidth {copies[0] / 1e9:.1f} GB/s (reused output), {copies[1] / 1e9:.1f} GB/s (fresh)",
          file=sys.stderr, flush=True)
    # A run cut short (`timeout` sends SIGTERM) still writes what it measured.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rows, failures = [], []
    try:
        measure(args.ops.split(","), args.device, args.quick, json_path, title, rows, failures)
    except SystemExit:
        failures.append(("report", None, "cut short (SIGTERM)"))
    finally:
        # Writing what was measured is not cut short in turn.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # The command as run, JAX's exclusion included, so that the report says how to take it again.
        command = "BENCH_JAX=0 " if os.environ.get("BENCH_JAX") == "0" else ""
        command += "python benchmarks/report.py --device " + args.device + (" --quick" if args.quick else "")
        if args.ops != ",".join(OPS):
            command += f" --ops {args.ops}"
        if args.threads:
            command += f" --threads {args.threads}"
        run = run_record(args.device, command, time.perf_counter() - start, copies, copy_numel, load)
        write_sections(out, args.device, rows, failures, [run], plots, plot_dir, json_path, title)
    sys.exit(1 if failures else 0)


def write_sections(out, device, rows, failures, runs, plots, plot_dir, json_path, title):
    """The device's section into the report file, the rows with their runs
    into the JSON, and the table to stdout."""
    section = device_section(device, rows, failures, runs, plots, plot_dir, os.path.dirname(out))
    text = merge(out, device, section)
    with open(out, "w") as f:
        f.write(text)
    write_json(json_path, title, device, rows, runs)
    print_table(rows, title)
    print(f"report: {len(rows)} rows, {len(failures)} failures -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
