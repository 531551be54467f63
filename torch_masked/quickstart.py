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

    print("\nwhere, index mode (tf.where page)")
    show("where([True, False, False, True])", tm.where(t([True, False, False, True])))
    show("where([[1, 0, 0], [1, 0, 1]])", tm.where(t([[1, 0, 0], [1, 0, 1]])))
    show("where([0j, 1+0j, 1j, 1+1j])", tm.where(t([0j, 1 + 0j, 1j, 1 + 1j])))

    print("\nwhere, selecting with broadcasting (tf.where page)")
    show("where([T, F, F, T], [1, 2, 3, 4], [100, 200, 300, 400])",
         tm.where(t([True, False, False, True]), t([1, 2, 3, 4]), t([100, 200, 300, 400])))
    show("where([T, F, F, T], [1, 2, 3, 4], [100])",
         tm.where(t([True, False, False, True]), t([1, 2, 3, 4]), t([100])))
    show("where([[T, F], [F, T]], 1, 100)", tm.where(t([[True, False], [False, True]]), 1, 100))
    show("where(False, [1, 2, 3, 4], 100)", tm.where(t(False), t([1, 2, 3, 4]), 100))
    show("where([T, F, T], x=[[1,2,3],[4,5,6],[7,8,9]], y=[[100],[200],[300]])",
         tm.where(t([True, False, True]), t([[1, 2, 3], [4, 5, 6], [7, 8, 9]]), t([[100], [200], [300]])))

    print("\nselect (TensorFlow's Select / Java Where3)")
    te, ee = t([[1, 2], [3, 4]]), t([[5, 6], [7, 8]])
    show("select([[T, F], [F, T]], [[1,2],[3,4]], [[5,6],[7,8]])", tm.select(t([[True, False], [False, True]]), te, ee))
    show("select([T, F], [[1,2],[3,4]], [[5,6],[7,8]])  (whole rows)", tm.select(t([True, False]), te, ee))

    print("\nboolean_mask (tf.boolean_mask page)")
    show("boolean_mask([0, 1, 2, 3], [T, F, T, F])", tm.boolean_mask(t([0, 1, 2, 3]), t([True, False, True, False])))
    show("boolean_mask([[1, 2], [3, 4], [5, 6]], [T, F, T])",
         tm.boolean_mask(t([[1, 2], [3, 4], [5, 6]]), t([True, False, True])))
    show("boolean_mask([[1, 2], [3, 4], [5, 6]], [F, T], axis=1)",
         tm.boolean_mask(t([[1, 2], [3, 4], [5, 6]]), t([False, True]), axis=1))

    print("\nscatter_nd and gather_nd (tf.scatter_nd page)")
    show("scatter_nd([[4], [3], [1], [7]], [9, 10, 11, 12], [8])",
         tm.scatter_nd([[4], [3], [1], [7]], [9, 10, 11, 12], [8]))
    slices = [[[5, 5, 5, 5], [6, 6, 6, 6], [7, 7, 7, 7], [8, 8, 8, 8]]] * 2
    scattered = tm.scatter_nd(t([[0], [2]]), t(slices), [4, 4, 4])
    show("scatter_nd([[0], [2]], two 4x4 slices, [4, 4, 4])[:, 0]", scattered[:, 0])
    show("scatter_nd([[1], [1]], [1., 2.], [3])  (duplicates add)", tm.scatter_nd([[1], [1]], [1.0, 2.0], [3]))
    show("gather_nd([[1, 2], [3, 4]], [[1, 0], [0, 1]])", tm.gather_nd(t([[1, 2], [3, 4]]), [[1, 0], [0, 1]]))
    show("tensor_scatter_nd_add([1, 1, 1], [[0], [2]], [5, 7])",
         tm.tensor_scatter_nd_add(t([1, 1, 1]), [[0], [2]], t([5, 7])))


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
    x, y = torch.randn(n, generator=gen).to(device), torch.randn(n, generator=gen).to(device)
    table = torch.randn(n // 64, 64, generator=gen).to(device)
    rows_mask = mask[: n // 64]
    index = torch.randint(0, n, (n // 10, 1), generator=gen).to(device)
    updates = torch.randn(n // 10, generator=gen).to(device)
    rows = [
        ("nonzero, bool", lambda: tm.nonzero(mask), lambda: torch.nonzero(mask), "torch.nonzero"),
        ("where(c, x, y), float32", lambda: tm.where(mask, x, y), lambda: torch.where(mask, x, y), "torch.where"),
        ("boolean_mask, 1-D float32", lambda: tm.boolean_mask(x, mask), lambda: x[mask], "x[mask]"),
        ("boolean_mask, rows of [N, 64]", lambda: tm.boolean_mask(table, rows_mask), lambda: table[rows_mask],
         "x[mask]"),
        ("scatter_nd, U=N/10 into N, float32", lambda: tm.scatter_nd(index, updates, [n]),
         lambda: torch.zeros(n, device=device).index_put_((index[:, 0],), updates, accumulate=True),
         "index_put_(accumulate=True)"),
        ("gather_nd, N/10 elements", lambda: tm.gather_nd(x, index), lambda: x[index[:, 0]], "x[idx]"),
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
