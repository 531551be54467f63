"""DTensor sharding rules for the masked ops.

``torch.distributed.tensor`` runs an op on DTensors only if it knows, for the
placements of the inputs, which placements the local op can take and what
the output's placement is then. This module tells it, for every op:

- ops whose output shape follows from the input shapes (``where``, ``select``,
  ``gather_nd``, ``scatter_nd``, ``tensor_scatter_nd_add``,
  ``boolean_mask_backward``, ``nonzero_static``) get strategies through
  PyTorch's ``register_sharding``: lists of (output placement, input
  placements) for one mesh dimension, which DTensor expands over the mesh and
  picks the cheapest of, redistributing inputs where it must (less the
  expansions that would make a ``Partial`` sum by division: see
  ``_sums_kept_exact``). An all ``Replicate`` strategy is always among
  them, so every case runs.
- ops whose output length depends on the data (``boolean_mask``,
  ``nonzero``, ``nonzero_tuple``) cannot go that way: DTensor learns the
  output's global shape by running the op on fake tensors without a shape
  environment, where a data-dependent size cannot be made. They get a handler
  on DTensor's dispatcher instead, which places the inputs, runs the local op
  and wraps its result with the placements and global shape it knows.

The module is imported by ``torch_masked`` only once ``torch.distributed.tensor``
is (see ``register_when_dtensor_loads``), so importing ``torch_masked`` does
not pay for DTensor.
"""
import warnings

import torch

from ._after_import import when_imported

_DTENSOR_MODULE = "torch.distributed.tensor"


def _partials(*specs):
    """The ``Partial`` placements among the inputs, each once. Plain ones
    only: DTensor's subclasses of it (a masked embedding's, a norm's) reduce
    in their own ways."""
    from torch.distributed.tensor import Partial

    found = []
    for spec in specs:
        for placement in getattr(spec, "placements", ()):
            if type(placement) is Partial and placement not in found:
                found.append(placement)
    return found


def _linear_partials(*specs):
    """The ``Partial`` placements among the inputs that a sum of the local
    results reduces correctly: sum and avg (a scatter adds its updates)."""
    return [p for p in _partials(*specs) if p.reduce_op in ("sum", "avg")]


def _sums_kept_exact(expand):
    """``expand``, DTensor's expansion of a strategy function over the mesh,
    less the expansions that want an input as a ``Partial`` sum on a mesh
    dimension where it is not one. DTensor would make it one by dividing it
    by the number of ranks there, which rounds floats (on 3 ranks), flushes
    subnormals to zero and turns integers into floats. Without them DTensor
    reduces such an input first (the all-``Replicate`` expansion always
    remains). The strategy functions speak of one mesh dimension and cannot
    say this: on a 2-D mesh their ``Partial`` strategy is paired with every
    placement on the other dimension."""
    from torch.distributed.tensor import Partial

    def strategy(op_schema):
        found = expand(op_schema)
        held = [arg.strategies[0].output_spec.placements for arg in op_schema.args_strategy + op_schema.kwargs_strategy]

        def divides(candidate):
            return any(
                type(want) is Partial and want.reduce_op == "sum" and want != have
                for spec, placements in zip(candidate.input_specs, held)
                for want, have in zip(spec.placements, placements)
            )

        found.strategies = [candidate for candidate in found.strategies if not divides(candidate)]
        return found

    return strategy


def _is_tensor(arg):
    return hasattr(arg, "placements")


def _replicated(*args):
    """The all-Replicate strategy: the fallback that always works."""
    from torch.distributed.tensor import Replicate

    return ([Replicate()], [Replicate() if _is_tensor(arg) else None for arg in args])


def _broadcast_shard(spec, out_dim, out_rank, out_size):
    """The placement of a broadcast operand when the output is sharded on
    ``out_dim``: sharded alike where it has that dimension at full size,
    replicated where it is absent or stretched from 1."""
    from torch.distributed.tensor import Replicate, Shard

    dim = out_dim - (out_rank - spec.ndim)
    if dim >= 0 and spec.shape[dim] == out_size:
        return Shard(dim)
    return Replicate()


