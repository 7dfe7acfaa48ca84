"""Muon in tformer (``tformer.training.muon``): the Newton–Schulz step on singular values, the split of a
model between Muon and AdamW, resuming bit for bit, threads, freezing and LoRA, ZeRO-1 refused,
and bad input. PyTorch parity (every option, and a TinyGPT run beside its twin):
tests/training/test_torch_parity_muon.py."""
import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.core import parallel
from tformer.training.checkpoint import load_checkpoint, read_checkpoint
from tformer.nn.lora import Adapters, apply_lora
from tformer.models import AttentionLayer
from tformer.models.tinygpt import TinyGPT
from tformer.training.muon import (NS_COEFFICIENTS, Muon, MuonAdamW, ParameterGroup, adjust_lr,
                          newton_schulz, split_parameters)
from tformer.training import batch_threads
from tformer.training.mpi import DataParallel, World
from tformer.training.train import train

SHAPE = dict(d_model=16, n_heads=2, n_layers=2, max_len=8, vocab_size=64)
MUON = dict(lr=0.02, weight_decay=0.1)
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
B, T = 6, 8


def model64(**kw):
    return TinyGPT(**SHAPE, seed=0, dtype=np.float64, **kw)


def batch(i):
    w = np.random.default_rng([11, i]).integers(0, SHAPE["vocab_size"], (B, T + 1))
    return w[:, :-1], w[:, 1:]


def forward_loss(m, b):
    return F.cross_entropy(m.forward(b[0]), b[1])


def params(model):
    return {n: p.copy() for n, p, _ in model.named_parameters()}


def run(model, opt, steps, start=0, **kw):
    return train(model, opt, batch, forward_loss, steps, start_step=start, progress_bar=False, **kw)


# --- the Newton–Schulz step acts on the singular values alone ------------------------------------

def p(sigma, coefficients=NS_COEFFICIENTS):
    a, b, c = coefficients
    return a * sigma + b * sigma**3 + c * sigma**5


@pytest.mark.parametrize("shape", [(5, 8), (8, 5), (6, 6)])
@pytest.mark.parametrize("coefficients", [NS_COEFFICIENTS, (15 / 8, -10 / 8, 3 / 8)])
@pytest.mark.parametrize("steps", [1, 5])
def test_each_step_is_u_p_sigma_vt(shape, coefficients, steps):
    """X₀ = G/‖G‖_F = UΣVᵀ (every σ ≤ 1); k steps of X ← aX + b(XXᵀ)X + c(XXᵀ)²X give
    U p(p(…p(Σ)…)) Vᵀ, p(σ) = aσ + bσ³ + cσ⁵, in float64 to 1e-13 (measured 1e-15)."""
    G = np.random.default_rng(0).standard_normal(shape)
    U, S, Vt = np.linalg.svd(G / np.linalg.norm(G), full_matrices=False)
    assert S.max() <= 1.0
    sigma = S
    for _ in range(steps):
        sigma = p(sigma, coefficients)
    got = newton_schulz(G, coefficients, steps)
    np.testing.assert_allclose(got, U @ np.diag(sigma) @ Vt, rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.linalg.svd(got, compute_uv=False), np.sort(sigma)[::-1],
                               rtol=0, atol=1e-13)


def test_a_transposed_matrix_gives_the_transposed_result_and_zero_gives_zero():
    G = np.random.default_rng(1).standard_normal((4, 9))
    np.testing.assert_allclose(newton_schulz(G.T), newton_schulz(G).T, rtol=0, atol=1e-15)
    assert not newton_schulz(np.zeros((3, 5))).any()              # 0 / ε: no NaN
    assert newton_schulz(G.astype(np.float32)).dtype == np.float32


def test_adjust_lr_reads_the_layers_fan_out_over_fan_in():
    """W: (d_in, d_out). "original": √max(1, d_out/d_in);
    "match_rms_adamw": 0.2·√max(d_in, d_out)."""
    assert adjust_lr(0.1, "original", (16, 64)) == 0.1 * 2.0
    assert adjust_lr(0.1, None, (64, 16)) == 0.1
    assert adjust_lr(0.1, "match_rms_adamw", (64, 16)) == pytest.approx(0.1 * 0.2 * 8.0, rel=1e-15)


# --- which parameters get Muon -----------------------------------------------------------------

