"""The gradient a training step hands to the optimizer, for every combination of training options:
shared by tests/training/test_step_matrix.py (threads, in process) and run by it under ``mpiexec -n 2``.

One *case* is a configuration (model keywords and ``train`` keywords) and a precision. ``step_grads``
trains a small TinyGPT for ``STEPS`` steps through ``tformer.training.train.train`` with ``Recorder`` as its
optimizer: at each step it keeps a copy of the flat gradient it is handed (after the loss scale is
divided out, after clipping: what an optimizer would apply) and then moves the parameters to fixed
weights W_k that do not depend on the gradient. So every thread count and world size computes its
gradients at the same weights, and the weights change between steps as in training (a part that
computes with a stale copy of the weights shows up from the second step on).

Under mpiexec (``python tests/step_matrix.py --out FILE``) every case runs on the ranks' slices
of the same global batches and rank 0 saves the reduced gradients.
"""
import argparse
import sys

import numpy as np

from tformer.nn import functional as F
from tformer.training import batch_threads
from tformer.training.mpi import DataParallel, get_world, local_slice, run_command
from tformer.models.tinygpt import TinyGPT
from tformer.training.precision import MixedPrecision
from tformer.training.train import train

STEPS = 3
B, T, V = 6, 16, 64                 # B cuts into 2 and 3 thread parts and 2 rank slices

CONFIGS = {
    "defaults": ({}, {}),
    "gradient checkpointing": (dict(gradient_checkpointing=True), {}),
    "flash attention": (dict(attention="flash"), {}),
    "tied embeddings": (dict(tie_embeddings=True), {}),
    "modern block": (dict(norm="rmsnorm", positions="rope", mlp="swiglu", n_kv_heads=2), {}),
    "post-norm": (dict(norm_position="post"), {}),
    "relu² with flash and checkpointing": (dict(mlp="relu2", attention="flash",
                                                gradient_checkpointing=True), {}),
    "accumulation": ({}, dict(accum_steps=2)),
    "clipping": ({}, dict(clip_norm=0.05)),
    # Module.freeze on these layers (the learned positions, which TinyGPT's backward adds itself,
    # among them): the others' gradients, and zeros in the frozen places of the flat buffer.
    "frozen layers": (dict(freeze=("wte", "wpe", "blocks.0.attn", "blocks.1.ffn.fc2", "lm_head")),
                      dict(clip_norm=0.05)),
    "all together": (dict(gradient_checkpointing=True, attention="flash", tie_embeddings=True,
                          norm="rmsnorm", positions="rope", mlp="swiglu", n_kv_heads=2,
                          freeze=("wte", "blocks.0.ln1", "blocks.1.attn.o", "lm_head")),
                     dict(accum_steps=2, clip_norm=0.05)),
}
# The model's dtype and the compute precision: float64 (the exact check), float32, and mixed
# precision with float32 masters. fp16 starts from a loss scale of 2¹⁰, low enough that no step of
# these small models overflows (an overflow skips a step, and the cases would not line up).
PRECISIONS = {"float64": (np.float64, None), "float32": (np.float32, None),
              "bf16": (np.float32, "bf16"), "fp16": (np.float32, "fp16")}


class Recorder:
    """An optimizer that records the gradient it is handed, then sets the parameters to W_k."""

    def __init__(self, model, targets):
        self.model, self.targets, self.lr, self.grads = model, targets, 0.0, []

    def step(self):
        P, G = self.model.flat_buffers()
        self.grads.append(G.astype(np.float64))
        P[...] = self.targets[len(self.grads) - 1]


def submodule(model, path):
    """The module at ``path`` (``"blocks.0.attn"``) of ``model``."""
    return dict(model.named_modules())[path]


def step_grads(config, precision, world=None):
    """``(STEPS, n_params)`` float64: the gradients handed to the optimizer at steps 1..STEPS."""
    model_kw, train_kw = CONFIGS[config]
    model_kw = dict(model_kw)
    frozen = model_kw.pop("freeze", ())
    dtype, low = PRECISIONS[precision]
    model = TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=T, vocab_size=V, seed=0,
                    dtype=dtype, **model_kw)
    for path in frozen:
        submodule(model, path).freeze()
    P0 = model.flat_buffers()[0].copy()
    rng = np.random.default_rng(7)
    targets = [P0 + 0.02 * (k + 1) * rng.standard_normal(P0.size).astype(dtype)
               for k in range(STEPS)]
    mp = MixedPrecision(model, low, init_scale=2.0 ** 10) if low else None
    dp = DataParallel(model, world) if world is not None and world.size > 1 else None
    rec = Recorder(model, targets)

    def batch(i):
        w = np.random.default_rng([3, i]).integers(0, V, (B, T + 1))
        xy = (w[:, :-1], w[:, 1:])
        return local_slice(xy, world) if dp is not None else xy

    def forward_loss(m, b):
        return F.cross_entropy(m.forward(b[0]), b[1])

    train(model, rec, batch, forward_loss, STEPS, progress_bar=False, data_parallel=dp,
          precision=mp, **train_kw)
    if len(rec.grads) != STEPS:
        raise AssertionError(f"{config}, {precision}: {STEPS - len(rec.grads)} steps skipped")
    return np.stack(rec.grads)


def frozen_places(config):
    """Boolean mask of the flat buffer: True where a parameter of ``config`` is frozen."""
    model_kw = dict(CONFIGS[config][0])
    frozen = model_kw.pop("freeze", ())
    model = TinyGPT(d_model=32, n_heads=4, n_layers=2, max_len=T, vocab_size=V, seed=0, **model_kw)
    for path in frozen:
        submodule(model, path).freeze()
    return model.frozen_mask()


def rel_norm(a, b):
    """‖a − b‖ / ‖b‖ over a whole step's gradient."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main(args):
    batch_threads.MIN_PART_MACS = 0
    world = get_world()
    out = {f"{c}|{p}": step_grads(c, p, world) for c in CONFIGS for p in PRECISIONS}
    if world.is_root:
        np.savez(args.out, **out)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    sys.exit(run_command(main, parser.parse_args()))
