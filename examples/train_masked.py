"""A small next-token tagger trained on padded sequences, with torch_masked's
ops used the way models use them:

- the embedding lookup is ``gather_nd`` (its gradient, a ``scatter_nd``, adds
  into the rows of the table that were read: sparse accumulation);
- each sequence's context vector sums its real (not padded) tokens:
  ``where(mask)`` lists their positions, ``gather_nd`` reads them and
  ``scatter_nd`` adds them up per sequence (the segment-sum idiom);
- the context is normalised with a safe norm: ``where`` keeps the square root
  (and its gradient) away from the zero vector of an empty sequence;
- the loss is over the real tokens only: ``boolean_mask`` of the per-token loss.

It trains under ``torch.compile(fullgraph=True)`` on the CPU in under half a
minute, most of it compiling:

    python examples/train_masked.py
    torchrun --nproc-per-node 2 examples/train_masked.py --ddp   # DistributedDataParallel on gloo

Before training it checks one compiled step against the same step in eager
mode (loss and gradients). ``--report PATH`` writes the losses and that
difference as JSON.
"""
import argparse
import contextlib
import gc
import json

import torch
import torch.nn.functional as F

import torch_masked as tm

VOCAB = 32
WIDTH = 16
PAD = 0


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(VOCAB, WIDTH) * 0.5)
        self.head = torch.nn.Linear(2 * WIDTH, VOCAB)

    def forward(self, tokens, mask):
        """tokens [B, T] (padded), mask [B, T] bool (real tokens) -> logits [B, T, VOCAB]."""
        batch = tokens.shape[0]
        embedded = tm.gather_nd(self.table, tokens.unsqueeze(-1))  # [B, T, WIDTH]
        positions = tm.where(mask)  # [n, 2]: (sequence, step) of each real token
        context = tm.scatter_nd(positions[:, :1], tm.gather_nd(embedded, positions), [batch, WIDTH])
        squared = (context * context).sum(-1, keepdim=True)
        nonzero = squared > 0
        # sqrt's gradient at 0 is inf; an empty sequence's context stays 0, and
        # its gradient finite, as sqrt only ever sees a positive number.
        context = tm.where(nonzero, context / torch.sqrt(tm.where(nonzero, squared, 1.0)), 0.0)
        features = torch.cat([embedded, context.unsqueeze(1).expand_as(embedded)], dim=-1)
        return self.head(features)


def token_loss_sum(logits, mask, targets):
    """The summed cross-entropy of the real tokens."""
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return tm.boolean_mask(per_token.view(targets.shape), mask).sum()


def make_data(generator, batch, length):
    """Sequences of random lengths (some empty), padded with PAD; the target
    of each token is a fixed function of it."""
    lengths = torch.randint(0, length + 1, (batch,), generator=generator)
    mask = torch.arange(length) < lengths.unsqueeze(1)
    tokens = torch.randint(1, VOCAB, (batch, length), generator=generator)
    tokens = torch.where(mask, tokens, PAD)
    targets = (5 * tokens + 1) % VOCAB
    return tokens, mask, targets


def gradients(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def step(forward, loss_fn, model, batch, token_count):
    """One forward and backward; the loss is the mean over ``token_count``
    real tokens (all ranks' tokens under DDP, which averages the ranks'
    gradients: hence the factor world size)."""
    model.zero_grad(set_to_none=True)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    tokens, mask, targets = batch
    loss = loss_fn(forward(tokens, mask), mask, targets) * world / token_count
    loss.backward()
    return loss.detach() / world


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ddp", action="store_true", help="DistributedDataParallel on gloo (run under torchrun)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32, help="sequences per step, all ranks together")
    parser.add_argument("--length", type=int, default=12)
    parser.add_argument("--report", help="write the losses and the eager/compiled difference here as JSON")
    args = parser.parse_args()
    if not args.ddp:
        train(args, 0, 1)
        return
    # torch.distributed.nn, which DDP imports, makes the world group its
    # functions' default argument for good if the group exists by then; the
    # group would outlive destroy_process_group(), and with it gloo's worker
    # threads, into Python's shutdown, where a thread that still frees a
    # finished all-reduce aborts the process ("terminate called without an
    # active exception"). Imported first, nothing but DDP holds the group:
    # train() returns, DDP is collected, and destroying the group joins its
    # threads while Python still runs.
    import torch.distributed.nn  # noqa: F401

    torch.distributed.init_process_group("gloo")
    train(args, torch.distributed.get_rank(), torch.distributed.get_world_size())
    gc.collect()
    torch.distributed.destroy_process_group()


def train(args, rank, world):
    """Checks one compiled step against eager, then trains; rank 0 prints and
    writes the report."""
    torch.manual_seed(0)  # the same initial model on every rank
    model = Tagger()
    # The model is compiled inside DDP's wrapper: DDP's own forward (its
    # bookkeeping before the model runs) is not traceable with fullgraph=True.
    compiled_model = torch.compile(model, fullgraph=True)
    trained = torch.nn.parallel.DistributedDataParallel(compiled_model) if args.ddp else compiled_model
    compiled_loss = torch.compile(token_loss_sum, fullgraph=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1)

    def next_batch():
        tokens, mask, targets = make_data(data, args.batch, args.length)
        token_count = mask.sum()
        mine = slice(rank, None, world)  # this rank's sequences
        return (tokens[mine], mask[mine], targets[mine]), token_count

    # One step in eager mode and the same step compiled, on this rank's data
    # alone (no_sync: no averaging over ranks), must agree.
    batch, token_count = next_batch()
    eager_loss = step(model, token_loss_sum, model, batch, token_count)
    eager_grads = gradients(model)
    with trained.no_sync() if args.ddp else contextlib.nullcontext():
        compiled_loss_value = step(trained, compiled_loss, model, batch, token_count)
    difference = max(
        [abs(float(eager_loss - compiled_loss_value))]
        + [float((a - b).abs().max()) for a, b in zip(eager_grads, gradients(model))]
    )
    if args.ddp:
        difference = torch.tensor(difference)
        torch.distributed.all_reduce(difference, op=torch.distributed.ReduceOp.MAX)
        difference = float(difference)

    losses = []
    for number in range(args.steps):
        if number:
            batch, token_count = next_batch()
        loss = step(trained, compiled_loss, model, batch, token_count)
        if args.ddp:
            torch.distributed.all_reduce(loss)
        optimizer.step()
        losses.append(float(loss))
        if rank == 0 and (number % 10 == 0 or number == args.steps - 1):
            print(f"step {number:3d}  loss {losses[-1]:.4f}")
    if rank == 0:
        print(f"eager and compiled first step differ by at most {difference:.3g}")
        if args.report:
            with open(args.report, "w") as report:
                json.dump({"losses": losses, "eager_compiled_difference": difference, "world_size": world}, report)


if __name__ == "__main__":
    main()
