"""Tuning a trained model on preference pairs: DPO, or fine-tuning on the chosen responses alone.

    dpo:  L = (1/B) Σ_i −log σ(β [(log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))])
    sft:  L = −(1/Σ|y_w|) Σ_i Σ_t log π(y_w,t | x, y_w,<t)         (the rejected responses unused)

Both run through the book's one training loop (``tformer.training.train.train``: AdamW, clipping at 1,
linear warm-up over a tenth of the steps and cosine decay to a tenth of the peak rate), on every
weight of the model or on LoRA adapters alone (``tformer.nn.lora``: the rest frozen). A step takes
``batch_pairs`` pairs, epochs of a seeded permutation. DPO's loss and gradient with respect to the
logits are ``tformer.tuning.dpo``'s; the gradient then flows back through ``model.backward`` as any loss's.
The reference π_ref is the model before tuning, its log-probabilities of every pair computed once
(``Pairs.reference``). Weight decay is 0: the pull toward the reference is DPO's own β.
"""
import copy

import numpy as np

from tformer.nn import functional as F
from tformer.tuning.pairs import pair_batch, sequences
from tformer.tuning.dpo import dpo_backward, dpo_forward, sequence_logp
from tformer.nn.lora import Adapters, apply_lora
from tformer.training.optim import AdamW, cosine_with_warmup
from tformer.training.train import train

LOSSES = ("dpo", "sft")


class Pairs:
    """Preference pairs as arrays: ``prompt (N, P)`` (row n's first ``prompt_len[n]`` tokens),
    ``chosen, rejected (N, R)`` with their lengths ``(N,)``, and, once ``reference`` has run, the
    reference's log-probabilities ``ref_w, ref_l (N,)``."""

    def __init__(self, prompt, chosen, chosen_len, rejected, rejected_len, prompt_len=None):
        self.prompt, self.chosen, self.rejected = prompt, chosen, rejected
        self.chosen_len, self.rejected_len = np.asarray(chosen_len), np.asarray(rejected_len)
        self.prompt_len = (np.full(prompt.shape[0], prompt.shape[1]) if prompt_len is None
                           else np.asarray(prompt_len))
        self.ref_w = self.ref_l = None

    @classmethod
    def from_samples(cls, prompt_ids, responses, lengths, index):
        """The pairs ``index = [(prompt m, chosen sample w, rejected sample l)]`` of sampled
        responses ``(M, n, R)`` with lengths ``(M, n)`` to prompts ``(M, P)``."""
        m, w, l = (np.array([t[i] for t in index], dtype=np.int64) for i in range(3))
        return cls(prompt_ids[m], responses[m, w], lengths[m, w], responses[m, l], lengths[m, l])

    def __len__(self):
        return self.prompt.shape[0]

    def subset(self, idx):
        """The pairs ``idx`` (with the reference's log-probabilities, if computed)."""
        out = Pairs(self.prompt[idx], self.chosen[idx], self.chosen_len[idx], self.rejected[idx],
                    self.rejected_len[idx], self.prompt_len[idx])
        if self.ref_w is not None:
            out.ref_w, out.ref_l = self.ref_w[idx], self.ref_l[idx]
        return out

    def batch(self, idx):
        """``(x, targets, mask)`` of the pairs ``idx``: the B chosen rows, then the B rejected."""
        return pair_batch(self.prompt[idx], self.chosen[idx], self.chosen_len[idx],
                          self.rejected[idx], self.rejected_len[idx], self.prompt_len[idx])

    def chosen_batch(self, idx):
        """``(x, targets, mask)`` of the chosen responses of the pairs ``idx`` alone."""
        return sequences(self.prompt[idx], self.chosen[idx], self.chosen_len[idx],
                         self.prompt_len[idx])

    def reference(self, model, rows=32):
        """Set ``ref_w, ref_l``: ``model``'s log-probabilities of every chosen and rejected
        response (in eval mode), ``rows`` pairs at a time. Returns ``self``."""
        was = model.training
        model.eval()
        w, l = [], []
        for s in range(0, len(self), rows):
            idx = np.arange(s, min(s + rows, len(self)))
            x, t, m = self.batch(idx)
            lp = sequence_logp(model.forward(x), t, m)                    # (2b,)
            w.append(lp[:idx.size])
            l.append(lp[idx.size:])
        model.train(was)
        self.ref_w, self.ref_l = np.concatenate(w), np.concatenate(l)
        return self