def _keeps_number(partial, number):
    """Whether a Python number beside Partial tensors stays exact when the
    ranks' results are reduced: a number is the same on every rank, so max,
    min and avg of it are itself, and a sum of it is itself only for 0."""
    return partial.reduce_op in ("max", "min", "avg") or (partial.reduce_op == "sum" and number == 0)


def _where_strategies(condition, x, y):
    """where.self / where.ScalarSelf / where.ScalarOther (x or y a number)."""
    from torch.distributed.tensor import Replicate, Shard

    args = (condition, x, y)
    tensors = [arg for arg in args if _is_tensor(arg)]
    out_shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    strategies = [_replicated(*args)]
    for out_dim, size in enumerate(out_shape):
        if size <= 1:
            continue
        inputs = [_broadcast_shard(a, out_dim, len(out_shape), size) if _is_tensor(a) else None for a in args]
        strategies.append(([Shard(out_dim)], inputs))
    # Picking is linear in x and y: with the condition replicated, the reduced
    # result of where(c, x_i, y_i) over ranks is where(c, reduce x_i, reduce y_i).
    for partial in _partials(x, y):
        if all(_keeps_number(partial, a) for a in (x, y) if not _is_tensor(a)):
            strategies.append(([partial], [Replicate(), *(partial if _is_tensor(a) else None for a in (x, y))]))
    return strategies


def _select_strategies(condition, x, y):
    """select: x and y of one shape; condition a scalar, x's shape, or (row
    mode) 1-D of length x.shape[0], replicated when x is sharded past dim 0."""
    from torch.distributed.tensor import Replicate, Shard

    strategies = [_replicated(condition, x, y)]
    for dim in range(x.ndim):
        if condition.ndim == x.ndim or (condition.ndim == 1 and dim == 0):
            cond = Shard(dim)
        else:
            cond = Replicate()
        strategies.append(([Shard(dim)], [cond, Shard(dim), Shard(dim)]))
    for partial in _partials(x, y):
        strategies.append(([partial], [Replicate(), partial, partial]))
    return strategies


def _gather_nd_strategies(params, indices, check_bounds=True):
    """gather_nd: output = indices.shape[:-1] + params.shape[K:]."""
    from torch.distributed.tensor import Replicate, Shard

    depth = indices.shape[-1]
    batch = indices.ndim - 1
    strategies = [_replicated(params, indices)]
    # Slices sharded: each rank gathers its part of every slice.
    for dim in range(depth, params.ndim):
        strategies.append(([Shard(batch + dim - depth)], [Shard(dim), Replicate()]))
    # Index rows sharded: each rank gathers its rows from the whole params.
    for dim in range(batch):
        strategies.append(([Shard(dim)], [Replicate(), Shard(dim)]))
    # Gathering moves values, so it commutes with every reduction.
    for partial in _partials(params):
        strategies.append(([partial], [partial, Replicate()]))
    return strategies


