"""TinyGPT's ``norm_position``: pre-norm (the default, unchanged) against post-norm.

Post-norm must be the wiring X ← N(X + f(X)) with the same parameters; its gradients pass finite
differences and PyTorch float64 parity (with the default block and with every modern option on);
the KV cache still equals recomputation; the choice is kept in the config, the checkpoint and the
command line.
"""
import os

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.__main__ import main as cli
from tformer.nn.blocks import PostNormGPTBlock, PreNormBlock
from tformer.training.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from tformer.core.gradcheck import check_module
from tformer.models.tinygpt import TinyGPT

from kv_steps import cached_logits
from tformer.runs.generate_cmd import load_tinygpt

ALL_ON = dict(norm="rmsnorm", positions="rope", mlp="swiglu", n_kv_heads=2, tie_embeddings=True)


# --- the default is pre-norm; post-norm has the same parameters, wired differently -----------------

def test_default_is_pre_norm_and_post_norm_draws_the_same_parameters(tiny, tokens):
    pre, explicit, post = tiny(), tiny(norm_position="pre"), tiny(norm_position="post")
    assert pre.config == explicit.config and pre.config["norm_position"] == "pre"
    assert post.config == dict(pre.config, norm_position="post")
    assert all(type(b) is PreNormBlock for b in pre.blocks)
    assert all(type(b) is PostNormGPTBlock for b in post.blocks)
    for (n, p, _), (n2, p2, _), (n3, p3, _) in zip(pre.named_parameters(), explicit.named_parameters(),
                                                   post.named_parameters()):
        assert n == n2 == n3 and np.array_equal(p, p2) and np.array_equal(p, p3)
    x = tokens(2, 6)
    assert np.array_equal(pre.forward(x), explicit.forward(x))
    assert not np.allclose(pre.forward(x), post.forward(x), atol=1e-3)


def test_post_norm_block_is_the_formula():
    """O = LN₂(Z + FFN(Z)), Z = LN₁(X + MHA(X)), computed from the block's own sublayers."""
    blk = PostNormGPTBlock(8, 2, 16, dtype=np.float64, seed=3)
    rng = np.random.default_rng(4)
    for name, p, _ in blk.named_parameters():
        p[...] = (1.0 if name.endswith("gamma") else 0.0) + 0.3 * rng.standard_normal(p.shape)
    x = np.random.default_rng(5).standard_normal((2, 5, 8))
    z = blk.ln1(x + blk.attn(x))
    want = blk.ln2(z + blk.ffn(z))
    np.testing.assert_allclose(blk.forward(x), want, rtol=1e-13, atol=1e-14)
    plain = PostNormGPTBlock(8, 2, 16, dtype=np.float64, seed=3)      # γ = 1, β = 0: unit rows
    y = plain.forward(x)
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1, rtol=1e-4)               # ε = 1e-5 in the variance


@pytest.mark.parametrize("options", [{}, dict(n_heads=2), ALL_ON])
def test_post_norm_gradcheck(options, randomize, tiny, tokens):
    model = randomize(tiny(d_ff=12, norm_position="post", **options), seed=7)
    x, y = tokens(2, 6, seed=8), tokens(2, 6, seed=9)
    errs = check_module(model, x, loss=lambda z: F.cross_entropy(z, y), max_entries=20)
    assert len(errs) == len(list(model.named_parameters()))
    assert max(errs.values()) < 1e-6, errs
    errs = check_module(model, x, max_entries=20, seed=3)                 # random upstream gradient
    assert max(errs.values()) < 1e-6, errs


@pytest.mark.parametrize("options", [{}, ALL_ON, dict(ALL_ON, positions="sinusoidal", n_kv_heads=1)])
def test_post_norm_kv_cache_equals_recomputation(options, randomize, tiny, tokens):
    model = randomize(tiny(d_ff=12, norm_position="post", **options), seed=3)
    seq = tokens(2, 12, seed=4)
    cached, _ = cached_logits(model, seq, 5)
    np.testing.assert_allclose(np.concatenate(cached, axis=1), model.forward(seq), rtol=1e-12, atol=1e-12)


# --- PyTorch float64 parity -------------------------------------------------------------------------

