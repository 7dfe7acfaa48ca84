"""GRPO's training loop: the policy writes groups of responses, the judge scores them, and the
responses above their group's mean are pushed up (``tformer.tuning.grpo``: the loss and its
gradient, derived).

**One step** (``num_iterations`` μ = 1, the default; DeepSeekMath's and TRL's):

1. B = ``prompts_per_step`` prompts (epochs of a seeded permutation, ``tune.order``), and G =
   ``group`` responses to each, sampled at ``temperature`` through the KV cache
   (``pairs.sample_responses``: the Decoding chapter's sampler) and cut after their first line
   break (``pairs.cut_responses``). The draws come from ``np.random.default_rng([seed, b])`` for
   the b-th sampled batch: a function of the step, so a run resumed from a checkpoint samples
   what the straight run sampled.
2. The rewards r_{b,g} = ``reward(responses, lengths)`` (``line_reward``: the judge on each
   line, 1 if it scans, else 0), and the group advantages A = (r − mean_g) / (std_g + 1e-4)
   (``group_advantages``): a group whose rewards are all equal has A = 0 and gives no gradient
   but the KL term's.
3. The reference's token log-probabilities log π_ref(y_t) (the base model, frozen, in eval mode),
   for β k3 and for the record.
4. The policy's forward pass on the B·G rows prompt·response (``pairs.sequences``), the log-
   probabilities of the response tokens, ``grpo_forward`` (ρ = 1: π_old is this policy, detached)
   and its backward into the logits (``token_logp_backward``); ``model.backward`` then takes it
   as any loss's gradient, in the one training loop (``tformer.training.train.train``: AdamW,
   clipping at 1, warm-up over a tenth of the steps and cosine decay to a tenth of the peak; every
   weight, or LoRA adapters alone through ``apply_lora``/``Adapters``; the batch cut across
   threads by ``BatchCut``).

With μ > 1 a sampled batch is used for μ consecutive optimizer steps: log π_old is the policy's
log-probabilities at the first of them (ρ = 1 there), and the later ones are clipped as PPO's.

Only the response tokens' logits get a gradient: the rows' prompts are all P tokens long, so the
responses' targets are positions P − 1 onwards, and the loss sees those ``(N, T_r)``, T_r the
longest response (``max_len`` of ``dr_grpo`` is ``response_tokens``).

**Recorded per step** (``hist``): ``reward`` (the batch's mean reward), ``kl_k3`` (Σ_t k3 of a
response, the mean over the batch: an unbiased estimate of KL(π ‖ π_ref) per line under the
policy that sampled), ``length`` (mean tokens of a response, its line break included), ``clipped``
(the share of response tokens whose ratio the clip holds), beside ``train``'s ``loss``, ``lr``,
``grad_norm``, ``clip_ratio``, ``time``; ``eval``: ``[(step, evaluate(model, step))]`` at
``eval_steps``. These and ``loss`` are kept in the checkpoints too (``extra["grpo"]``): a resumed
run returns them for every step (``start_step``: where it resumed; ``train``'s other lists cover
the steps it ran).
"""
import math
import os
from typing import NamedTuple

import numpy as np

from tformer.training.checkpoint import load_checkpoint
from tformer.training.optim import cosine_with_warmup
from tformer.training.train import train
from tformer.tuning import pairs as PR
from tformer.tuning.grpo import (LEVELS, LOSS_TYPES, SCALES, group_advantages, grpo_backward,
                                 grpo_forward, token_logp, token_logp_backward)
from tformer.tuning.tune import order, tuned_copy

RECORDS = ("loss", "reward", "kl_k3", "length", "clipped")


class Rollouts(NamedTuple):
    """One sampled batch: N = B·G rows, row b·G + g the g-th response to prompt b."""
    batch: int              # b: the sampled batch's number (its draws: default_rng([seed, b]))
    x: np.ndarray           # (N, P + T_r − 1) the model's input, prompt then response
    targets: np.ndarray     # (N, T_r) the response tokens, 0 past each response
    mask: np.ndarray        # (N, T_r) bool: response tokens
    rewards: np.ndarray     # (B, G) float64
    advantages: np.ndarray  # (N,) in the model's dtype
    logp_ref: np.ndarray    # (N, T_r) log π_ref of the response tokens, 0 off the mask
    lengths: np.ndarray     # (N,) tokens of each response
    logp_old: list          # [log π_old (N, T_r)] once the first step on this batch has run


def line_reward(tokenizer, judge):
    """``reward(responses (N, R), lengths (N,)) -> (N,)``: ``judge(line)`` (True/False, or a number)
    on the text of each response up to its line break (``pairs.line_of``)."""
    def reward(responses, lengths):
        return np.array([float(judge(PR.line_of(tokenizer, r[:k])))
                         for r, k in zip(responses, lengths)], dtype=np.float64)
    return reward


