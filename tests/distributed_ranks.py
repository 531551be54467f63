"""Running a function on several gloo processes, for tests/test_distributed.py.

``run_ranks(target, world_size, directory, timeout)`` starts ``world_size``
processes (the "spawn" start method, so each imports this tree afresh), joins
them through a FileStore in ``directory`` (no ports to collide), calls
``target(rank, world_size, *args)`` in each and returns what each returned,
or what each raised, as ``Failed``. Processes still running at ``timeout``
are killed and reported; none outlives the call.

The targets themselves are below: they are module-level functions, since
the spawned processes find them by name.
"""
import datetime
import os
import queue as queue_module
import sys
import time
import traceback
from dataclasses import dataclass

import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def local_environment():
    """The environment for processes that talk over gloo on this machine:
    the loopback interface on Linux, where gloo would otherwise take the
    address the host name resolves to, which some containers lack."""
    env = {"PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])}
    if sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


@dataclass
class Failed:
    """What a rank raised."""

    kind: str
    message: str
    trace: str


class RanksTimedOut(AssertionError):
    """Ranks that ran past the time allowed, or ended without a result."""


def _rank_main(rank, world_size, store_path, collective_timeout, target, args, results):
    import torch.distributed as dist

    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=collective_timeout),
        )
        try:
            outcome = target(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001 -- reported to the parent
        outcome = Failed(type(error).__name__, str(error), traceback.format_exc())
    results.put((rank, outcome))


def run_ranks(target, world_size, directory, timeout, *args, collective_timeout=60):
    """Runs ``target`` on ``world_size`` ranks; returns their results by rank."""
    context = mp.get_context("spawn")
    results = context.Queue()
    store_path = os.path.join(str(directory), "store")
    # The spawned interpreters import this tree's torch_masked and tests, and
    # take the environment of this one at the time they start.
    environment = local_environment()
    previous = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    processes = []
    outcomes = {}
    try:
        for rank in range(world_size):
            process = context.Process(
                target=_rank_main,
                args=(rank, world_size, store_path, collective_timeout, target, args, results),
                daemon=True,
            )
            process.start()
            processes.append(process)
        deadline = time.monotonic() + timeout
        while len(outcomes) < world_size:
            try:
                rank, outcome = results.get(timeout=1)
                outcomes[rank] = outcome
                continue
            except queue_module.Empty:
                pass
            missing = sorted(set(range(world_size)) - set(outcomes))
            # A rank's result reaches the queue before its process ends.
            dead = {rank: processes[rank].exitcode for rank in missing if not processes[rank].is_alive()}
            if dead:
                raise RanksTimedOut(f"ranks ended without a result (rank: exit code): {dead}")
            if time.monotonic() > deadline:
                raise RanksTimedOut(
                    f"ranks {missing} of {world_size} did not finish {target.__name__} within {timeout} s "
                    f"(finished: {outcomes})"
                )
        return [outcomes[rank] for rank in range(world_size)]
    finally:
        # A rank that reported is ending; one that did not is stuck or dead.
        for rank, process in enumerate(processes):
            process.join(timeout=10 if rank in outcomes else 0)
            if process.is_alive():
                process.kill()
                process.join()
        results.close()
        for name, value in previous.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def rank_one_hangs(rank, world_size, directory):
    """Rank 1 writes its process id and never returns."""
    with open(os.path.join(directory, f"pid{rank}"), "w") as file:
        file.write(str(os.getpid()))
    while rank == 1:
        time.sleep(1)
    return "done"


# --------------------------------------------------------------------------
# DTensor: every op on a 1-D mesh of 2 ranks and on 2-D meshes (2x1, 1x2).
# Each case returns (result DTensor or list, reference on the full tensors,
# expected placements on the mesh dimension of size 2); references are ATen's.


def _layouts():
    """(name, mesh shape, which mesh dimension has 2 ranks)."""
    return [("1d", (2,), 0), ("2x1", (2, 1), 0), ("1x2", (1, 2), 1)]


def _distributed(full, mesh, placements, requires_grad=False):
    """A DTensor on ``mesh`` with ``placements`` (one per mesh dimension)
    whose full tensor is ``full``. Along a ``Partial`` mesh dimension each
    rank holds a different piece, the pieces reducing to the full value."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    plain = [Replicate() if isinstance(p, Partial) else p for p in placements]
    result = distribute_tensor(full, mesh, plain)
    if plain != list(placements):
        local = result.to_local()
        for mesh_dim, placement in enumerate(placements):
            if not isinstance(placement, Partial):
                continue
            index = mesh.get_local_rank(mesh_dim)
            if placement.reduce_op == "sum" and not (full.dtype.is_floating_point or full.dtype.is_complex):
                local = (local // 2, local - local // 2)[index]
            elif placement.reduce_op == "sum":
                local = local * (0.25, 0.75)[index]
            elif placement.reduce_op == "avg":
                local = local * (0.5, 1.5)[index]
            else:  # max
                local = local - index
        result = DTensor.from_local(local, mesh, placements, run_check=False, shape=full.shape, stride=full.stride())
    return result.detach().requires_grad_(requires_grad)


class _Placer:
    """Makes DTensors from full tensors, with a placement on the mesh
    dimension of size 2 (the others replicate)."""

    def __init__(self, mesh, split_dim):
        from torch.distributed.tensor import Replicate

        self.mesh = mesh
        self.split_dim = split_dim
        self.Replicate = Replicate

    def placements(self, placement):
        return tuple(placement if dim == self.split_dim else self.Replicate() for dim in range(self.mesh.ndim))

    def __call__(self, full, placement, requires_grad=False):
        return _distributed(full, self.mesh, self.placements(placement), requires_grad)


def _scatter_reference(base, indices, updates):
    """ATen's scatter-add of ``updates`` into ``base`` at ``indices`` (last dimension K)."""
    return base.index_put(tuple(indices.unbind(-1)), updates, accumulate=True)


def _dtensor_cases():
    """name -> function(place) returning (result, reference, expected placement,
    None where any placement is right: the point is then the value)."""
    import torch
    from torch.distributed.tensor import Partial, Replicate, Shard

    import torch_masked as tm

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64)

    def mask(*shape):
        return torch.rand(*shape) > 0.4

    c, x, y = mask(4, 6), rand(4, 6), rand(4, 6)
    rows = torch.tensor([True, False, True, True])
    indices = torch.tensor([[3], [0], [3]])  # a duplicate
    params = rand(4, 6)
    updates = rand(3, 6)
    deep = rand(2, 4, 5, 6)
    deep_mask = mask(4, 5)
    cases = {}

    for dim in (0, 1):
        cases[f"where_shard{dim}"] = lambda p, d=dim: (
            tm.where(p(c, Shard(d)), p(x, Shard(d)), p(y, Shard(d))), torch.where(c, x, y), Shard(d))
    cases["where_broadcast"] = lambda p: (
        tm.where(p(c[:1], Replicate()), p(x, Shard(1)), p(y[0], Shard(0))), torch.where(c[:1], x, y[0]), Shard(1))
    cases["where_scalar_other"] = lambda p: (
        tm.where(p(c, Shard(0)), p(x, Shard(0)), 0.5), torch.where(c, x, 0.5), Shard(0))
    cases["where_scalar_self"] = lambda p: (
        tm.where(p(c, Shard(1)), 2.0, p(y, Shard(1))), torch.where(c, 2.0, y), Shard(1))
    cases["where_partial"] = lambda p: (
        tm.where(p(c, Replicate()), p(x, Partial()), p(y, Partial())), torch.where(c, x, y), Partial())
    cases["where_partial_zero"] = lambda p: (
        tm.where(p(c, Replicate()), p(x, Partial()), 0.0), torch.where(c, x, 0.0), Partial())
    cases["where_partial_max_number"] = lambda p: (
        tm.where(p(c, Replicate()), 3.0, p(y, Partial("max"))), torch.where(c, 3.0, y), Partial("max"))
    cases["where_partial_avg_number"] = lambda p: (
        tm.where(p(c, Replicate()), p(x, Partial("avg")), 3.0), torch.where(c, x, 3.0), Partial("avg"))
    # A sum of ranks would add the number once per rank: reduced first (the
    # same call as where_partial_zero but the number, which DTensor's cache
    # of decisions must tell apart).
    cases["where_partial_sum_number"] = lambda p: (
        tm.where(p(c, Replicate()), p(x, Partial()), 1.0), torch.where(c, x, 1.0), None)
    cases["where_mixed_partial_shard"] = lambda p: (
        tm.where(p(c, Shard(0)), p(x, Partial()), p(y, Shard(0))), torch.where(c, x, y), None)
    # DTensor would make a replicated tensor a Partial sum by dividing it by
    # the number of ranks (an integer one in float; a float one rounded, its
    # subnormals flushed): the sum is reduced first instead.
    whole_x, whole_y = torch.randint(-50, 50, (4, 6)), torch.randint(-50, 50, (4, 6))
    tiny_y = torch.full((4, 6), 4.9e-324, dtype=torch.float64)  # the smallest subnormal
    cases["where_partial_replicated_subnormals"] = lambda p: (
        tm.where(p(c, Replicate()), p(x, Partial()), p(tiny_y, Replicate())), torch.where(c, x, tiny_y), None)
    cases["where_partial_integers"] = lambda p: (
        tm.where(p(c, Replicate()), p(whole_x, Partial()), p(whole_y, Replicate())), torch.where(c, whole_x, whole_y),
        None)

    cases["select_elementwise"] = lambda p: (
        tm.select(p(c, Shard(1)), p(x, Shard(1)), p(y, Shard(1))), torch.where(c, x, y), Shard(1))
    cases["select_rows_replicated"] = lambda p: (
        tm.select(p(rows, Replicate()), p(x, Shard(1)), p(y, Shard(1))),
        torch.where(rows[:, None], x, y), Shard(1))
    cases["select_rows_sharded"] = lambda p: (
        tm.select(p(rows, Shard(0)), p(x, Shard(0)), p(y, Shard(0))), torch.where(rows[:, None], x, y), Shard(0))
    cases["select_scalar"] = lambda p: (
        tm.select(p(torch.tensor(False), Replicate()), p(x, Shard(0)), p(y, Shard(0))), y, Shard(0))
    cases["select_partial"] = lambda p: (
        tm.select(p(rows, Replicate()), p(x, Partial()), p(y, Partial())), torch.where(rows[:, None], x, y),
        Partial())
    cases["select_partial_integers"] = lambda p: (
        tm.select(p(rows, Replicate()), p(whole_x, Replicate()), p(whole_y, Partial())),
        torch.where(rows[:, None], whole_x, whole_y), None)

    cases["gather_nd_slices"] = lambda p: (
        tm.gather_nd(p(params, Shard(1)), p(indices, Replicate())), params[indices[:, 0]], Shard(1))
    deep_indices = torch.tensor([[[1, 3], [0, 0], [1, 1]], [[0, 2], [1, 3], [0, 1]]])  # [2, 3, 2]
    cases["gather_nd_deep_slices"] = lambda p: (
        tm.gather_nd(p(deep, Shard(3)), p(deep_indices, Replicate())),
        deep[deep_indices[..., 0], deep_indices[..., 1]], Shard(3))
    cases["gather_nd_rows"] = lambda p: (
        tm.gather_nd(p(params, Replicate()), p(torch.tensor([[3], [0], [3], [1]]), Shard(0))),
        params[[3, 0, 3, 1]], Shard(0))
    cases["gather_nd_partial"] = lambda p: (
        tm.gather_nd(p(params, Partial()), p(indices, Replicate())), params[indices[:, 0]], Partial())
    cases["gather_nd_sharded_indexed_dim"] = lambda p: (
        tm.gather_nd(p(params, Shard(0)), p(indices, Replicate())), params[indices[:, 0]], Replicate())

    zeros = torch.zeros(5, 6, dtype=torch.float64)
    cases["scatter_nd_slices"] = lambda p: (
        tm.scatter_nd(p(indices, Replicate()), p(updates, Shard(1)), [5, 6]),
        _scatter_reference(zeros, indices, updates), Shard(1))
    # The same arguments but the shape: DTensor's cache of decisions must tell them apart.
    cases["scatter_nd_slices_other_shape"] = lambda p: (
        tm.scatter_nd(p(indices, Replicate()), p(updates, Shard(1)), [7, 6]),
        _scatter_reference(torch.zeros(7, 6, dtype=torch.float64), indices, updates), Shard(1))
    # Indices that must be replicated first, and a shape to make local.
    pair_indices, pair_updates = torch.tensor([[4, 1], [0, 2], [4, 1]]), rand(3, 6)
    cases["scatter_nd_slices_indices_sharded"] = lambda p: (
        tm.scatter_nd(p(pair_indices, Shard(1)), p(pair_updates, Shard(1)), [5, 3, 6]),
        _scatter_reference(torch.zeros(5, 3, 6, dtype=torch.float64), pair_indices, pair_updates),
        Shard(2))
    row_indices, row_updates = torch.tensor([[3], [0], [3], [1]]), rand(4, 6)
    # Each rank scatters its rows; the sum over ranks is the whole scatter.
    cases["scatter_nd_rows"] = lambda p: (
        tm.scatter_nd(p(row_indices, Shard(0)), p(row_updates, Shard(0)), [5, 6]),
        _scatter_reference(zeros, row_indices, row_updates), Partial())
    cases["scatter_nd_partial"] = lambda p: (
        tm.scatter_nd(p(indices, Replicate()), p(updates, Partial()), [5, 6]),
        _scatter_reference(zeros, indices, updates), Partial())
    bool_updates = torch.tensor([[True, False], [False, False], [True, True], [False, True]])
    bool_indices = torch.tensor([[1], [0], [1], [2]])
    cases["scatter_nd_bool_rows"] = lambda p: (
        tm.scatter_nd(p(bool_indices, Shard(0)), p(bool_updates, Shard(0)), [3, 2]),
        _scatter_reference(torch.zeros(3, 2, dtype=torch.bool), bool_indices, bool_updates),
        Replicate())
    base = rand(5, 6)
    cases["tensor_scatter_nd_add_slices"] = lambda p: (
        tm.tensor_scatter_nd_add(p(base, Shard(1)), p(indices, Replicate()), p(updates, Shard(1))),
        _scatter_reference(base, indices, updates), Shard(1))
    cases["tensor_scatter_nd_add_rows"] = lambda p: (
        tm.tensor_scatter_nd_add(p(base, Partial()), p(indices, Shard(0)), p(updates, Shard(0))),
        _scatter_reference(base, indices, updates), Partial())
    tiny_base = torch.full((5, 6), 4.9e-324, dtype=torch.float64)
    cases["tensor_scatter_nd_add_rows_replicated_base"] = lambda p: (
        tm.tensor_scatter_nd_add(p(tiny_base, Replicate()), p(indices, Shard(0)), p(updates, Shard(0))),
        _scatter_reference(tiny_base, indices, updates), None)
    whole_base, whole_updates = torch.randint(-50, 50, (5, 6)), torch.randint(-50, 50, (3, 6))
    cases["tensor_scatter_nd_add_rows_integers"] = lambda p: (
        tm.tensor_scatter_nd_add(p(whole_base, Replicate()), p(indices, Shard(0)), p(whole_updates, Shard(0))),
        _scatter_reference(whole_base, indices, whole_updates), None)

    cases["boolean_mask_after"] = lambda p: (
        tm.boolean_mask(p(x, Shard(1)), p(rows, Replicate())), x[rows], Shard(1))
    cases["boolean_mask_before"] = lambda p: (
        tm.boolean_mask(p(deep, Shard(0)), p(deep_mask, Replicate()), axis=1), deep[:, deep_mask], Shard(0))
    # Dimensions after a 2-D mask move down by one.
    cases["boolean_mask_shifted"] = lambda p: (
        tm.boolean_mask(p(deep, Shard(3)), p(deep_mask, Replicate()), axis=-3), deep[:, deep_mask], Shard(2))
    cases["boolean_mask_masked_dim"] = lambda p: (
        tm.boolean_mask(p(x, Shard(0)), p(rows, Shard(0))), x[rows], Replicate())
    masked_rows = rand(3, 6)  # rows' three True
    cases["boolean_mask_backward_mask_sharded"] = lambda p: (
        torch.ops.masked.boolean_mask_backward(p(masked_rows, Shard(1)), p(rows, Shard(0)), [4, 6], 0),
        torch.zeros(4, 6, dtype=torch.float64).index_put((rows,), masked_rows), Shard(1))
    cases["boolean_mask_partial"] = lambda p: (
        tm.boolean_mask(p(x, Partial()), p(rows, Replicate())), x[rows], Partial())

    cases["nonzero"] = lambda p: (tm.nonzero(p(c, Shard(0))), torch.nonzero(c), Replicate())
    cases["nonzero_tuple"] = lambda p: (
        tm.nonzero(p(c, Shard(1)), as_tuple=True), list(torch.nonzero(c, as_tuple=True)), Replicate())
    cases["where_index_mode"] = lambda p: (tm.where(p(c, Shard(1))), torch.nonzero(c), Replicate())
    cases["nonzero_static"] = lambda p: (
        tm.nonzero_static(p(c, Shard(0)), size=30), torch.nonzero_static(c, size=30), Replicate())
    cases["nonzero_partial"] = lambda p: (
        tm.nonzero(p(x.clamp(min=0), Partial())), torch.nonzero(x.clamp(min=0)), Replicate())
    return cases


