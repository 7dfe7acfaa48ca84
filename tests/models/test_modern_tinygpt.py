"""TinyGPT with the modern block's keywords: defaults unchanged, every combination correct.

The defaults must stay TinyGPT's first model bit for bit; every combination of ``norm``, ``positions``,
``mlp``, ``n_kv_heads`` and ``tie_embeddings`` decodes with the KV cache exactly as it recomputes;
the model with every option on passes the float64 gradient check. PyTorch parity of the whole
modern model is in ``test_torch_parity_modern.py``.
"""
import hashlib
import itertools
import os

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.__main__ import main as cli
from tformer.nn.attention import MultiHeadAttention
from tformer.training.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from tformer.decoding.generate import greedy
from tformer.core.gradcheck import check_module
from tformer.models.tinygpt import TinyGPT

from kv_steps import cached_logits
from tformer.nn.modern_layers import RMSNorm, SwiGLUFeedForward, TiedLinear, norm_layer, swiglu_hidden
from tformer.training.optim import AdamW, clip_grad_norm

ALL_ON = dict(norm="rmsnorm", positions="rope", mlp="swiglu", n_kv_heads=2, tie_embeddings=True)


# --- the defaults are TinyGPT's first model, unchanged --------------------------------------------

def test_defaults_are_the_model_before_the_modern_keywords():
    """Fingerprint taken on the commit before these keywords existed (2da402f): the same parameter
    draws, bit for bit, and the same logits (float64, to rounding of another CPU's BLAS)."""
    m = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=0, dtype=np.float64)
    h = hashlib.sha256()
    for n, p, _ in m.named_parameters():
        h.update(n.encode())
        h.update(str(p.shape).encode())
        h.update(p.tobytes())
    assert h.hexdigest() == "7616b7510dad6aeb9d34d0eb4c07ac3b590063b90de008092640f8d4e46dd046"
    assert m.num_parameters() == 15168
    z = m.forward(np.array([[1, 2, 3, 4, 5], [250, 0, 7, 7, 9]]))
    before = [[[-0.09310395477413494, 0.08448830457893967], [-0.05253302174583892, 0.051368685805388975],
               [0.02768449153517635, -0.17134124294346678], [-0.05520436826435238, 0.15047166465737935],
               [-0.023972354202377106, -0.025475322448020005]],
              [[-0.11534932127963396, 0.0855843847304168], [-0.14077808634182146, 0.04378561408165801],
               [0.08461575833909436, -0.14823539752401726], [0.031177222686212924, 0.1424446025797559],
               [0.02001354176900103, -0.09024638067908067]]]
    np.testing.assert_allclose(z[:, :, :2], before, rtol=1e-12, atol=1e-15)


def test_defaults_equal_the_explicit_first_model_keywords(tiny):
    a = tiny(n_heads=2)
    b = tiny(n_heads=2, norm="layernorm", positions="learned", mlp="gelu", n_kv_heads=2, tie_embeddings=False)
    assert a.config == b.config
    assert a.config["norm"] == "layernorm" and a.config["n_kv_heads"] == 2 and a.config["tie_embeddings"] is False
    for (n, p, _), (n2, p2, _) in zip(a.named_parameters(), b.named_parameters()):
        assert n == n2 and np.array_equal(p, p2)


# --- every combination: KV cache equals recomputation ---------------------------------------------

COMBOS = list(itertools.product(["layernorm", "rmsnorm"], ["learned", "sinusoidal", "rope"],
                                ["gelu", "relu", "relu2", "swiglu"], [4, 2, 1], [False, True]))


@pytest.mark.parametrize("norm,positions,mlp,n_kv_heads,tie", COMBOS)
def test_kv_cache_equals_recomputation_for_every_combination(norm, positions, mlp, n_kv_heads, tie, randomize, tiny, tokens):
    model = randomize(tiny(norm=norm, positions=positions, mlp=mlp, n_kv_heads=n_kv_heads,
                           tie_embeddings=tie, d_ff=12), seed=3)
    seq = tokens(2, 12, seed=4)
    cached, caches = cached_logits(model, seq, 5)             # prefill, then one position at a time
    assert caches[0].k.shape == (2, n_kv_heads, 12, 2)                   # only H_kv heads cached
    np.testing.assert_allclose(np.concatenate(cached, axis=1), model.forward(seq), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope"])
def test_cached_and_uncached_greedy_decoding_agree_float32(positions, randomize, tiny, tokens):
    model = randomize(tiny(dtype=np.float32, max_len=30, positions=positions, **{k: v for k, v in ALL_ON.items()
                                                                          if k != "positions"}), seed=5, scale=0.5)
    prompt = tokens(3, 4, seed=6)
    out = greedy(model, prompt, 35)                                       # past max_len: the window slides
    assert out.shape == (3, 39) and np.array_equal(out, greedy(model, prompt, 35, use_cache=False))


# --- gradients ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [ALL_ON, dict(ALL_ON, n_kv_heads=1, positions="sinusoidal"),
                                     dict(ALL_ON, mlp="relu", tie_embeddings=False, positions="learned"),
                                     dict(ALL_ON, mlp="relu2", n_kv_heads=1)])
