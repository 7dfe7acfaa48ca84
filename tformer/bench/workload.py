"""The benchmark's workload: the TinyGPT sizes, a batch of random bytes, one tformer training step
(``zero_grad``, forward, mean cross-entropy, backward, AdamW update, float32). Shared by the timed
workers (``training``) and the per-op profile (``op_profile``), which both build on it.
"""

SIZES = {
    "small": dict(d_model=64, n_heads=4, n_layers=2, T=64, B=32),
    "medium": dict(d_model=256, n_heads=8, n_layers=4, T=128, B=16),
    "large": dict(d_model=512, n_heads=8, n_layers=4, T=256, B=8),
}
VOCAB = 256
OPT = dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def batch(B, T, seed=0):
    """``(x, y)``, each ``(B, T)``: random bytes and the next byte of each."""
    import numpy as np
    tok = np.random.default_rng(seed).integers(0, VOCAB, (B, T + 1))
    return tok[:, :-1].copy(), tok[:, 1:].copy()                        # (B, T) inputs, targets


def tinygpt(size, dtype="float32"):
    """The TinyGPT of benchmark size ``size`` (``SIZES``), seed 0."""
    from tformer.models.tinygpt import TinyGPT
    s = SIZES[size]
    return TinyGPT(d_model=s["d_model"], n_heads=s["n_heads"], n_layers=s["n_layers"], max_len=s["T"],
                   vocab_size=VOCAB, seed=0, dtype=dtype)


def tformer_step_fn(model, opt, x, y):
    """``step() -> loss``: one training step of ``model`` on ``(x, y)``, run as ``tformer.training.train``
    runs it (through ``BatchCut``: the batch cut across threads where that pays)."""
    from tformer.nn import functional as F
    from tformer.training.batch_threads import BatchCut
    net = BatchCut(model)

    def step():
        net.zero_grad()
        logits = net.forward(x)                                         # (B, T, V)
        loss, dlogits = F.cross_entropy(logits, y)
        net.backward(dlogits)
        opt.step()
        return loss
    return step