def torch_twin(model):
    """TinyGPT of any ``norm_position``, norm, positions ("learned" or "rope"), MLP ("gelu" or
    "swiglu"), ``n_kv_heads`` and tying, written in PyTorch with the weights copied from ``model``."""
    torch = pytest.importorskip("torch")
    tF = torch.nn.functional
    cfg = model.config
    C, H, H_kv, Fh = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["d_ff"]
    D = C // H
    P = {n: torch.tensor(p, requires_grad=True) for n, p, _ in model._unique_parameters()}

    def norm(x, pre):
        if cfg["norm"] == "rmsnorm":
            return tF.rms_norm(x, (C,), P[pre + ".gamma"], eps=1e-5)
        return tF.layer_norm(x, (C,), P[pre + ".gamma"], P[pre + ".beta"], eps=1e-5)

    def lin(x, pre):
        return x @ P[pre + ".W"] + P[pre + ".b"]

    def rope(x):                                       # (B, h, T, D): pairs (2i, 2i+1) rotated
        T = x.shape[-2]
        theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * theta          # (T, D/2)
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], D // 2, 2).contiguous())
        return torch.view_as_real(z * torch.polar(torch.ones_like(ang), ang)).reshape(x.shape)

    def attn(x, pre):
        B, T, _ = x.shape
        q, k, v = lin(x, pre + "attn.qkv").split([C, H_kv * D, H_kv * D], dim=-1)
        q, k, v = (t.reshape(B, T, -1, D).transpose(1, 2) for t in (q, k, v))
        if cfg["positions"] == "rope":
            q, k = rope(q), rope(k)
        y = tF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return lin(y.transpose(1, 2).reshape(B, T, C), pre + "attn.o")

    def ffn(x, pre):
        if cfg["mlp"] == "swiglu":
            a, b = lin(x, pre + "ffn.fc1").split([Fh, Fh], dim=-1)
            return lin(tF.silu(a) * b, pre + "ffn.fc2")
        return lin(tF.gelu(lin(x, pre + "ffn.fc1"), approximate="tanh"), pre + "ffn.fc2")

    def forward(tok):
        tok = torch.as_tensor(tok)
        x = P["wte.W"][tok]
        if cfg["positions"] == "learned":
            x = x + P["wpe.W"][:tok.shape[1]]
        for i in range(cfg["n_layers"]):
            pre = f"blocks.{i}."
            if cfg["norm_position"] == "post":
                x = norm(x + attn(x, pre), pre + "ln1")
                x = norm(x + ffn(x, pre), pre + "ln2")
            else:
                x = x + attn(norm(x, pre + "ln1"), pre)
                x = x + ffn(norm(x, pre + "ln2"), pre)
        head = P["wte.W"].T if cfg["tie_embeddings"] else P["lm_head.W"]
        return norm(x, "ln_f") @ head + P["lm_head.b"]
    return torch, P, forward


@pytest.mark.torch_parity
@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("options", [{}, ALL_ON])
def test_torch_parity_logits_and_every_gradient(norm_position, options, randomize, tokens):
    model = randomize(TinyGPT(d_model=16, n_heads=4, n_layers=2, max_len=16, d_ff=21, dtype=np.float64,
                              seed=3, norm_position=norm_position, **options), seed=4)
    torch, P, forward = torch_twin(model)
    x, y = tokens(3, 9, seed=5), tokens(3, 9, seed=6)
    logits = model.forward(x)
    loss, dlogits = F.cross_entropy(logits, y)
    model.zero_grad()
    model.backward(dlogits)
    t_logits = forward(x)
    t_loss = torch.nn.functional.cross_entropy(t_logits.reshape(-1, 256), torch.as_tensor(y).reshape(-1))
    t_loss.backward()
    np.testing.assert_allclose(logits, t_logits.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert abs(loss - t_loss.item()) < 1e-12 * abs(loss)
    assert set(P) == {n for n, _, _ in model._unique_parameters()}
    for name, _, grad in model._unique_parameters():
        np.testing.assert_allclose(grad, P[name].grad.numpy(), rtol=1e-8, atol=1e-12, err_msg=name)


# --- config, checkpoints, command line, errors ------------------------------------------------------

def test_checkpoint_keeps_the_norm_position(tmp_path, randomize, tiny, tokens):
    model = randomize(tiny(dtype=np.float32, norm_position="post"), seed=2)
    path = str(tmp_path / "post.npz")
    save_checkpoint(path, model, step=1)
    assert read_checkpoint(path)[0]["config"]["norm_position"] == "post"
    again, _ = load_tinygpt(path)
    x = tokens(2, 5, seed=3)
    assert again.config["norm_position"] == "post" and np.array_equal(again.forward(x), model.forward(x))
    with pytest.raises(ValueError,
                       match="another configuration.*norm_position: checkpoint 'post' vs model 'pre'"):
        load_checkpoint(path, tiny(dtype=np.float32))


def test_checkpoint_without_the_key_is_pre_norm(tmp_path, tiny, tokens):
    model = tiny(dtype=np.float32)
    old = {k: v for k, v in model.config.items() if k != "norm_position"}  # saved before the key
    path = str(tmp_path / "old.npz")
    save_checkpoint(path, model, config=old, step=1)
    again, _ = load_tinygpt(path)
    assert again.config["norm_position"] == "pre"
    x = tokens(1, 4)
    assert np.array_equal(again.forward(x), model.forward(x))


@pytest.mark.parametrize("value", ["sandwich", None, 1])
def test_bad_norm_position_fails_clearly(value, tiny):
    with pytest.raises(ValueError, match=rf"norm_position: expected one of \['pre', 'post'\], got {value!r}"):
        tiny(norm_position=value)


def test_cli_flag(tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("def add(a, b):\n    return a + b\n\n" * 40)
    ck = str(tmp_path / "ck.npz")
    rc = cli(["run", "tinygpt", "--text", str(text), "--steps", "2", "--d-model", "16",
              "--n-heads", "2", "--n-layers", "1", "--max-len", "16", "--batch-size", "2",
              "--eval-windows", "2", "--eval-every", "2", "--checkpoint", ck, "--sample-tokens", "4",
              "--temperatures", "1", "--no-progress", "--norm-position", "post"])
    out = capsys.readouterr().out
    assert rc == 0 and os.path.exists(ck) and "untied embeddings, post-norm" in out
    assert read_checkpoint(ck)[0]["config"]["norm_position"] == "post"