def _full(result):
    from torch.distributed.tensor import DTensor

    return result.full_tensor() if isinstance(result, DTensor) else result


def dtensor_values(rank, world_size):
    """Each case on each layout: None where value and placement are right,
    else what was wrong."""
    import torch
    from torch.distributed.tensor import init_device_mesh

    report = {}
    for layout, mesh_shape, split_dim in _layouts():
        mesh = init_device_mesh("cpu", mesh_shape)
        place = _Placer(mesh, split_dim)
        torch.manual_seed(0)
        for name, case in _dtensor_cases().items():
            key = f"{name}[{layout}]"
            try:
                result, reference, placement = case(place)
                results = result if isinstance(result, (list, tuple)) else [result]
                references = reference if isinstance(reference, list) else [reference] * len(results)
                for got, want in zip(results, references):
                    if placement is not None and tuple(got.placements) != place.placements(placement):
                        raise AssertionError(f"placements {got.placements}, expected {place.placements(placement)}")
                    full = _full(got)
                    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
                    # No absolute tolerance: a subnormal lost is an error.
                    torch.testing.assert_close(full, want, rtol=1e-12, atol=0)
                report[key] = None
            except Exception as error:  # noqa: BLE001 -- reported by name
                report[key] = f"{type(error).__name__}: {error}"
    return report