def rollouts(model, ref, prompts, reward, breaks, group, rng, batch=0, temperature=1.0,
             response_tokens=PR.RESPONSE_TOKENS, scale="group"):
    """Sample ``group`` responses to each of ``prompts`` (B, P) from ``model``, score them, and
    take the reference's log-probabilities of them: a ``Rollouts``."""
    B, P = prompts.shape
    try:
        resp = PR.sample_responses(model, prompts, group, rng, temperature, response_tokens)
    except ValueError as e:                 # a kernel refusing inf/NaN (as finetune reads it), or a bug
        if "NaN" not in str(e):
            raise
        raise FloatingPointError(f"the policy cannot sample, its activations hold inf or NaN: "
                                 f"{e}") from e
    flat = resp.reshape(B * group, response_tokens)
    lengths = PR.cut_responses(flat, breaks)
    rewards = np.asarray(reward(flat, lengths), dtype=np.float64)
    if rewards.shape != (B * group,):
        raise ValueError(f"reward: expected one reward per response, shape ({B * group},), got "
                         f"{rewards.shape}")
    rewards = rewards.reshape(B, group)
    x, t, m = PR.sequences(np.repeat(prompts, group, axis=0), flat, lengths)
    t, m = t[:, P - 1:], m[:, P - 1:]                              # the responses' targets
    logp_ref, _ = token_logp(_eval_forward(ref, x)[:, P - 1:], t, m)
    A = group_advantages(rewards, scale).astype(logp_ref.dtype)
    return Rollouts(batch, x, t, m, rewards, A, logp_ref, lengths, [])


def _eval_forward(model, x):
    """``model.forward(x)`` in eval mode, its mode restored."""
    was = model.training
    model.eval()
    try:
        return model.forward(x)
    finally:
        model.train(was)


