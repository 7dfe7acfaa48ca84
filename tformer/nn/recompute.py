"""Activation recomputation ("gradient checkpointing") for a stack of residual blocks::

    forward:   x_{s+1} = f_s(x_s)   for each segment s of k consecutive blocks (f_s: their
               composition); keep only x_s and the state of every dropout generator, drop the caches
    backward:  rebuild the caches of segment s by running f_s(x_s) again, then ∂L/∂x_s = f_sᵀ(∂L/∂x_{s+1})

Memory of the activations: ⌈L/k⌉ segment inputs ``(B, T, C)`` plus the caches of one segment of k
blocks at a time, instead of the caches of all L blocks. k ≈ √L balances the two when a block keeps
about as much as its input (Chen et al. 2016); a Transformer block keeps far more, and k = 1 needs
the least memory (the chapter "Fitting in memory").
Time: one more forward pass of the blocks per step.

Dropout replays the same masks: each segment's forward records ``bit_generator.state`` of every
generator its dropout layers draw from (a few hundred bytes, not the masks); the recomputation sets
those states, re-draws, and puts back the states the generators had reached, so the run continues
with exactly the random numbers it would have drawn without recomputation. Every cache is rebuilt
from the same input by the same arithmetic, so every gradient is bit for bit the one without it.

``Recompute`` is a ``BlockStack`` that stands in for a model's stack of blocks (the model's
``gradient_checkpointing=True`` builds its blocks into one): the model's forward and backward
call ``self.blocks`` the same way either way. In eval mode, and so in generation, it runs the
blocks plainly: there is no backward to prepare.
"""
import numpy as np

from tformer.nn.blocks import BlockStack
from tformer.nn.layers import Dropout


def check_checkpointing(gradient_checkpointing, blocks_per_segment=1):
    """``gradient_checkpointing``: True or False (TypeError otherwise); ``blocks_per_segment``: an
    integer k ≥ 1, the number of blocks per recomputed segment (TypeError / ValueError otherwise)."""
    if not isinstance(gradient_checkpointing, (bool, np.bool_)):
        raise TypeError(f"gradient_checkpointing: expected True or False, got {gradient_checkpointing!r}")
    if isinstance(blocks_per_segment, (bool, np.bool_)) or not isinstance(blocks_per_segment, (int, np.integer)):
        raise TypeError(f"blocks_per_segment: expected an integer ≥ 1, got {blocks_per_segment!r}")
    if blocks_per_segment < 1:
        raise ValueError(f"blocks_per_segment: expected an integer ≥ 1, got {blocks_per_segment}")
    return bool(gradient_checkpointing), int(blocks_per_segment)


def _generators(blocks):
    """The distinct ``np.random.Generator`` objects the dropout layers of ``blocks`` draw from."""
    gens = {}
    for block in blocks:
        for m in block.modules():
            if isinstance(m, Dropout) and m.p > 0 and m.training:
                gens[id(m.rng)] = m.rng
    return list(gens.values())


class Recompute(BlockStack):
    """A ``BlockStack`` that runs its blocks in segments of ``every``, keeping only each segment's
    input in training (``torch.utils.checkpoint.checkpoint_sequential``'s place in a model).

    ``forward(x, *args) -> y`` and ``backward(dy) -> dx`` are the stack's; the extra ``args``
    (e.g. a padding mask) are passed to every block and kept for the recomputation. In eval mode
    (no backward to prepare) it is the plain stack.
    """

    saved = ("_saved",)

    def __init__(self, blocks, every=1):
        _, every = check_checkpointing(True, every)
        super().__init__(blocks)
        self.every = every
        self._saved = None                 # [(x_s, args, generator states)] of the last forward

    def segments(self):
        """The blocks cut into consecutive lists of ``every`` (the last one may be shorter)."""
        k, blocks = self.every, self._items
        return [blocks[i:i + k] for i in range(0, len(blocks), k)]

    def forward(self, x, *args):
        """x: (B, T, C) -> (B, T, C); keeps x_s of each segment, no block cache survives."""
        self._saved = None
        kv_cache = args[1] if len(args) > 1 else None
        if not self.training or kv_cache is not None:    # eval, or decoding: no backward to prepare
            return super().forward(x, *args)
        saved = []
        for seg in self.segments():
            gens = _generators(seg)
            saved.append((x, args, [(g, g.bit_generator.state) for g in gens]))
            for block in seg:
                x = block(x, *args)
                block.clear_saved()        # only what the next block reads, x, is kept
        self._saved = saved
        return x

    def backward(self, dy):
        """dy: (B, T, C) -> dx: (B, T, C); re-runs each segment's forward, then its backward."""
        if self._saved is None:
            if self.training:
                raise RuntimeError("backward: no checkpointed forward pass to differentiate")
            return super().backward(dy)
        for seg, (x, args, states) in zip(reversed(self.segments()), reversed(self._saved)):
            now = [(g, g.bit_generator.state) for g, _ in states]
            for g, state in states:        # the masks the first forward drew
                g.bit_generator.state = state
            try:
                for block in seg:
                    x = block(x, *args)
            finally:
                for g, state in now:       # where the run had got to
                    g.bit_generator.state = state
            for block in reversed(seg):
                dy = block.backward(dy)
                block.clear_saved()
        self._saved = None
        return dy
