"""GRPO's training loop (``tformer.tuning.grpo_train``) on a tiny TinyGPT: the step is the same on one,
two and three threads; LoRA moves the adapters alone and every weight moves without it; a run resumed
from its checkpoint repeats the straight run bit for bit; groups whose rewards are all equal give no
gradient but the KL term's; a policy whose logits stop being finite stops training with the
training loop's error; the step's gradient is the GRPO loss's through the whole model (finite
differences, float64); the reward pushes its rate up."""
import copy

import numpy as np
import pytest

from tformer.core import parallel
from tformer.core.gradcheck import numerical_grad
from tformer.models.tinygpt import TinyGPT
from tformer.nn.lora import Adapters, apply_lora
from tformer.training import batch_threads
from tformer.training.train import NonFiniteLossError
from tformer.tuning import grpo_train as GT

V, BREAK, P, R = 11, 10, 4, 6


def _model(dtype=np.float32, seed=0):
    return TinyGPT(d_model=8, n_heads=2, n_layers=2, max_len=16, vocab_size=V, dtype=dtype,
                   seed=seed).eval()


def _prompts(M=6, seed=0):
    return np.random.default_rng(seed).integers(0, BREAK, (M, P))


BREAKS = np.arange(V) == BREAK


def _has_three(responses, lengths):
    """1 where the line holds token 3."""
    return np.array([float(3 in r[:k]) for r, k in zip(responses, lengths)])


def _tune(base, steps=3, **kw):
    opts = dict(group=4, prompts_per_step=3, response_tokens=R, beta=0.1)
    opts.update(kw)
    return GT.grpo_tune(base, _prompts(), opts.pop("reward", _has_three), BREAKS, steps, 1,
                        opts.pop("lr", 3e-2), **opts)


def _params(model):
    return {k: v.copy() for k, v, _ in model.named_parameters()}


@pytest.mark.parametrize("lora", [None, dict(r=2, targets="all")])
def test_a_grpo_step_is_the_same_on_one_two_and_three_threads(lora, monkeypatch):
    monkeypatch.setattr(batch_threads, "MIN_PART_MACS", 0)          # cut even this tiny batch
    cuts = []
    split = batch_threads.Replicas.split
    monkeypatch.setattr(batch_threads.Replicas, "split",
                        lambda self, *a: cuts.append(split(self, *a)) or cuts[-1])
    base = _model()
    out, hists = {}, {}
    before = parallel.get_num_threads()
    try:
        for n in (1, 2, 3):
            parallel.set_num_threads(n)
            tuned, hists[n] = _tune(base, lora=lora, lr=3e-3)
            out[n] = _params(tuned)
    finally:
        parallel.set_num_threads(before)
    assert [len(c) for c in cuts if c is not None] == [2] * 3 + [3] * 3     # every step was cut
    for n in (2, 3):
        assert hists[n]["reward"] == hists[1]["reward"]            # the same lines were drawn
        for k in out[1]:
            assert np.allclose(out[n][k], out[1][k], atol=2e-6, rtol=1e-5), (n, k)
    start = _params(base)
    moved = [k for k, v in out[1].items() if k.endswith(".B") and v.any()] if lora else \
        [k for k, v in out[1].items() if not np.array_equal(v, start[k])]
    assert moved                                                  # and the steps moved the weights


def test_lora_moves_the_adapters_alone_and_full_tuning_moves_every_weight():
    base = _model()
    start = _params(base)
    tuned, hist = _tune(base, lora=dict(r=2, targets="all"))
    assert len(hist["loss"]) == len(hist["reward"]) == len(hist["kl_k3"]) == 3
    assert hist["kl_k3"][0] < 1e-6                                  # π = π_ref (B = 0) at the start
    moved = [n for n, p, _ in tuned.named_parameters() if n.endswith((".A", ".B"))]
    assert moved and len(Adapters(tuned).state_dict()) == len(moved)
    for name, p, _ in tuned.named_parameters():
        if not name.endswith((".A", ".B")):
            assert np.array_equal(p, start[name.replace(".base.", ".")]), name
    assert any(not np.array_equal(p, 0) for n, p, _ in tuned.named_parameters() if n.endswith(".B"))
    full, _ = _tune(base)
    after = _params(full)
    assert all(not np.array_equal(after[k], start[k]) for k in ("tok_emb.W", "lm_head.W")
               if k in after), sorted(after)
    assert np.array_equal(_params(base)["lm_head.W"] if "lm_head.W" in start else 0,
                          start.get("lm_head.W", 0))               # the base is left as it was