def _gradient_cases():
    """name -> function(place) giving (output, inputs, reference function of
    the full inputs, the placement each input's gradient must keep)."""
    import torch
    from torch.distributed.tensor import Replicate, Shard

    import torch_masked as tm

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64)

    c, x, y = torch.rand(4, 6) > 0.4, rand(4, 6), rand(4, 6)
    rows = torch.tensor([True, False, True, True])
    indices = torch.tensor([[3], [0], [3]])
    params, updates, base = rand(4, 6), rand(3, 6), rand(5, 6)
    deep, deep_mask = rand(2, 4, 5, 6), torch.rand(4, 5) > 0.4

    def index_put(t, upd):
        return t.index_put((indices[:, 0],), upd, accumulate=True)

    return {
        "where": lambda p: (
            lambda x_, y_: tm.where(p(c, Shard(1)), x_, y_), [p(x, Shard(1), True), p(y, Shard(1), True)],
            lambda x_, y_: torch.where(c, x_, y_), [Shard(1), Shard(1)]),
        "where_number": lambda p: (
            lambda x_: tm.where(p(c, Shard(0)), x_, 0.0), [p(x, Shard(0), True)],
            lambda x_: torch.where(c, x_, 0.0), [Shard(0)]),
        "select_rows": lambda p: (
            lambda x_, y_: tm.select(p(rows, Replicate()), x_, y_), [p(x, Shard(1), True), p(y, Shard(1), True)],
            lambda x_, y_: torch.where(rows[:, None], x_, y_), [Shard(1), Shard(1)]),
        # No rows, the condition sharded along them: the gradient takes the
        # row condition as a column as x[:, None] does (a DTensor refuses a
        # view of an axis sharded at size 0).
        "select_no_rows": lambda p: (
            lambda x_, y_: tm.select(p(rows[:0], Shard(0)), x_, y_),
            [p(x[:0], Replicate(), True), p(y[:0], Replicate(), True)],
            lambda x_, y_: torch.where(rows[:0, None], x_, y_), [None, None]),
        "gather_nd": lambda p: (
            lambda t: tm.gather_nd(t, p(indices, Replicate())), [p(params, Shard(1), True)],
            lambda t: t[indices[:, 0]], [Shard(1)]),
        "gather_nd_rows": lambda p: (
            lambda t: tm.gather_nd(t, p(indices, Shard(0))), [p(params, Replicate(), True)],
            lambda t: t[indices[:, 0]], [None]),
        "scatter_nd": lambda p: (
            lambda u: tm.scatter_nd(p(indices, Replicate()), u, [5, 6]), [p(updates, Shard(1), True)],
            lambda u: index_put(torch.zeros(5, 6, dtype=torch.float64), u), [Shard(1)]),
        "tensor_scatter_nd_add": lambda p: (
            lambda t, u: tm.tensor_scatter_nd_add(t, p(indices, Replicate()), u),
            [p(base, Shard(1), True), p(updates, Shard(1), True)], index_put, [Shard(1), Shard(1)]),
        "boolean_mask": lambda p: (
            lambda t: tm.boolean_mask(t, p(rows, Replicate())), [p(x, Shard(1), True)],
            lambda t: t[rows], [Shard(1)]),
        "boolean_mask_2d_mask": lambda p: (
            lambda t: tm.boolean_mask(t, p(deep_mask, Replicate()), axis=1), [p(deep, Shard(3), True)],
            lambda t: t[:, deep_mask], [Shard(3)]),
    }