def test_muon_gets_the_blocks_matrices_and_adamw_the_rest():
    model = model64()
    muon, adamw = split_parameters(model)
    assert muon == [f"blocks.{i}.{m}.W" for i in range(2)
                    for m in ("attn.qkv", "attn.o", "ffn.fc1", "ffn.fc2")]
    assert set(adamw) == {n for n, _, _ in model.named_parameters()} - set(muon)
    assert {"wte.W", "wpe.W", "lm_head.W", "ln_f.gamma", "blocks.0.attn.qkv.b"} <= set(adamw)
    opt = MuonAdamW(model, muon=MUON, adamw=ADAMW)
    assert list(opt.muon.state) == muon and list(opt.adamw.state) == adamw
    assert list(ParameterGroup(model, muon).named_parameters())[0][0] == "blocks.0.attn.qkv.W"


def test_a_tied_head_stays_with_adamw_and_swiglu_matrices_go_to_muon():
    model = model64(tie_embeddings=True, mlp="swiglu", norm="rmsnorm", positions="rope")
    muon, adamw = split_parameters(model)
    assert "lm_head.W" in adamw and "wte.W" in adamw
    assert all(n.startswith("blocks.") and n.endswith(".W") for n in muon) and len(muon) == 8
    # a rule that calls the head hidden under one of its two names: one owner, AdamW
    muon, adamw = split_parameters(model, lambda n, p: p.ndim == 2 and n != "wte.W")
    assert "lm_head.W" in adamw and "wte.W" in adamw


def test_the_schedule_moves_adamws_lr_in_proportion():
    opt = MuonAdamW(model64(), muon=MUON, adamw=ADAMW)
    opt.lr = 0.01
    assert (opt.lr, opt.muon.lr, opt.adamw.lr) == (0.01, 0.01, 3e-3 * (0.01 / 0.02))
    opt.lr = 0.0
    assert opt.adamw.lr == 0.0


# --- resuming: a state dict, a checkpoint --------------------------------------------------------

def test_state_dict_into_a_fresh_optimizer_continues_bit_for_bit():
    """3 steps, state_dict, a fresh model and optimizer loaded from it, 3 more: the same bits as 6
    straight. The state dict holds both optimizers' hyperparameters and buffers."""
    straight = model64()
    opt = MuonAdamW(straight, muon=dict(MUON, nesterov=False, adjust_lr_fn="match_rms_adamw"),
                    adamw=ADAMW)
    run(straight, opt, 3)
    sd, weights = opt.state_dict(), params(straight)
    assert sd["muon.adjust_lr_fn"] == "match_rms_adamw" and sd["muon.nesterov"] is False
    assert sd["muon.t"] == sd["adamw.t"] == sd["t"] == 3
    assert {k.split(".", 3)[2] for k in sd if k.startswith("muon.momentum_buffer.")} == {"blocks"}
    run(straight, opt, 6, start=3)

    resumed = model64()
    resumed.load_state_dict(weights)
    fresh = MuonAdamW(resumed, muon=MUON, adamw=dict(ADAMW, lr=1.0))   # all replaced by the load
    fresh.load_state_dict(sd)
    assert (fresh.t, fresh.muon.nesterov, fresh.muon.adjust_lr_fn, fresh.adamw.lr) == \
        (3, False, "match_rms_adamw", sd["adamw.lr"])
    run(resumed, fresh, 6, start=3)
    assert all(np.array_equal(a, b) for a, b in zip(params(resumed).values(),
                                                    params(straight).values()))


def test_resume_from_a_checkpoint_file_is_the_straight_run(tmp_path):
    """What ``--resume`` does: train writes a checkpoint (its optimizer scalars as JSON), a new
    process's objects load it and continue. 4 steps straight or 2 + 2: the same bits."""
    path = tmp_path / "ck.npz"

    def go(steps, start=0):
        model = model64()
        opt = MuonAdamW(model, muon=MUON, adamw=ADAMW)
        if start:
            load_checkpoint(path, model, opt)
        run(model, opt, steps, start, checkpoint_path=path, checkpoint_every=2)
        return model
    straight = go(4)
    go(2)
    _, _, optim_state = read_checkpoint(path)
    assert optim_state["optimizer"] == "MuonAdamW" and optim_state["muon.ns_steps"] == 5
    resumed = go(4, start=2)
    assert all(np.array_equal(a, b) for a, b in zip(params(resumed).values(),
                                                    params(straight).values()))