def _scatter_strategies(tensor, indices, updates):
    """scatter_nd (tensor None) and tensor_scatter_nd_add: output of shape
    ``tensor.shape``/``shape``; updates = indices.shape[:-1] + shape[K:]."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    depth = indices.shape[-1]
    batch = indices.ndim - 1
    has_tensor = tensor is not None
    addable = updates.tensor_meta is None or updates.tensor_meta.dtype != torch.bool

    def entry(out, base, index, update):
        return ([out], ([base] if has_tensor else []) + [index, update])

    strategies = [entry(Replicate(), Replicate(), Replicate(), Replicate())]
    # Slices sharded: each rank scatters its part of every slice.
    for dim in range(depth, updates.ndim - batch + depth):
        strategies.append(entry(Shard(dim), Shard(dim), Replicate(), Shard(batch + dim - depth)))
    if addable:
        # Update rows sharded with their indices: each rank adds its rows,
        # and the sum over ranks is the whole scatter (bool updates OR
        # together instead, which a sum of ranks does not give).
        for dim in range(batch):
            strategies.append(entry(Partial(), Partial(), Shard(dim), Shard(dim)))
        for partial in _linear_partials(tensor, updates):
            strategies.append(entry(partial, partial, Replicate(), partial))
    return strategies


def _scatter_nd_strategies(indices, updates, shape, check_bounds=True):
    return _scatter_strategies(None, indices, updates)


def _tensor_scatter_nd_add_strategies(tensor, indices, updates, check_bounds=True):
    return _scatter_strategies(tensor, indices, updates)


def _masked_dims(rank, mask_rank, axis):
    start = axis + rank if axis < 0 else axis
    return start, start + mask_rank


def _boolean_mask_backward_strategies(grad, mask, input_shape, axis):
    """boolean_mask_backward: grad = input_shape[:axis] + [n] + input_shape[axis+K:],
    written into zeros of input_shape."""
    from torch.distributed.tensor import Replicate, Shard

    start, stop = _masked_dims(len(input_shape), mask.ndim, axis)
    strategies = [_replicated(grad, mask, input_shape, axis)]
    for dim in range(grad.ndim):
        if dim != start:
            out = dim if dim < start else dim + stop - start - 1
            strategies.append(([Shard(out)], [Shard(dim), Replicate(), None, None]))
    # Writing slices into zeros commutes with every reduction (each keeps 0).
    for partial in _partials(grad):
        strategies.append(([partial], [partial, Replicate(), None, None]))
    return strategies


def _nonzero_static_strategies(self, size, fill_value=-1):
    return [_replicated(self)]


def _boolean_mask_handler(op_call, args, kwargs):
    """boolean_mask on DTensors. The mask is replicated; the tensor keeps a
    sharding on a dimension the mask does not cover (the output keeps it, on
    the matching dimension) and a Partial placement (selecting commutes with
    every reduction); other placements are replicated. The output's global
    length along the mask is the local one, as every rank holds the whole mask."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    tensor, mask, axis = _bind(op_call, args, kwargs)
    op_info = _unwrap(op_call, args, kwargs)
    tensor_spec, mask_spec = op_info.flat_args_schema[:2]
    local_tensor, local_mask = op_info.local_args[:2]
    start, stop = _masked_dims(tensor.ndim, mask.ndim, axis)

    def kept(placement):
        if type(placement) is Shard and not start <= placement.dim < stop:
            return placement
        if type(placement) is Partial:
            return placement
        return Replicate()

    tensor_placements = [kept(p) for p in tensor_spec.placements]
    local_tensor = _placed(local_tensor, tensor_spec, tensor_placements)
    local_mask = _placed(local_mask, mask_spec, [Replicate()] * mask_spec.mesh.ndim)
    local_out = op_call(local_tensor, local_mask, axis)

    out_placements = [
        Shard(p.dim if p.dim < start else p.dim - (stop - start) + 1) if type(p) is Shard else p
        for p in tensor_placements
    ]
    out_shape = [*tensor.shape[:start], local_out.shape[start], *tensor.shape[stop:]]
    return _wrap(local_out, op_info.compute_mesh, out_placements, out_shape)


def _replicate_handler(op_call, args, kwargs):
    """nonzero, nonzero_tuple: the positions of the non-zero elements of the
    whole tensor, which no rank's part alone gives; run on the replicated
    input, replicated output."""
    from torch.distributed.tensor import Replicate

    op_info = _unwrap(op_call, args, kwargs)
    local_args = [
        _placed(local, spec, [Replicate()] * spec.mesh.ndim) if _is_tensor(spec) else spec
        for local, spec in zip(op_info.local_args, op_info.flat_args_schema)
    ]
    result = op_call(*local_args, **op_info.local_kwargs)
    replicate = [Replicate()] * op_info.compute_mesh.ndim
    if isinstance(result, torch.Tensor):
        return _wrap(result, op_info.compute_mesh, replicate, result.shape)
    return [_wrap(r, op_info.compute_mesh, replicate, r.shape) for r in result]


def _bind(op_call, args, kwargs):
    """The op's arguments by position, defaults filled in."""
    values = list(args)
    for argument in op_call._schema.arguments[len(args) :]:
        values.append(kwargs.get(argument.name, argument.default_value))
    return values