def _error_cases(mesh, other_mesh):
    """name -> (function raising, the words PyTorch's error must contain)."""
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import torch_masked as tm

    x = distribute_tensor(torch.randn(4, 6), mesh, [Shard(0)])
    elsewhere = distribute_tensor(torch.randn(4, 6), other_mesh, [Shard(0), Replicate()])
    c = distribute_tensor(torch.rand(4, 6) > 0.5, mesh, [Shard(0)])
    rows = distribute_tensor(torch.tensor([True, False, True, True]), mesh, [Replicate()])
    indices = distribute_tensor(torch.tensor([[1], [0]]), mesh, [Replicate()])
    cross_mesh = "cross-mesh"
    mixed = "mixed torch.Tensor and DTensor"
    return {
        "where_meshes": (lambda: tm.where(c, x, elsewhere), cross_mesh),
        "gather_nd_meshes": (lambda: tm.gather_nd(elsewhere, indices), cross_mesh),
        "boolean_mask_meshes": (lambda: tm.boolean_mask(elsewhere, rows), cross_mesh),
        "where_plain": (lambda: tm.where(c, x, torch.randn(4, 6)), mixed),
        "scatter_nd_plain": (lambda: tm.scatter_nd(torch.tensor([[1], [0]]), x[:2], [4, 6]), mixed),
        "boolean_mask_plain": (lambda: tm.boolean_mask(x, torch.tensor([True, False, True, True])), mixed),
    }


