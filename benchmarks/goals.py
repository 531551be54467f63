"""The speed goals, read from the rows that ``run.py --json`` wrote: one short
table, each goal with what was measured and whether it is met.

    python benchmarks/run.py --device cuda --json rows.json && python benchmarks/goals.py rows.json

On CUDA the copy bandwidth that bandwidth goals are read against comes from
the ``where ... vs copy`` row (its native side is ``x.clone()``, 8 bytes per
element).
"""
import json
import sys


def worst(rows):
    """The row with the highest ours / native ratio, as (ratio, text)."""
    row = max(rows, key=lambda r: r["ours_s"] / r["native_s"])
    return row["ours_s"] / row["native_s"], f"{row['op']} {row['case']} vs {row['native']}"


def ratio_goal(name, rows, limit=None):
    """The worst ratio among `rows` against `limit` (None: shown for reference)."""
    if not rows:
        return None
    ratio, where = worst(rows)
    if limit is None:
        return name, f"worst {ratio:.2f}: {where}", "", True
    return name, f"worst {ratio:.2f}: {where}", f"<= {limit:.2f}", ratio <= limit


def copy_bandwidth(rows):
    """Bytes per second of a device-to-device copy, from the `vs copy` row."""
    for row in rows:
        if row["case"].endswith("vs copy"):
            return 2 * 4 * 10**8 / row["native_s"] if "1e+08" in row["case"] else None
    return None


def bandwidth_goal(name, row, copy, share):
    achieved = row["bytes_moved"] / row["ours_s"]
    return name, f"{achieved / 1e9:.0f} GB/s = {achieved / copy:.0%} of copy", f">= {share:.0%}", achieved >= share * copy


def cpu_goals(rows):
    put = [r for r in rows if r["native"] == "index_put_(accumulate=True)"]
    return [
        ratio_goal("every row: ours / native", rows, 1.0),
        ratio_goal("bfloat16 and slice scatter vs index_put_ (1.5x faster)",
                   [r for r in put if "bfloat16" in r["case"] or "slice" in r["case"]], 1 / 1.5),
    ]


def cuda_goals(rows):
    goals = []
    copy = copy_bandwidth(rows)
    at_1e8 = [r for r in rows if "1e+08" in r["case"] and not r["case"].endswith("vs copy")]
    where = [r for r in rows if r["op"] in ("where", "select") and not r["case"].endswith("vs copy")]
    goals.append(ratio_goal("where/select vs torch.where, every row", where, 1.0))
    forward_mask = [r for r in at_1e8 if r["op"] == "boolean_mask"]
    goals.append(ratio_goal("boolean_mask at 1e8 vs native indexing", forward_mask, 1.0))
    if copy is not None:
        goals.append(("copy bandwidth (x.clone() of 1e8 float32)", f"{copy / 1e9:.0f} GB/s", "", True))
        for row in at_1e8:
            if row["op"] == "where" and row["case"].startswith("same shape"):
                goals.append(bandwidth_goal(f"where {row['case']}", row, copy, 0.85))
            if row["op"] == "boolean_mask" and "d=0.99" in row["case"]:
                goals.append(bandwidth_goal(f"boolean_mask {row['case']}", row, copy, 0.70))
    scatter = [r for r in rows if r["op"] == "scatter_nd"]
    atomic = [r for r in scatter if r["native"] == "index_put_(accumulate=True)"]
    deterministic = [r for r in scatter if r["case"].endswith(" deterministic")]
    goals.append(ratio_goal("scatter atomic path vs index_put_(accumulate=True)", atomic, 1.0))
    goals.append(ratio_goal("scatter deterministic vs deterministic index_put_", deterministic, 1.0))
    atomic_time = {r["case"]: r["ours_s"] for r in atomic}
    for row in deterministic:
        base = row["case"][: -len(" deterministic")]
        if base in atomic_time:
            times = row["ours_s"] / atomic_time[base]
            goals.append((f"deterministic / atomic, {base}", f"{times:.2f}x", "<= 2.00x", times <= 2.0))
    goals.append(ratio_goal("compiled chains vs the native chains compiled, every row",
                            [r for r in rows if r["op"] == "compiled"], 1.0))
    goals.append(ratio_goal("compiled training steps vs the native steps compiled, every row",
                            [r for r in rows if r["op"] == "compiled fwd+bwd"], 1.0))
    goals.append(ratio_goal("nonzero vs torch.nonzero (for reference)",
                            [r for r in rows if r["op"].startswith("nonzero")]))
    return goals


def evaluate(device, rows):
    """(name, measured, target, met) of every goal the rows can tell. The
    per-call overhead rows (bench_overhead.py) are for reference only: a
    ten-element call is dispatch, not kernel."""
    rows = [r for r in rows if not (r.get("series") or "").startswith("overhead")]
    goals = cuda_goals(rows) if device == "cuda" else cpu_goals(rows)
    return [g for g in goals if g is not None]


def main(path):
    with open(path) as f:
        report = json.load(f)
    goals = evaluate(report["device"], report["rows"])
    print(f"\nSpeed goals: {report['title']}")
    width = max(len(g[0]) for g in goals)
    for name, measured, target, met in goals:
        verdict = "" if not target else ("met" if met else "NOT MET")
        print(f"  {name:<{width}}  {target:>9}  {verdict:<7}  {measured}")


if __name__ == "__main__":
    main(sys.argv[1])