def grpo_step_loss(model, ref, prompts, reward, breaks, *, seed, group, prompts_per_step, steps,
                   beta, loss_type="grpo", level="token", epsilon=0.2, epsilon_high=None,
                   num_iterations=1, scale="group", temperature=1.0,
                   response_tokens=PR.RESPONSE_TOKENS, records=None):
    """``forward_loss(net, step) -> (loss, dlogits)`` of GRPO for ``train`` (whose batch is the step
    number): samples with ``model`` (the policy itself, whatever ``net`` wraps it in), scores with
    ``reward``, and appends the step's ``RECORDS`` to ``records`` (a dict of lists)."""
    n_batches = -(-steps // num_iterations)
    picks = order(prompts.shape[0], n_batches, prompts_per_step, seed)   # (n_batches, B)
    P = prompts.shape[1]
    held = {}                                                     # the batch of the last step

    def forward_loss(net, step):
        b, j = divmod(step - 1, num_iterations)
        ro = held.get("rollouts")
        if ro is None or ro.batch != b:
            if j:
                raise RuntimeError(f"step {step}: the {j + 1}-th step on sampled batch {b} needs "
                                   f"that batch, sampled at step {b * num_iterations + 1}")
            ro = rollouts(model, ref, prompts[picks[b]], reward, breaks, group,
                          np.random.default_rng([seed, b]), b, temperature, response_tokens, scale)
            held["rollouts"] = ro
        logits = net.forward(ro.x)                                          # (N, P + T_r − 1, V)
        if not np.isfinite(logits).all():
            raise FloatingPointError("the policy's logits hold inf or NaN")
        logp, cache = token_logp(logits[:, P - 1:], ro.targets, ro.mask)
        if j == 0 and num_iterations > 1:
            ro.logp_old.append(logp.copy())                                 # π_old = π, detached
        losses, g = grpo_forward(logp, ro.logp_old[0] if j else None, ro.logp_ref, ro.mask,
                                 ro.advantages, loss_type=loss_type, level=level,
                                 eps_low=epsilon, eps_high=epsilon_high, beta=beta,
                                 max_len=response_tokens)
        dz = token_logp_backward(grpo_backward(np.ones_like(losses), g), cache)
        dlogits = np.zeros_like(logits)
        dlogits[:, P - 1:] = dz
        loss = float(losses.sum())
        if records is not None:
            m = ro.mask
            clip = np.broadcast_to(g.clipped, m.shape)[m]
            for k, v in (("loss", loss), ("reward", ro.rewards.mean()),
                         ("kl_k3", g.kl.sum(axis=1).mean()),
                         ("length", ro.lengths.mean()), ("clipped", clip.mean())):
                records[k].append(float(v))
        return loss, dlogits
    return forward_loss


def grpo_tune(base, prompts, reward, breaks, steps, seed, lr, beta=0.04, *, group=8,
              prompts_per_step=8, lora=None, loss_type="grpo", level="token", epsilon=0.2,
              epsilon_high=None, num_iterations=1, scale="group", temperature=1.0,
              response_tokens=PR.RESPONSE_TOKENS, evaluate=None, eval_steps=(),
              checkpoint_path=None, checkpoint_every=0, resume=False, **train_kwargs):
    """A copy of ``base`` tuned by GRPO for ``steps`` optimizer steps at peak rate ``lr``, the
    reference π_ref being ``base``: ``(model, hist)`` (the module docstring).

    ``prompts``: ``(M, P)`` token ids, all P long. ``reward(responses (N, R), lengths (N,)) -> (N,)``
    (``line_reward(tokenizer, judge)``). ``breaks``: ``(V,)`` bool, the tokens that end a line
    (``pairs.newline_tokens``). ``lora``: ``{"r", "alpha", "targets"}`` trains adapters alone (the
    model returned keeps them unmerged). ``loss_type``, ``level``, ``epsilon`` (ε_low),
    ``epsilon_high``, ``scale``: ``grpo_forward``'s and ``group_advantages``'s. ``evaluate(model,
    step) -> dict`` runs (eval mode) after the steps ``eval_steps`` and the last.
    ``checkpoint_path``: the run's checkpoint (the trained weights or adapters, AdamW's state and
    the records), written every ``checkpoint_every`` steps (a multiple of ``num_iterations``) and
    at the end; ``resume=True`` continues from it if it exists, and repeats the straight run bit
    for bit. ``train_kwargs`` go to ``train`` (``progress_bar``, ``desc``, ``log_path``).
    """
    _check(prompts, breaks, steps, group, prompts_per_step, loss_type, level, scale,
           num_iterations, checkpoint_every, resume, checkpoint_path)
    model, params, opt = tuned_copy(base, lr, seed, lora)
    records = {k: [] for k in RECORDS}
    start = 0
    if resume and checkpoint_path and os.path.exists(checkpoint_path):
        meta = load_checkpoint(checkpoint_path, params, opt)
        start, extra = int(meta["step"]), meta.get("extra", {})
        if extra.get("steps") != steps or "grpo" not in extra:
            raise ValueError(f"checkpoint_path: {checkpoint_path!r} is not a GRPO run of {steps} "
                             f"steps (its extra: steps {extra.get('steps')})")
        if start % num_iterations:
            raise ValueError(f"checkpoint_path: saved at step {start}, inside a sampled batch of "
                             f"num_iterations = {num_iterations} steps")
        records = {k: list(extra["grpo"][k][:start]) for k in RECORDS}
    warmup = min(max(1, steps // 10), steps - 1)                   # one step: no warm-up

    def schedule(step):
        return cosine_with_warmup(step, lr, warmup, steps, lr / 10)
    loss = grpo_step_loss(model, base, prompts, reward, breaks, seed=seed, group=group,
                          prompts_per_step=prompts_per_step, steps=steps, beta=beta,
                          loss_type=loss_type, level=level, epsilon=epsilon,
                          epsilon_high=epsilon_high, num_iterations=num_iterations, scale=scale,
                          temperature=temperature, response_tokens=response_tokens,
                          records=records)
    wanted = set(int(s) for s in eval_steps if 0 < s <= steps) | {steps}
    every = math.gcd(*wanted)
    seen = {"step": start}

    def counted(net, step):
        seen["step"] = step
        return loss(net, step)

    def judge_model(_params):
        step = seen["step"]
        return evaluate(model, step) if step in wanted else None
    hist = train(params, opt, lambda i: i + 1, counted, steps, start_step=start, clip_norm=1.0,
                 lr_schedule=schedule, evaluate=judge_model if evaluate is not None else None,
                 eval_every=every, checkpoint_path=checkpoint_path,
                 checkpoint_every=checkpoint_every, checkpoint_extra={"grpo": records},
                 **{"progress_bar": False, **train_kwargs})
    hist.update({k: list(records[k]) for k in RECORDS}, start_step=start)
    hist["eval"] = [(s, e) for s, e in hist["eval"] if e is not None]
    return model.eval(), hist


def _check(prompts, breaks, steps, group, prompts_per_step, loss_type, level, scale,
           num_iterations, checkpoint_every, resume, checkpoint_path):
    """ValueError naming the argument, before any work."""
    if not isinstance(prompts, np.ndarray) or prompts.ndim != 2 or prompts.shape[0] < 1 \
            or prompts.shape[1] < 1 or not np.issubdtype(prompts.dtype, np.integer):
        raise ValueError(f"prompts: expected (M, P) integer token ids, M, P ≥ 1, got "
                         f"{getattr(prompts, 'shape', type(prompts).__name__)}")
    if not isinstance(breaks, np.ndarray) or breaks.dtype != bool or breaks.ndim != 1 \
            or not breaks.any():
        raise ValueError("breaks: expected (V,) bool marking the line-break tokens, at least one")
    for name, v, low in (("steps", steps, 1), ("group", group, 2),
                         ("prompts_per_step", prompts_per_step, 1),
                         ("num_iterations", num_iterations, 1), ("checkpoint_every", checkpoint_every, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ValueError(f"{name}: expected an integer ≥ {low}, got {v!r}")
    for name, v, allowed in (("loss_type", loss_type, LOSS_TYPES), ("level", level, LEVELS),
                             ("scale", scale, SCALES)):
        if v not in allowed:
            raise ValueError(f"{name}: expected one of {allowed}, got {v!r}")
    if checkpoint_every % num_iterations:
        raise ValueError(f"checkpoint_every: expected a multiple of num_iterations = "
                         f"{num_iterations} (a checkpoint between them would lose the sampled "
                         f"batch), got {checkpoint_every}")
    if resume and not checkpoint_path:
        raise ValueError("resume: continues checkpoint_path; expected a checkpoint_path")