def dtensor_suite(rank, world_size):
    """Values and placements, gradients and errors: a report of what failed,
    by case (None where all was right)."""
    import torch
    from torch.distributed.tensor import init_device_mesh

    report = dtensor_values(rank, world_size)
    for layout, mesh_shape, split_dim in _layouts():
        place = _Placer(init_device_mesh("cpu", mesh_shape), split_dim)
        torch.manual_seed(1)
        for name, case in _gradient_cases().items():
            key = f"grad_{name}[{layout}]"
            try:
                fn, inputs, reference_fn, grad_placements = case(place)
                (fn(*inputs) ** 2).sum().backward()
                fulls = [t.full_tensor().detach().requires_grad_() for t in inputs]
                (reference_fn(*fulls) ** 2).sum().backward()
                for got, want, placement in zip(inputs, fulls, grad_placements):
                    if placement is not None and tuple(got.grad.placements) != place.placements(placement):
                        raise AssertionError(f"gradient placements {got.grad.placements}")
                    torch.testing.assert_close(got.grad.full_tensor(), want.grad, rtol=1e-12, atol=1e-12)
                report[key] = None
            except Exception as error:  # noqa: BLE001 -- reported by name
                report[key] = f"{type(error).__name__}: {error}"
    mesh, other_mesh = init_device_mesh("cpu", (2,)), init_device_mesh("cpu", (2, 1))
    for name, (fn, words) in _error_cases(mesh, other_mesh).items():
        try:
            fn()
            report[f"error_{name}"] = "no error"
        except Exception as error:  # noqa: BLE001 -- its words are checked
            report[f"error_{name}"] = None if words in str(error) else f"{type(error).__name__}: {error}"
    return report