def test_muons_state_dict_survives_savez_and_a_bad_one_changes_nothing(tmp_path):
    model = model64()
    opt = Muon(ParameterGroup(model, split_parameters(model)[0]), lr=0.02, ns_steps=3)
    run(model, opt, 2)
    np.savez(tmp_path / "s.npz", **opt.state_dict())
    loaded = dict(np.load(tmp_path / "s.npz"))                    # scalars as 0-d arrays
    other = Muon(ParameterGroup(model, split_parameters(model)[0]), lr=0.5)
    other.load_state_dict(loaded)
    assert (other.t, other.lr, other.ns_steps, other.ns_coefficients) == \
        (2, 0.02, 3, NS_COEFFICIENTS)
    before = other.state_dict()
    for bad, match in ((dict(loaded, ns_steps=np.array(0)), "ns_steps"),
                       (dict(loaded, optimizer=np.array("AdamW")), "AdamW"),
                       ({k: v for k, v in loaded.items() if k != "a"}, "missing keys")):
        with pytest.raises(ValueError, match=match):
            other.load_state_dict(bad)
        after = other.state_dict()
        assert all(np.array_equal(after[k], before[k]) for k in before)


def test_a_bad_combined_state_dict_changes_neither_part():
    model = model64()
    opt = MuonAdamW(model, muon=MUON, adamw=ADAMW)
    run(model, opt, 1)
    sd = opt.state_dict()
    other = MuonAdamW(model, muon=dict(MUON, lr=0.5), adamw=ADAMW)
    before = other.state_dict()
    with pytest.raises(ValueError, match="adamw.beta1|betas"):
        other.load_state_dict(dict(sd, **{"adamw.beta1": 1.5}))
    with pytest.raises(ValueError, match="unexpected keys"):
        other.load_state_dict(dict(sd, stray=1))
    after = other.state_dict()
    assert all(np.array_equal(after[k], before[k]) for k in before)


# --- threads ----------------------------------------------------------------------------------

@pytest.fixture
def threads(monkeypatch):
    before = parallel.get_num_threads()
    monkeypatch.setattr(batch_threads, "MIN_PART_MACS", 0)        # cut even this small batch
    yield parallel.set_num_threads
    parallel.set_num_threads(before)


def test_one_two_and_three_threads_give_the_same_update(threads):
    """The same gradients, 3 steps of MuonAdamW under 1, 2 and 3 threads (the matrices side by
    side): the same parameters to rounding (1e-14; measured: bit for bit), and a 3-step training run with
    the batch cut across the threads the same losses to 1e-12."""
    results, losses = [], []
    for n in (1, 2, 3):
        threads(n)
        model = model64()
        opt = MuonAdamW(model, muon=MUON, adamw=ADAMW)
        rng = np.random.default_rng(5)
        for _ in range(3):
            for _, _, g in model.named_parameters():
                g[...] = rng.standard_normal(g.shape)
            opt.step()
        results.append(params(model))
        model = model64()
        losses.append(run(model, MuonAdamW(model, muon=MUON, adamw=ADAMW), 3)["loss"])
    for other in results[1:]:
        for name, p in results[0].items():
            np.testing.assert_allclose(other[name], p, rtol=0, atol=1e-14, err_msg=name)
    np.testing.assert_allclose(losses[1:], [losses[0]] * 2, rtol=1e-12)


# --- frozen parameters, LoRA ---------------------------------------------------------------------

class Trained:
    """A view of ``model`` that shows an optimizer only the parameters named ``names``: the
    reference in which the frozen ones' gradients are computed and thrown away."""

    def __init__(self, model, names):
        self.model, self.names = model, set(names)

    def named_parameters(self, prefix=""):
        return ((n, p, g) for n, p, g in self.model.named_parameters(prefix) if n in self.names)

    def flat_buffers(self):
        return None


def test_frozen_parameters_stay_and_the_others_get_the_thrown_away_update():
    frozen = model64()
    frozen.blocks[0].attn.qkv.freeze()                            # a Muon matrix and its bias
    frozen.wte.freeze()                                           # an AdamW table
    trained = [n for n, _, g in frozen.named_parameters() if g is not None]
    reference = model64()
    start = params(frozen)
    opt = MuonAdamW(frozen, muon=MUON, adamw=ADAMW)
    assert set(opt.state) == set(trained) and "blocks.0.attn.qkv.W" not in opt.state
    run(frozen, opt, 3)
    run(reference, MuonAdamW(Trained(reference, trained), muon=MUON, adamw=ADAMW), 3)
    after, ref = params(frozen), params(reference)
    for name in after:
        if name in trained:
            assert np.array_equal(after[name], ref[name]) and \
                not np.array_equal(after[name], start[name]), name
        else:
            assert np.array_equal(after[name], start[name]), name


