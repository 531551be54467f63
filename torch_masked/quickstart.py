"""A tour of every op on the reference pages' examples, then a small speed
comparison with the native PyTorch way of doing the same thing.

    python -m torch_masked.quickstart [--device cpu|cuda]
"""
import argparse
import time

import torch

import torch_masked as tm


def show(title, value):
    if isinstance(value, (tuple, list)):
        value = tuple(v.tolist() for v in value)
    elif isinstance(value, torch.Tensor):
        value = value.tolist()
    print(f"  {title:<58} -> {value}")


def tour(device):
    t = lambda values, **kw: torch.tensor(values, device=device, **kw)  # noqa: E731

    print("nonzero (torch.nonzero page)")
    show("nonzero([1, 1, 1, 0, 1])", tm.nonzero(t([1, 1, 1, 0, 1])))
    show("nonzero([1, 1, 1, 0, 1], as_tuple=True)", tm.nonzero(t([1, 1, 1, 0, 1]), as_tuple=True))
    show("nonzero(5, as_tuple=True)", tm.nonzero(t(5), as_tuple=True))
    show("nonzero_static([0, 3, 0, 4], size=3)", tm.nonzero_static(t([0, 3, 0, 4]), size=3))


def time_ms(fn, device, reps=20):
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return sorted(samples)[reps // 2] * 1e3


def speed(device):
    n = 10_000_000 if device == "cuda" else 1_000_000
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(n, generator=gen) < 0.5).to(device)
    rows = [
        ("nonzero, bool", lambda: tm.nonzero(mask), lambda: torch.nonzero(mask), "torch.nonzero"),
    ]
    print(f"\nspeed on {device}, {n:.0e} elements (median of 20; full tables: python benchmarks/run.py)")
    print(f"  {'op':<34} {'ours ms':>9} {'native ms':>10} {'ratio':>6}  native")
    for name, ours, native, native_name in rows:
        a, b = time_ms(ours, device), time_ms(native, device)
        print(f"  {name:<34} {a:9.3f} {b:10.3f} {a / b:6.2f}  {native_name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args().device
    print(f"torch_masked on {device}, torch {torch.__version__}\n")
    tour(device)
    speed(device)


if __name__ == "__main__":
    main()