# --------------------------------------------------------------------------
# DTensor on a 2x2 mesh: every op with placements drawn for both mesh
# dimensions, so that an input may be sharded twice, sharded on one and
# Partial on the other, or Partial in one and replicated in the other.


def _mesh_cases():
    """(name -> (full inputs, the op, ATen's reference), the index tensors)."""
    import torch

    import torch_masked as tm

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64)

    def zeros(*shape):
        return torch.zeros(*shape, dtype=torch.float64)

    c, x, y = torch.rand(4, 6) > 0.4, rand(4, 6), rand(4, 6)
    whole_x, whole_y = torch.randint(-50, 50, (4, 6)), torch.randint(-50, 50, (4, 6))
    rows = torch.tensor([True, False, True, True])
    row_indices, pair_indices = torch.tensor([[3], [0], [3], [1]]), torch.tensor([[3, 1], [0, 5], [3, 1], [1, 2]])
    params, updates, pair_updates, base = rand(4, 6, 5), rand(4, 6, 5), rand(4, 5), rand(5, 6, 5)
    deep, deep_mask = rand(2, 4, 5, 6), torch.rand(4, 5) > 0.4
    cases = {
        "where": ((c, x, y), tm.where, torch.where),
        "where_integers": ((c, whole_x, whole_y), tm.where, torch.where),
        "where_broadcast": ((c[:1], x, y[0]), tm.where, torch.where),
        "where_number": ((c, x), lambda c_, x_: tm.where(c_, x_, 0.5), lambda c_, x_: torch.where(c_, x_, 0.5)),
        "select_rows": ((rows, x, y), tm.select, lambda r, x_, y_: torch.where(r[:, None], x_, y_)),
        "select_elementwise": ((c, x, y), tm.select, torch.where),
        "gather_nd_rows": ((params, row_indices), tm.gather_nd, lambda p, i: p[i[:, 0]]),
        "gather_nd_pairs": ((params, pair_indices), tm.gather_nd, lambda p, i: p[i[:, 0], i[:, 1]]),
        "scatter_nd_rows": (
            (row_indices, updates), lambda i, u: tm.scatter_nd(i, u, [5, 6, 5]),
            lambda i, u: _scatter_reference(zeros(5, 6, 5), i, u)),
        "scatter_nd_pairs": (
            (pair_indices, pair_updates), lambda i, u: tm.scatter_nd(i, u, [4, 6, 5]),
            lambda i, u: _scatter_reference(zeros(4, 6, 5), i, u)),
        "tensor_scatter_nd_add": ((base, row_indices, updates), tm.tensor_scatter_nd_add, _scatter_reference),
        "tensor_scatter_nd_add_integers": (
            (whole_x, row_indices, whole_y), tm.tensor_scatter_nd_add, _scatter_reference),
        "boolean_mask": ((x, rows), tm.boolean_mask, lambda t, m: t[m]),
        "boolean_mask_2d_mask": (
            (deep, deep_mask), lambda t, m: tm.boolean_mask(t, m, axis=1), lambda t, m: t[:, m]),
        "nonzero": ((c,), tm.nonzero, torch.nonzero),
        "nonzero_static": (
            (c,), lambda c_: tm.nonzero_static(c_, size=30), lambda c_: torch.nonzero_static(c_, size=30)),
    }
    return cases, (row_indices, pair_indices)