def test_gradcheck_with_the_modern_options(options, randomize, tiny, tokens):
    model = randomize(tiny(d_ff=12, **options), seed=7)
    x, y = tokens(2, 6, seed=8), tokens(2, 6, seed=9)
    errs = check_module(model, x, loss=lambda z: F.cross_entropy(z, y), max_entries=20)
    assert len(errs) == len(list(model.named_parameters()))
    assert max(errs.values()) < 1e-6, errs
    errs = check_module(model, x, max_entries=20, seed=3)                 # random upstream gradient
    assert max(errs.values()) < 1e-6, errs


def test_tied_gradient_sums_the_lookup_and_the_head(randomize, tiny, tokens):
    model = randomize(tiny(**ALL_ON), seed=10)
    untied = tiny(**dict(ALL_ON, tie_embeddings=False))
    x, y = tokens(2, 6, seed=11), tokens(2, 6, seed=12)
    model.zero_grad()
    model.backward(F.cross_entropy(model.forward(x), y)[1])
    total = model.wte.grads["W"].copy()
    # The head's share, computed apart: dW_te = dZᵀ H, H the head's input (positions="rope": the
    # embeddings get no table added).
    h = model.ln_f(model.blocks[1](model.blocks[0](model.wte(x))))       # (B, T, C)
    dz = F.cross_entropy(h @ model.wte.W.T + model.lm_head.b, y)[1]       # (B, T, V)
    head_part = dz.reshape(-1, 256).T @ h.reshape(-1, 8)                  # (V, C)
    lookup_part = total - head_part
    unused = np.setdiff1d(np.arange(256), x)
    np.testing.assert_allclose(lookup_part[unused], 0, atol=1e-13)       # only the head reaches them
    assert np.abs(head_part[unused]).min() > 0
    assert np.abs(lookup_part[np.unique(x)]).min() > 1e-6                 # the lookup adds its share
    assert model.num_parameters() == untied.num_parameters() - 8 * 256


def test_tied_weight_is_one_array_for_flat_buffers_optimizer_and_clipping(randomize, tiny, tokens):
    model = randomize(tiny(**ALL_ON), seed=13)
    assert model.wte.params["W"] is model.lm_head.params["W"]
    assert model.wte.grads["W"] is model.lm_head.grads["W"]
    P, G = model.flat_buffers()
    assert P.size == model.num_parameters() == sum(p.size for _, p, _ in model._unique_parameters())
    opt = AdamW(model, lr=1e-2, weight_decay=0.1)
    assert "wte.W" in opt.state and "lm_head.W" not in opt.state
    model.zero_grad()
    model.backward(F.cross_entropy(model.forward(tokens(2, 6, seed=14)), tokens(2, 6, seed=15))[1])
    norm = clip_grad_norm(model, 1e9)
    assert norm == pytest.approx(np.linalg.norm(G), rel=1e-12)
    before = model.wte.W.copy()
    opt.step()
    assert not np.array_equal(model.wte.W, before) and model.wte.W is model.lm_head.params["W"]


# --- parameters, config, checkpoints, errors -------------------------------------------------------

