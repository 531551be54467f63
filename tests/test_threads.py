"""The ops called from many Python threads at once, each result checked
against ATen's.

Each thread draws its own inputs (large enough for the CPU kernels to split
their work over the intra-op threads too), runs every op, forward and
backward, and an out-of-range index, many times; all threads start together.
Marked ``cpu_kernel``: it is about the CPU kernels called concurrently; the
emulation of tests/cuda_emulation stands in for the CUDA kernels' logic, not
for concurrent callers.
"""
import threading

import pytest
import torch

import torch_masked as tm

THREADS = 8
ROUNDS = 6
JOIN_TIMEOUT = 120


def _one_round(generator):
    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=generator).to(dtype)

    rows = int(torch.randint(100, 400, (), generator=generator))
    x, y = rand(rows, 64), rand(rows, 64, dtype=torch.float64)
    condition = torch.rand(rows, 64, generator=generator) > 0.5
    row_condition = torch.rand(rows, generator=generator) > 0.5

    torch.testing.assert_close(tm.nonzero(condition), torch.nonzero(condition), rtol=0, atol=0)
    torch.testing.assert_close(tm.where(condition, x, y), torch.where(condition, x, y), rtol=0, atol=0)
    torch.testing.assert_close(tm.where(condition, x, 0.0), torch.where(condition, x, 0.0), rtol=0, atol=0)
    torch.testing.assert_close(
        tm.select(row_condition, x, x * 2), torch.where(row_condition[:, None], x, x * 2), rtol=0, atol=0
    )

    leaf = x.clone().requires_grad_()
    weights = rand(rows, 64)
    picked = tm.boolean_mask(leaf, condition)
    torch.testing.assert_close(picked, x[condition], rtol=0, atol=0)
    (picked * weights[condition]).sum().backward()
    torch.testing.assert_close(leaf.grad, torch.where(condition, weights, 0.0), rtol=0, atol=0)

    indices = torch.randint(0, rows, (3 * rows, 1), generator=generator)
    updates = rand(3 * rows, 64, dtype=torch.float64)
    expected = torch.zeros(rows, 64, dtype=torch.float64).index_put_((indices[:, 0],), updates, accumulate=True)
    torch.testing.assert_close(tm.scatter_nd(indices, updates, [rows, 64]), expected)
    torch.testing.assert_close(tm.tensor_scatter_nd_add(y, indices, updates), y + expected)
    torch.testing.assert_close(tm.gather_nd(x, indices), x[indices[:, 0]], rtol=0, atol=0)
    with pytest.raises(IndexError, match=f"{rows} is out of range for dimension 0 of size {rows}"):
        tm.gather_nd(x, torch.tensor([[0], [rows]]))


@pytest.mark.cpu_kernel
def test_ops_from_many_threads_at_once():
    start = threading.Barrier(THREADS)
    failures = []
    finished = []

    def work(seed):
        generator = torch.Generator().manual_seed(seed)
        try:
            start.wait(timeout=JOIN_TIMEOUT)
            for _ in range(ROUNDS):
                _one_round(generator)
            finished.append(seed)
        except BaseException as error:  # noqa: BLE001 -- reported below
            failures.append((seed, repr(error)))

    threads = [threading.Thread(target=work, args=(seed,), daemon=True) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=JOIN_TIMEOUT)
    assert failures == []
    assert sorted(finished) == list(range(THREADS)), "some threads did not finish in time"