@pytest.mark.parametrize("lora", [None, dict(r=2, targets="attn")])
def test_a_resumed_run_repeats_the_straight_run_bit_for_bit(tmp_path, lora):
    base = _model()
    straight, hist = _tune(base, steps=4, lora=lora, checkpoint_path=tmp_path / "a.npz",
                           checkpoint_every=2)
    calls = {"n": 0}

    def fails_in_step_three(responses, lengths):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt                              # the run stops after step 2's save
        return _has_three(responses, lengths)
    path = tmp_path / "b.npz"
    with pytest.raises(KeyboardInterrupt):
        _tune(base, steps=4, lora=lora, reward=fails_in_step_three, checkpoint_path=path,
              checkpoint_every=2)
    resumed, hist2 = _tune(base, steps=4, lora=lora, checkpoint_path=path, checkpoint_every=2,
                           resume=True)
    assert hist2["start_step"] == 2 and hist2["step"] == [3, 4]
    for k in GT.RECORDS:
        assert hist2[k] == hist[k], k                              # every step's record, the same
    a, b = _params(straight), _params(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_groups_with_equal_rewards_give_no_gradient_but_the_kl_term_s():
    base = _model(np.float64)
    policy = copy.deepcopy(base)
    for _, p, _ in policy.named_parameters():                      # π away from π_ref
        p += np.random.default_rng(2).standard_normal(p.shape) * 0.05
    for reward in (lambda r, k: np.ones(len(k)), lambda r, k: np.zeros(len(k))):
        kw = dict(seed=1, group=4, prompts_per_step=3, steps=2, response_tokens=R)
        step = GT.grpo_step_loss(policy, base, _prompts(), reward, BREAKS, beta=0.0, **kw)
        loss, dlogits = step(policy, 1)
        assert loss == 0 and not dlogits.any()
        records = {k: [] for k in GT.RECORDS}
        step = GT.grpo_step_loss(policy, base, _prompts(), reward, BREAKS, beta=0.5,
                                 records=records, loss_type="luspo", **kw)
        loss, dlogits = step(policy, 1)
        assert dlogits.any() and records["kl_k3"][0] > 0           # the KL term alone:
        assert loss == pytest.approx(0.5 * records["kl_k3"][0], rel=1e-12)  # β · mean Σ_t k3


def test_a_step_s_gradient_is_the_finite_differences_of_its_loss():
    """With ρ held at 1 (π_old = π, detached, as TRL) the loss's value does not move with π: the
    finite differences are taken on the second step of a batch used twice (μ = 2), where π_old is
    the first step's policy, fixed, and ρ = e^{log π − log π_old} = 1 at the same weights."""
    base = _model(np.float64)
    policy = copy.deepcopy(base)
    apply_lora(policy, 2, None, "all", seed=3)
    params = Adapters(policy)
    for _, p, _ in params.named_parameters():                      # B = 0 at the start: move off it
        p += np.random.default_rng(4).standard_normal(p.shape) * 0.1
    step = GT.grpo_step_loss(policy, base, _prompts(), _has_three, BREAKS, seed=5, group=4,
                             prompts_per_step=3, steps=2, beta=0.3, response_tokens=R,
                             num_iterations=2)
    policy.train()
    params.zero_grad()
    _, first = step(policy, 1)                                     # samples, keeps log π_old
    params.zero_grad()
    _, dout = step(policy, 2)
    assert np.allclose(dout, first, rtol=1e-12, atol=1e-15)        # ρ = 1 either way
    policy.backward(dout)
    analytic = {n: g.copy() for n, _, g in params.named_parameters()}
    rng = np.random.default_rng(6)
    for name, p, _ in params.named_parameters():
        num, flat = numerical_grad(lambda: step(policy, 2)[0], p, 1e-6, rng, 4)
        assert np.allclose(analytic[name].reshape(-1)[flat], num, atol=1e-9, rtol=1e-6), name
    assert any(g.any() for g in analytic.values())


def test_logits_that_stop_being_finite_stop_training_with_the_loop_s_error():
    """A rate so large that the first update overflows the weights: the second step cannot sample,
    and ``train``'s error names the step, before the update."""
    with pytest.raises(NonFiniteLossError, match="step 2: the loss is nan") as e, \
            np.errstate(all="ignore"):
        _tune(_model(), lr=1e38)
    assert "cannot sample, its activations hold inf or NaN" in str(e.value.__cause__)


def test_the_judge_s_reward_goes_up():
    base = _model()
    _, hist = _tune(base, steps=30, lr=3e-2, beta=0.0, prompts_per_step=6, group=8)
    first, last = np.mean(hist["reward"][:5]), np.mean(hist["reward"][-5:])
    assert last > first + 0.1, (first, last)
    assert hist["kl_k3"][-1] > hist["kl_k3"][0]


def test_bad_arguments_are_refused_before_any_work():
    base = _model()
    with pytest.raises(ValueError, match="group"):
        _tune(base, group=1)
    with pytest.raises(ValueError, match="breaks"):
        GT.grpo_tune(base, _prompts(), _has_three, np.zeros(V, bool), 2, 1, 1e-3)
    with pytest.raises(ValueError, match="checkpoint_every"):
        _tune(base, num_iterations=2, checkpoint_every=3)
    with pytest.raises(ValueError, match="loss_type"):
        _tune(base, loss_type="ppo")