def test_lora_adapters_train_with_muon_alone():
    """LoRA's Adapters: only A and B (2-D, in the blocks) are trained, all by Muon; no AdamW
    part."""
    model = model64()
    apply_lora(model, 2, targets=("attn",))
    view = Adapters(model)
    start = params(model)
    opt = MuonAdamW(view, muon=MUON, adamw=ADAMW)
    assert opt.adamw is None and all(n.endswith((".A", ".B")) for n in opt.state)
    run(view, opt, 2)
    changed = {n for n, p in params(model).items() if not np.array_equal(p, start[n])}
    assert changed == set(opt.state) and len(changed) == 8
    assert set(opt.state_dict()) >= {"muon.t", "base_lr_adamw"}


# --- what Muon refuses -------------------------------------------------------------------------

def test_zero1_shards_are_refused_by_name():
    """ZeRO-1 cuts the flat buffer into 1-D slices across matrices: Muon cannot orthogonalise
    them."""
    dp = DataParallel(TinyGPT(**SHAPE), World(), zero=True)
    for make in (lambda shard: MuonAdamW(shard), lambda shard: Muon(shard)):
        with pytest.raises(ValueError, match="ZeRO-1"):
            dp.optimizer(make)


GOOD = dict(lr=0.02)
BAD = [  # (keyword arguments of Muon, the argument the message names, the value it shows)
    (dict(lr=-1.0), "lr", "-1.0"), (dict(lr=float("nan")), "lr", "nan"),
    (dict(momentum=1.0), "momentum", "1.0"), (dict(momentum=-0.1), "momentum", "-0.1"),
    (dict(ns_steps=0), "ns_steps", "0"), (dict(ns_steps=100), "ns_steps", "100"),
    (dict(ns_steps=2.5), "ns_steps", "2.5"), (dict(ns_steps=True), "ns_steps", "True"),
    (dict(ns_coefficients=(3.0, -4.0)), "ns_coefficients", "(3.0, -4.0)"),
    (dict(ns_coefficients=(3.0, float("inf"), 2.0)), r"ns_coefficients\[1\] \(b\)", "inf"),
    (dict(eps=0.0), "eps", "0.0"), (dict(weight_decay=-0.1), "weight_decay", "-0.1"),
    (dict(nesterov="yes"), "nesterov", "'yes'"),
    (dict(adjust_lr_fn="rms"), "adjust_lr_fn", "'rms'"),
]


@pytest.mark.parametrize("kw, name, shown", BAD, ids=[f"{n}={s}" for _, n, s in BAD])
def test_bad_hyperparameters_raise_naming_the_argument_and_the_value(kw, name, shown):
    model = model64()
    group = ParameterGroup(model, split_parameters(model)[0])
    with pytest.raises(ValueError, match=name) as e:
        Muon(group, **{**GOOD, **kw})
    assert shown in str(e.value) and ("must be" in str(e.value))
    with pytest.raises(ValueError, match=name):                 # through MuonAdamW the same
        MuonAdamW(model, muon={**GOOD, **kw})


def test_what_is_not_a_hidden_matrix_is_refused():
    model = model64()
    with pytest.raises(ValueError, match=r"'wte.W'.*2-D|'blocks.0.ln1.gamma'.*\(16,\)"):
        Muon(model)                                               # a whole model: gains, biases
    with pytest.raises(ValueError, match="no trained hidden matrix"):
        MuonAdamW(AttentionLayer(dtype=np.float64))               # no blocks
    frozen = model64()
    for block in frozen.blocks:
        block.freeze()
    with pytest.raises(ValueError, match="no trained hidden matrix"):
        MuonAdamW(frozen)
    with pytest.raises(ValueError, match=r"muon\['lr'\] must be > 0"):
        MuonAdamW(model, muon=dict(lr=0.0))
    with pytest.raises(TypeError, match="muon: expected a dict"):
        MuonAdamW(model, muon=0.02)
    opt = MuonAdamW(model, muon=MUON)
    with pytest.raises(ValueError, match="lr must be in"):
        opt.lr = -0.1