def _draw_placements(generator, full, may_be_partial):
    """Two placements, one per mesh dimension: replicated, sharded on any
    dimension, or Partial, of one reduction for both."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    choices = [Replicate()] + [Shard(dim) for dim in range(full.ndim)]
    if may_be_partial:
        partials = [Partial("sum"), Partial("max")] + [Partial("avg")] * full.dtype.is_floating_point
        choices.append(generator.choice(partials))
    return (generator.choice(choices), generator.choice(choices))


def dtensor_mesh_2x2(rank, world_size, draws):
    """Each case of ``_mesh_cases`` with ``draws`` drawings of placements,
    the same on every rank, and a Partial sum beside a replicated mesh
    dimension, which a rule for one mesh dimension can get wrong: None where
    the values and the gradients of ``(out ** 2).sum()`` equal ATen's on the
    full tensors, else what went wrong."""
    import random

    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2))
    generator = random.Random(0)
    torch.manual_seed(0)
    cases, index_tensors = _mesh_cases()
    report = {}
    for name, (fulls, op, reference) in cases.items():
        indices = [any(t is index for index in index_tensors) for t in fulls]
        # Values may be Partial; indices and masks are not.
        partial = [t.dtype != torch.bool and not index for t, index in zip(fulls, indices)]
        drawn = [[_draw_placements(generator, t, p) for t, p in zip(fulls, partial)] for _ in range(draws)]
        # Index rows sharded on the first mesh dimension invite the rule that
        # makes the values there a Partial sum, which they are only on the second.
        drawn.append([
            (Shard(0), Replicate()) if index else (Replicate(), Partial() if p else Replicate())
            for index, p in zip(indices, partial)
        ])
        for placements in drawn:
            key = f"{name}{placements}"
            try:
                inputs = [_distributed(t, mesh, p, t.dtype.is_floating_point) for t, p in zip(fulls, placements)]
                leaves = [t.detach().requires_grad_(t.dtype.is_floating_point) for t in fulls]
                out, want = op(*inputs), reference(*leaves)
                outs, wants = (out, want) if isinstance(out, (list, tuple)) else ([out], [want])
                for got, expected in zip(outs, wants):
                    torch.testing.assert_close(got.full_tensor(), expected, rtol=1e-12, atol=0)
                if isinstance(out, DTensor) and out.dtype.is_floating_point:
                    (out**2).sum().backward()
                    (want**2).sum().backward()
                    for got, leaf in zip(inputs, leaves):
                        if leaf.requires_grad:
                            torch.testing.assert_close(got.grad.full_tensor(), leaf.grad, rtol=1e-12, atol=0)
                report[key] = None
            except Exception as error:  # noqa: BLE001 -- reported by name
                report[key] = f"{type(error).__name__}: {error}"
    return report


# --------------------------------------------------------------------------
# DistributedDataParallel: the model of examples/train_masked.py (gather_nd,
# where, scatter_nd, boolean_mask), half the batch on each rank.


def _example():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import train_masked

    return train_masked


def ddp_gradients(rank, world_size):
    """The largest difference between DDP's gradients (eager, then compiled
    with fullgraph=True) and one process's on the whole batch."""
    import torch

    example = _example()
    tokens, mask, targets = example.make_data(torch.Generator().manual_seed(2), 8, 6)
    mask[0] = False  # an empty sequence on rank 0
    token_count = mask.sum()
    mine = slice(rank, None, world_size)
    local = (tokens[mine], mask[mine], targets[mine])

    torch.manual_seed(0)
    model = example.Tagger()
    model.zero_grad()
    (example.token_loss_sum(model(tokens, mask), mask, targets) / token_count).backward()
    reference = example.gradients(model)

    differences = {}
    for mode in ("eager", "compiled"):
        torch.manual_seed(0)
        replica = example.Tagger()
        if mode == "compiled":
            forward = torch.compile(replica, fullgraph=True)
            loss_fn = torch.compile(example.token_loss_sum, fullgraph=True)
        else:
            forward, loss_fn = replica, example.token_loss_sum
        ddp = torch.nn.parallel.DistributedDataParallel(forward)
        example.step(ddp, loss_fn, replica, local, token_count)
        differences[mode] = max(
            float((got - want).abs().max()) for got, want in zip(example.gradients(replica), reference)
        )
    return differences


def ddp_one_rank_raises(rank, world_size):
    """Rank 1 gathers with an index out of range; rank 0 goes on to the
    gradient all-reduce, which rank 1 never joins."""
    import torch

    import torch_masked as tm

    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(4, 3))

        def forward(self, indices):
            return tm.gather_nd(self.table, indices)

    ddp = torch.nn.parallel.DistributedDataParallel(Lookup())
    ddp(torch.tensor([[1], [9 if rank == 1 else 2]])).sum().backward()
    return "finished"