def _unwrap(op_call, args, kwargs):
    """DTensor's own unwrapping, so a plain tensor beside DTensors and DTensors
    on different meshes fail with PyTorch's own errors."""
    from torch.distributed.tensor import DTensor

    op_info = DTensor._op_dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    op_info.schema.get_mesh_from_args(validate=True)
    return op_info


def _placed(local, spec, placements):
    """The local part of a DTensor redistributed to ``placements``."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    if tuple(spec.placements) == tuple(placements):
        return local
    target = DTensorSpec(spec.mesh, tuple(placements), tensor_meta=spec.tensor_meta)
    return redistribute_local_tensor(local, spec, target)


def _wrap(local, mesh, placements, shape):
    """A DTensor of global ``shape`` (contiguous) from this rank's part."""
    from torch._prims_common import make_contiguous_strides_for
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    shape = torch.Size(shape)
    meta = TensorMeta(shape, make_contiguous_strides_for(shape), local.dtype)
    return DTensor(local, DTensorSpec(mesh, tuple(placements), tensor_meta=meta), requires_grad=local.requires_grad)


def register():
    """Registers the strategies and handlers with DTensor."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor.experimental import register_sharding

    masked = torch.ops.masked
    strategies = {
        masked.where.self: _where_strategies,
        masked.where.ScalarSelf: _where_strategies,
        masked.where.ScalarOther: _where_strategies,
        masked.select.default: _select_strategies,
        masked.gather_nd.default: _gather_nd_strategies,
        masked.scatter_nd.default: _scatter_nd_strategies,
        masked.tensor_scatter_nd_add.default: _tensor_scatter_nd_add_strategies,
        masked.boolean_mask_backward.default: _boolean_mask_backward_strategies,
        masked.nonzero_static.default: _nonzero_static_strategies,
    }
    propagator = DTensor._op_dispatcher.sharding_propagator
    for op, strategy in strategies.items():
        register_sharding(op)(strategy)
        propagator.op_strategy_funcs[op] = _sums_kept_exact(propagator.op_strategy_funcs[op])
    # register_sharding hashes a call's non-tensor arguments into DTensor's
    # cache of decisions only from the first int argument on; these decide
    # the strategy or the output's shape earlier: the number of where's
    # Scalar overloads, the shape of scatter_nd and boolean_mask_backward.
    # No argument is a list of tensors, so none needs flattening
    # (``needs_pytree``, which register_sharding sets): flattened, the shape
    # list is lost when DTensor both redistributes an input and rewrites the
    # shape below (its arguments are then misaligned).
    for op, first_static in (
        (masked.where.ScalarSelf, 1),
        (masked.where.ScalarOther, 2),
        (masked.scatter_nd.default, 2),
        (masked.boolean_mask_backward.default, 2),
    ):
        propagator.op_to_schema_info[op] = RuntimeSchemaInfo(first_static)
    # A global output shape passed as an argument must reach the local op as
    # the local shape; DTensor rewrites it for the ops in this table (its own
    # new_empty, for one).
    propagator.op_to_shape_and_stride_idx[masked.scatter_nd.default] = 2
    propagator.op_to_shape_and_stride_idx[masked.boolean_mask_backward.default] = 2

    handlers = DTensor._op_dispatcher._custom_op_handlers
    handlers[masked.boolean_mask.default] = _boolean_mask_handler
    handlers[masked.nonzero.default] = _replicate_handler
    handlers[masked.nonzero_tuple.default] = _replicate_handler


def _register_or_warn(dtensor_module):
    # A torch whose DTensor internals moved should still import DTensor;
    # only our ops then lack their rules.
    try:
        register()
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"torch_masked: DTensor sharding rules could not be registered: {error!r}", stacklevel=2)


def register_when_dtensor_loads():
    """Registers now if ``torch.distributed.tensor`` is loaded, else as soon as it is."""
    if not torch.distributed.is_available():
        return
    when_imported(_DTENSOR_MODULE, _register_or_warn)