def margins(model, pairs):
    """Δ_i = (log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x)) of every pair,
    ``model`` being π: β Δ_i is the implicit reward's margin, > 0 where it orders the pair as the
    preference does. ``(N,)``."""
    policy = pairs.subset(np.arange(len(pairs))).reference(model)
    return (policy.ref_w - pairs.ref_w) - (policy.ref_l - pairs.ref_l)


def order(n_pairs, steps, batch_pairs, seed):
    """The pairs of each step, ``(steps, batch_pairs)``: epochs of a seeded permutation (a batch
    larger than the pairs takes some twice)."""
    rng = np.random.default_rng(seed)
    need = steps * batch_pairs
    perm = np.concatenate([rng.permutation(n_pairs) for _ in range(-(-need // n_pairs))])
    return perm[:need].reshape(steps, batch_pairs)


def dpo_step_loss(pairs, beta):
    """``forward_loss`` of DPO for ``train``: the batch is the indices of its pairs; the chosen
    and the rejected rows run through the model as one batch of 2B."""
    def forward_loss(model, idx):
        x, t, m = pairs.batch(idx)
        logits = model.forward(x)                                         # (2B, T, V)
        B = idx.size
        losses, cache = dpo_forward(logits[:B], t[:B], m[:B], logits[B:], t[B:], m[B:],
                                    pairs.ref_w[idx], pairs.ref_l[idx], beta)
        dlogits = np.empty_like(logits)                 # the chosen half, then the rejected
        dpo_backward(np.full(B, 1 / B, losses.dtype), cache, out=(dlogits[:B], dlogits[B:]))
        return float(losses.mean()), dlogits
    return forward_loss


def sft_step_loss(pairs):
    """``forward_loss`` of SFT for ``train``: cross-entropy of the chosen responses' tokens."""
    def forward_loss(model, idx):
        x, t, m = pairs.chosen_batch(idx)
        return F.cross_entropy(model.forward(x), np.where(m, t, -1), ignore_index=-1)
    return forward_loss


def step_loss(pairs, loss, beta):
    return dpo_step_loss(pairs, beta) if loss == "dpo" else sft_step_loss(pairs)


def objective(model, pairs, loss, beta, rows=32):
    """The mean of the objective ``loss`` over ``pairs`` (in eval mode; no gradient kept)."""
    was = model.training
    model.eval()
    f = step_loss(pairs, loss, beta)
    values = [(f(model, idx)[0], idx.size)
              for idx in np.array_split(np.arange(len(pairs)), -(-len(pairs) // rows))]
    model.train(was)
    return float(sum(v * n for v, n in values) / len(pairs))


def tuned_copy(base, lr, seed, lora=None):
    """``(model, params, optimizer)`` of a tuning run: a copy of ``base`` in training mode, what
    is trained (the whole model, or with ``lora = {"r", "alpha", "targets"}`` its adapters alone,
    ``Adapters``), and AdamW on it (β = (0.9, 0.95), no weight decay: the pull toward the
    reference is the method's own, DPO's β or GRPO's KL term)."""
    model = copy.deepcopy(base).train()
    params = model
    if lora is not None:
        apply_lora(model, lora["r"], lora.get("alpha"), lora["targets"], seed=seed)
        params = Adapters(model)
    return model, params, AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def tune(base, pairs, loss, lr, steps, seed, beta=0.1, lora=None, batch_pairs=16, **train_kwargs):
    """A copy of ``base`` tuned on ``pairs`` by ``loss`` (``"dpo"`` or ``"sft"``) for ``steps``
    steps at peak rate ``lr``: ``(model, hist)``. ``lora``: ``{"r", "alpha", "targets"}`` trains
    adapters alone (the model returned keeps them unmerged; ``merge_lora`` merges them). For DPO
    ``pairs`` must hold the reference's log-probabilities. ``train_kwargs`` go to ``train``
    (checkpoints, progress bar)."""
    model, params, opt = tuned_copy(base, lr, seed, lora)
    batches = order(len(pairs), steps, batch_pairs, seed)
    warmup = min(max(1, steps // 10), steps - 1)      # one step: no warm-up
    def schedule(step):
        return cosine_with_warmup(step, lr, warmup, steps, lr / 10)
    hist = train(params, opt, lambda i: batches[i], step_loss(pairs, loss, beta), steps,
                 clip_norm=1.0, lr_schedule=schedule, **{"progress_bar": False, **train_kwargs})
    return model.eval(), hist