def test_parameter_counts_of_each_option(tiny):
    C, H, L, T, V = 16, 4, 2, 12, 256
    D = C // H
    base = tiny(d_model=C, n_heads=H, n_layers=L, max_len=T).num_parameters()
    assert tiny(d_model=C, n_heads=H, max_len=T, positions="rope").num_parameters() == base - T * C
    assert tiny(d_model=C, n_heads=H, max_len=T, positions="sinusoidal").num_parameters() == base - T * C
    assert tiny(d_model=C, n_heads=H, max_len=T, norm="rmsnorm").num_parameters() == base - (2 * L + 1) * C
    for H_kv in (2, 1):                  # W_k, W_v and their biases: (C + 1) · H_kv D each
        assert tiny(d_model=C, n_heads=H, max_len=T, n_kv_heads=H_kv).num_parameters() == \
            base - L * 2 * (C + 1) * (H - H_kv) * D
    h = swiglu_hidden(4 * C)
    swiglu = tiny(d_model=C, n_heads=H, max_len=T, mlp="swiglu", d_ff=h).num_parameters()
    assert swiglu - base == L * ((3 * C * h + 2 * h + C) - (2 * C * 4 * C + 4 * C + C))
    assert abs(3 * C * h - 2 * C * 4 * C) <= 1.5 * C                      # same weights, to rounding
    assert tiny(d_model=C, n_heads=H, max_len=T, tie_embeddings=True).num_parameters() == base - C * V


def test_config_and_checkpoint_round_trip_with_every_option(tmp_path, randomize, tiny, tokens):
    model = randomize(tiny(dtype=np.float32, d_ff=12, **ALL_ON), seed=16)
    assert {k: model.config[k] for k in ALL_ON} == ALL_ON and model.config["d_ff"] == 12
    path = tmp_path / "m.npz"
    save_checkpoint(path, model, step=1)
    other = tiny(dtype=np.float32, d_ff=12, seed=5, **ALL_ON)
    load_checkpoint(path, other)
    x = tokens(2, 7, seed=17)
    assert np.array_equal(model.forward(x), other.forward(x))
    assert other.wte.params["W"] is other.lm_head.params["W"]             # still tied after loading
    for key, value in (("norm", "layernorm"), ("positions", "learned"), ("mlp", "gelu"),
                       ("n_kv_heads", 4), ("tie_embeddings", False)):
        with pytest.raises(ValueError, match=f"another configuration.*{key}"):
            load_checkpoint(path, tiny(dtype=np.float32, d_ff=12, **dict(ALL_ON, **{key: value})))


def test_checkpoint_of_relu2_round_trips_and_no_other_mlp_loads_it(tmp_path, randomize,
                                                                   tiny, tokens):
    """ReLU², ReLU and GELU have the same parameters (names and shapes): only the
    configuration tells them apart, so a ReLU² checkpoint loads into ReLU² (the same
    logits, bit for bit) and is refused by the other two, whose forward would differ."""
    model = randomize(tiny(dtype=np.float32, mlp="relu2"), seed=21)
    path = tmp_path / "relu2.npz"
    save_checkpoint(path, model, step=3)
    assert read_checkpoint(path)[0]["config"]["mlp"] == "relu2"
    other = tiny(dtype=np.float32, mlp="relu2", seed=5)
    load_checkpoint(path, other)
    x = tokens(2, 7, seed=22)
    assert np.array_equal(model.forward(x), other.forward(x))
    for mlp in ("gelu", "relu"):
        plain = tiny(dtype=np.float32, mlp=mlp)
        assert [(n, p.shape) for n, p, _ in plain.named_parameters()] == \
            [(n, p.shape) for n, p, _ in model.named_parameters()]
        with pytest.raises(ValueError, match="another configuration.*mlp"):
            load_checkpoint(path, plain)


@pytest.mark.parametrize("kw,error,match", [
    ({"norm": "batchnorm"}, ValueError, r"norm: expected one of \['layernorm', 'rmsnorm'\], got 'batchnorm'"),
    ({"positions": "alibi"}, ValueError, r"positions: expected one of \['learned', 'sinusoidal', 'rope'\]"),
    ({"mlp": "geglu"}, ValueError, r"mlp: expected one of \['gelu', 'relu', 'relu2', 'swiglu'\], got 'geglu'"),
    ({"mlp": None}, ValueError, "mlp: expected one of"),
    ({"n_kv_heads": 3}, ValueError, "n_kv_heads: expected a divisor of n_heads = 4, got 3"),
    ({"n_kv_heads": 0}, ValueError, "n_kv_heads: expected a divisor of n_heads = 4, got 0"),
    ({"n_kv_heads": 2.0}, TypeError, "n_kv_heads: expected an integer, got float"),
    ({"tie_embeddings": "yes"}, TypeError, "tie_embeddings: expected True or False, got 'yes'"),
    ({"positions": "rope", "d_model": 12}, ValueError, "'rope' needs an even head size d_model / n_heads, got 12 / 4 = 3"),
    ({"positions": "sinusoidal", "d_model": 7, "n_heads": 1}, ValueError, "'sinusoidal' needs an even d_model, got 7"),
    ({"n_heads": 3}, ValueError, "n_heads: expected an integer ≥ 1 that divides d_model = 8, got 3"),
])
def test_bad_keywords_fail_clearly(kw, error, match, tiny):
    with pytest.raises(error, match=match):
        tiny(**kw)


