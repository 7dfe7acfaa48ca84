"""A few data-parallel TinyGPT steps, run by tests/training/test_distributed.py alone or under ``mpiexec -n p``.

Random byte windows, a pure function of the step, make the global batch; rank r takes its slice.
Rank 0 saves the final flat parameters and the loss history to ``--out``; every rank first checks
that all ranks hold the same parameters, bit for bit. ``--raise-at`` / ``--nan-at`` make rank
``--bad-rank`` fail at that micro-batch, to test that the job stops instead of hanging.
"""
import argparse
import hashlib
import sys

import numpy as np

from tformer.nn import functional as F
from tformer.training.checkpoint import load_checkpoint
from tformer.training.mpi import DataParallel, RankError, get_world, local_slice, run_command
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import AdamW
from tformer.training.train import NonFiniteLossError, train

T = 8


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float64")
    p.add_argument("--zero", action="store_true")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--bad-rank", type=int, default=-1)
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--nan-at", type=int, default=-1)
    p.add_argument("--freeze", nargs="*", default=(), help="paths of modules to freeze")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(args):
    world = get_world()
    model = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=T, seed=args.seed, dtype=args.dtype)
    for path in args.freeze:                                   # Module.freeze, by dotted path
        dict(model.named_modules())[path].freeze()
    dp = DataParallel(model, world, zero=args.zero) if world.size > 1 or args.zero else None

    def make(m):
        return AdamW(m, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    opt = dp.optimizer(make) if dp is not None else make(model)
    start = 0
    if args.resume:
        load = dp.load_checkpoint if dp is not None else load_checkpoint
        start = load(args.checkpoint, model, opt)["step"]
    bad = world.rank == args.bad_rank

    def batch(i):
        rng = np.random.default_rng([args.seed, i])
        w = rng.integers(0, 256, (args.batch_size, T + 1))                  # (B, T + 1)
        if bad and i == args.raise_at:
            raise RuntimeError(f"injected failure at micro-batch {i}")
        return (*local_slice((w[:, :-1], w[:, 1:]), world), i)

    def forward_loss(m, b):
        x, y, i = b
        loss, d = F.cross_entropy(m.forward(x), y)
        return (float("nan") if bad and i == args.nan_at else loss), d

    hist = train(model, opt, batch, forward_loss, args.steps, start_step=start, accum_steps=args.accum,
                 clip_norm=args.clip, checkpoint_path=args.checkpoint,
                 checkpoint_every=args.checkpoint_every, progress_bar=False, data_parallel=dp)
    P = model.flat_buffers()[0]
    digests = world.allgather_object(hashlib.sha256(P.tobytes()).hexdigest())
    if len(set(digests)) != 1:
        raise AssertionError(f"the ranks hold different parameters: {digests}")
    if world.is_root and args.out:
        np.savez(args.out, P=P, loss=np.array(hist["loss"]), grad_norm=np.array(hist["grad_norm"]))
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, parse(), consistent=(RankError, NonFiniteLossError)))