def test_layers_reject_bad_input():
    with pytest.raises(ValueError, match="norm: expected one of"):
        norm_layer("groupnorm", 8, 1e-5)
    with pytest.raises(ValueError, match="d_ff: expected an integer ≥ 2"):
        swiglu_hidden(1.5)
    with pytest.raises(TypeError, match="embedding: expected an Embedding"):
        TiedLinear(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="n_kv_heads: expected an integer ≥ 1 that divides n_heads = 4"):
        MultiHeadAttention(8, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="rope: needs an even head size"):
        MultiHeadAttention(12, 4, rope=True)
    assert swiglu_hidden(512) == 341 and swiglu_hidden(4 * 64) == 171


@pytest.mark.parametrize("fused", [False, True])
def test_attention_module_with_gqa_and_rope_gradcheck(fused):
    attn = MultiHeadAttention(12, 6, fused_qkv=fused, causal=True, n_kv_heads=2, rope=True,
                              dtype=np.float64, seed=3)
    x = np.random.default_rng(18).standard_normal((2, 5, 12))
    assert max(check_module(attn, x, max_entries=25).values()) < 1e-6
    assert attn.att.shape == (2, 6, 5, 5)


def test_modern_layers_gradcheck():
    rng = np.random.default_rng(19)
    x = rng.standard_normal((2, 3, 6))
    rms = RMSNorm(6, dtype=np.float64)
    rms.gamma[...] = rng.standard_normal(6)
    assert max(check_module(rms, x).values()) < 1e-7
    ffn = SwiGLUFeedForward(6, 5, dtype=np.float64, seed=2)
    for _, p, _ in ffn.named_parameters():
        p[...] = rng.standard_normal(p.shape)
    assert max(check_module(ffn, x).values()) < 1e-7


def test_swiglu_block_with_dropout_trains_and_evaluates(tiny, tokens):
    model = tiny(dtype=np.float32, mlp="swiglu", dropout=0.2)
    x = tokens(2, 6, seed=20)
    model.train()
    z1, z2 = model.forward(x), model.forward(x)
    model.backward(np.ones_like(z2) / z2.size)
    assert not np.array_equal(z1, z2)                                     # dropout active
    model.eval()
    assert np.array_equal(model.forward(x), model.forward(x))


# --- command line ------------------------------------------------------------------------------------

def test_cli_run_with_modern_flags_and_generate(tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("def add(a, b):\n    return a + b\n\n" * 40)
    ck = str(tmp_path / "ck.npz")
    rc = cli(["run", "tinygpt", "--text", str(text), "--steps", "3", "--d-model", "16",
              "--n-heads", "4", "--n-layers", "1", "--max-len", "16", "--batch-size", "2",
              "--eval-windows", "2", "--eval-every", "2", "--checkpoint", ck, "--sample-tokens", "8",
              "--temperatures", "1", "--no-progress", "--norm", "rmsnorm", "--positions", "rope",
              "--mlp", "swiglu", "--d-ff", "43", "--n-kv-heads", "2", "--tie-embeddings"])
    out = capsys.readouterr().out
    assert rc == 0 and os.path.exists(ck)
    assert "block: rmsnorm, rope positions, swiglu MLP (d_ff=43), 2 key/value heads, tied embeddings" in out
    config = read_checkpoint(ck)[0]["config"]
    assert {k: config[k] for k in ALL_ON} == ALL_ON and config["d_ff"] == 43
    args = ["generate", "--checkpoint", ck, "--prompt", "def ", "--max-new-tokens", "12", "--seed", "3"]
    assert cli(args) == 0
    first = capsys.readouterr().out
    assert cli(args + ["--no-cache"]) == 0
    assert capsys.readouterr().out == first and first.startswith("def ")


def test_generate_reads_a_checkpoint_saved_before_the_modern_keywords(tmp_path, capsys, tiny):
    model = tiny(dtype=np.float32, n_heads=2, max_len=16)
    old = {k: v for k, v in model.config.items() if k not in ALL_ON}      # as runs before them saved it
    ck = str(tmp_path / "old.npz")
    save_checkpoint(ck, model, config=old, step=1)
    assert cli(["generate", "--checkpoint", ck, "--prompt", "ab", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("ab")
