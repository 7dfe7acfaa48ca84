"""TinyGPT (tformer/models/tinygpt.py): gradients (finite differences, PyTorch), KV cache, sampling,
checkpoints, data, CLI."""
import os

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.__main__ import main as cli
from tformer.training.checkpoint import load_checkpoint, save_checkpoint
from tformer.data.text import (STDLIB_MODULES, TextData, bits_per_byte, decode, encode, evaluate_loss,
                               module_source, unigram_cross_entropy, unigram_entropy)
from tformer.decoding.generate import greedy, sample, sample_from_logits, top_k_filter, top_p_filter
from tformer.core.gradcheck import check_module
from tformer.models.tinygpt import TinyGPT

from kv_steps import cached_logits
from tformer.training.optim import AdamW


# --- gradients: finite differences ---------------------------------------------------------------

@pytest.mark.parametrize("n_heads", [1, 2])
def test_gradcheck_cross_entropy(n_heads, randomize, tiny, tokens):
    model = randomize(tiny(n_heads))
    x, y = tokens(2, 5, seed=3), tokens(2, 5, seed=4)
    errs = check_module(model, x, loss=lambda z: F.cross_entropy(z, y), max_entries=20)
    assert len(errs) == len(list(model.named_parameters()))
    assert max(errs.values()) < 1e-6, errs


def test_gradcheck_random_upstream_multi_head(randomize, tiny, tokens):
    model = randomize(tiny(4, d_model=8, n_layers=1), seed=5)
    errs = check_module(model, tokens(2, 6, seed=6), max_entries=20, seed=2)
    assert max(errs.values()) < 1e-6, errs


# --- gradients: PyTorch float64 parity -------------------------------------------------------------

def torch_twin(model):
    """The same network in PyTorch, attention written out (masked softmax), weights copied from ``model``."""
    torch = pytest.importorskip("torch")
    cfg = model.config
    C, H = cfg["d_model"], cfg["n_heads"]
    D = C // H
    P = {name: torch.tensor(p, requires_grad=True) for name, p, _ in model.named_parameters()}

    def ln(x, pre):
        return torch.nn.functional.layer_norm(x, (C,), P[pre + ".gamma"], P[pre + ".beta"], eps=1e-5)

    def lin(x, pre):
        return x @ P[pre + ".W"] + P[pre + ".b"]

    def forward(tok):
        tok = torch.as_tensor(tok)
        B, T = tok.shape
        x = P["wte.W"][tok] + P["wpe.W"][:T]                                     # (B, T, C)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for i in range(cfg["n_layers"]):
            pre = f"blocks.{i}."
            qkv = lin(ln(x, pre + "ln1"), pre + "attn.qkv")                       # (B, T, 3C)
            q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))
            s = (q @ k.transpose(-1, -2)) / D ** 0.5
            att = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)     # (B, H, T, T)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + lin(y, pre + "attn.o")
            h = torch.nn.functional.gelu(lin(ln(x, pre + "ln2"), pre + "ffn.fc1"), approximate="tanh")
            x = x + lin(h, pre + "ffn.fc2")
        return lin(ln(x, "ln_f"), "lm_head")
    return torch, P, forward


@pytest.mark.torch_parity
@pytest.mark.parametrize("n_heads", [1, 4])
def test_torch_parity_logits_and_every_gradient(n_heads, randomize, tiny, tokens):
    model = randomize(tiny(n_heads, d_model=16, n_layers=2), seed=7)
    torch, P, forward = torch_twin(model)
    x, y = tokens(3, 7, seed=8), tokens(3, 7, seed=9)
    logits = model.forward(x)
    loss, dlogits = F.cross_entropy(logits, y)
    model.zero_grad()
    model.backward(dlogits)
    t_logits = forward(x)
    t_loss = torch.nn.functional.cross_entropy(t_logits.reshape(-1, 256), torch.as_tensor(y).reshape(-1))
    t_loss.backward()
    np.testing.assert_allclose(logits, t_logits.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert abs(loss - t_loss.item()) < 1e-12
    for name, _, grad in model.named_parameters():
        np.testing.assert_allclose(grad, P[name].grad.numpy(), rtol=1e-8, atol=1e-12, err_msg=name)


# --- KV cache and decoding ------------------------------------------------------------------------

@pytest.mark.parametrize("n_heads", [1, 2])
def test_kv_cache_logits_equal_full_recomputation_at_every_step(n_heads, randomize, tiny, tokens):
    model = randomize(tiny(n_heads, max_len=16), seed=11)
    seq = tokens(2, 16, seed=12)
    cached, _ = cached_logits(model, seq, 4)                 # prefill (B, 4, V), then (B, 1, V) each
    for t in range(4, 16):
        full = model.forward(seq[:, :t + 1])                                  # (B, t + 1, V)
        np.testing.assert_allclose(cached[t - 3][:, 0], full[:, -1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.concatenate(cached, axis=1), model.forward(seq), rtol=1e-12, atol=1e-12)


def test_cached_and_uncached_decoding_agree_float32(randomize, tiny, tokens):
    model = randomize(tiny(2, max_len=40, dtype=np.float32), seed=13, scale=0.5)
    prompt = tokens(3, 5, seed=14)
    assert np.array_equal(greedy(model, prompt, 30), greedy(model, prompt, 30, use_cache=False))
    a = sample(model, prompt, 30, temperature=0.9, top_k=50, seed=5)
    b = sample(model, prompt, 30, temperature=0.9, top_k=50, seed=5, use_cache=False)
    assert a.shape == (3, 35) and np.array_equal(a, b)


def test_prompt_longer_than_max_len_is_cropped(randomize, tiny, tokens):
    model = randomize(tiny(1, max_len=8), seed=15)
    prompt = tokens(2, 11, seed=16)
    out = greedy(model, prompt, 6)
    assert out.shape == (2, 17) and np.array_equal(out[:, :11], prompt)
    for t in range(11, 17):     # each new token is the argmax given the last max_len tokens
        assert np.array_equal(out[:, t], model.forward(out[:, t - 8:t])[:, -1].argmax(-1))
    # the window fills up during decoding: cached path switches to recomputation
    out2 = greedy(model, prompt[:, :5], 10)
    assert np.array_equal(out2, greedy(model, prompt[:, :5], 10, use_cache=False))


def test_greedy_works_on_a_model_without_a_cache_and_stops():
    class Counter:          # logits favour (last token + 1) mod V; no KV cache
        training, max_len = False, None

        def train(self, mode=True):
            self.training = mode

        def eval(self):
            self.training = False

        def forward(self, tok):
            return np.eye(10)[(tok + 1) % 10].astype(np.float32)             # (B, T, V)
    out = greedy(Counter(), np.array([[3], [8]]), 5, stop_token=9)
    assert out.tolist() == [[3, 4, 5, 6, 7, 8], [8, 9, 9, 9, 9, 9]]


def test_top_k_filter_keeps_exactly_the_k_largest():
    z = np.random.default_rng(0).standard_normal((4, 50))
    for k in (1, 5, 49, 50, 80):
        kept = np.isfinite(top_k_filter(z, k))
        assert (kept.sum(-1) == min(k, 50)).all()
        top = np.argsort(-z, axis=-1)[:, :min(k, 50)]
        assert np.take_along_axis(kept, top, -1).all()
    with pytest.raises(ValueError, match="k"):
        top_k_filter(z, 0)


def test_top_p_filter_keeps_the_smallest_nucleus():
    z = np.random.default_rng(1).standard_normal((6, 40)) * 2
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    for top_p in (0.05, 0.5, 0.9, 1.0):
        kept = np.isfinite(top_p_filter(z, top_p))
        for row in range(6):
            mass = p[row, kept[row]].sum()
            smallest = p[row, kept[row]].min()
            assert mass >= top_p - 1e-12 and mass - smallest < top_p      # minimal and sufficient
            assert p[row, ~kept[row]].max(initial=0) <= smallest          # the most probable ones
    with pytest.raises(ValueError, match="p"):
        top_p_filter(z, 0.0)


def test_sampling_never_emits_a_token_outside_its_set():
    rng = np.random.default_rng(2)
    z = np.repeat(rng.standard_normal((8, 256)) * 3, 250, axis=0)             # 2000 draws per case
    for kw in ({"top_k": 3}, {"top_p": 0.3}, {"top_k": 10, "top_p": 0.5}):
        for temp in (0.5, 1.0, 3.0):
            allowed = np.ones(z.shape, bool)
            if "top_k" in kw:
                allowed &= np.isfinite(top_k_filter(z, kw["top_k"]))
            if "top_p" in kw:                                                  # on z / temperature
                allowed &= np.isfinite(top_p_filter(np.where(allowed, z, -np.inf) / temp, kw["top_p"]))
            tok = sample_from_logits(z, rng, temperature=temp, **kw)
            assert allowed[np.arange(z.shape[0]), tok].all()
            assert len(np.unique(tok)) > 1


def test_sampled_text_respects_top_k_at_every_step_and_top_k_1_is_greedy(randomize, tiny, tokens):
    model = randomize(tiny(2, max_len=30), seed=17, scale=0.5)
    prompt = tokens(2, 4, seed=18)
    out = sample(model, prompt, 20, temperature=1.5, top_k=4, seed=1)
    logits = model.forward(out[:, :-1])                                        # (B, 23, V)
    for t in range(4, 24):
        kth = np.sort(logits[:, t - 1], axis=-1)[:, -4]
        assert (logits[np.arange(2), t - 1, out[:, t]] >= kth).all()
    assert np.array_equal(sample(model, prompt, 10, top_k=1, seed=9), greedy(model, prompt, 10))
    assert np.array_equal(sample(model, prompt, 10, temperature=0.0, seed=9), greedy(model, prompt, 10))


def test_fixed_seed_gives_the_same_text(randomize, tiny):
    model = randomize(tiny(1, max_len=40, dtype=np.float32), seed=19, scale=0.5)
    prompt = encode("def f(x):")[None, :]
    a = sample(model, prompt, 25, temperature=1.0, top_p=0.95, seed=42)
    b = sample(model, prompt, 25, temperature=1.0, top_p=0.95, seed=42)
    c = sample(model, prompt, 25, temperature=1.0, top_p=0.95, seed=43)
    d = sample(model, prompt, 25, temperature=1.0, top_p=0.95, rng=np.random.default_rng(42))
    assert np.array_equal(a, b) and np.array_equal(a, d) and not np.array_equal(a, c)
    assert decode(a[0]).startswith("def f(x):")


def test_decoding_restores_the_training_mode_and_rejects_bad_input(tiny, tokens):
    model = tiny(1)
    model.train()
    greedy(model, tokens(1, 3), 2)
    assert model.training
    with pytest.raises(ValueError, match="temperature"):
        sample(model, tokens(1, 3), 2, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy(model, tokens(1, 3), -1)
    with pytest.raises(TypeError, match="prompt"):
        greedy(model, np.zeros((1, 3)), 2)


# --- checkpoints --------------------------------------------------------------------------------

def _train_steps(model, opt, n, tokens, seed=0):
    for i in range(n):
        x, y = tokens(2, 6, seed=seed + i), tokens(2, 6, seed=seed + 100 + i)
        model.zero_grad()
        loss, d = F.cross_entropy(model.forward(x), y)
        model.backward(d)
        opt.step()


def test_checkpoint_round_trip_and_resume(tmp_path, tiny, tokens):
    model = tiny(2, dtype=np.float32)
    opt = AdamW(model, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    _train_steps(model, opt, 3, tokens)
    path = tmp_path / "ck" / "tinygpt.npz"
    save_checkpoint(path, model, opt, step=3, extra={"note": "x"})
    assert [p.name for p in path.parent.iterdir()] == ["tinygpt.npz"]         # no temp file left
    other = tiny(2, dtype=np.float32, seed=99)
    opt2 = AdamW(other, lr=1.0, betas=(0.9, 0.95), weight_decay=0.1)
    meta = load_checkpoint(path, other, opt2)
    assert meta["step"] == 3 and meta["extra"] == {"note": "x"} and meta["config"] == model.config
    for (n, p, _), (_, q, _) in zip(model.named_parameters(), other.named_parameters()):
        assert np.array_equal(p, q), n
    assert opt2.t == 3 and opt2.lr == pytest.approx(1e-2)
    _train_steps(model, opt, 2, tokens, seed=50)
    _train_steps(other, opt2, 2, tokens, seed=50)
    x = tokens(2, 8, seed=7)
    np.testing.assert_array_equal(model.forward(x), other.forward(x))


def test_checkpoint_for_another_configuration_fails_clearly(tmp_path, tiny):
    path = tmp_path / "a.npz"
    save_checkpoint(path, tiny(1), step=1)
    with pytest.raises(ValueError, match=r"another configuration.*n_heads"):
        load_checkpoint(path, tiny(2))
    with pytest.raises(ValueError, match="d_model"):
        load_checkpoint(path, tiny(1, d_model=16))


# --- data ---------------------------------------------------------------------------------------

def test_encode_decode_and_units():
    s = "print('héllo') # ∑\n"
    arr = encode(s)
    assert arr.dtype == np.uint8 and arr.size == len(s.encode()) and decode(arr) == s
    assert bits_per_byte(np.log(2.0)) == pytest.approx(1.0, abs=1e-15)
    assert unigram_entropy(np.array([0, 1, 2, 3] * 5, np.uint8)) == pytest.approx(2.0, abs=1e-12)
    assert unigram_entropy(np.zeros(9, np.uint8)) == pytest.approx(0.0, abs=1e-12)
    assert unigram_entropy(encode("aab")) == pytest.approx(-(2 / 3) * np.log2(2 / 3) + np.log2(3) / 3)
    assert unigram_cross_entropy(np.zeros(10, np.uint8), np.zeros(4, np.uint8)) == \
        pytest.approx(-np.log2(11 / 266), abs=1e-12)
    with pytest.raises(ValueError, match="tokens"):
        decode(np.array([300]))


def test_batches_are_pure_functions_of_the_index(tmp_path):
    text = bytes(range(256)) * 20
    path = tmp_path / "t.bin"
    path.write_bytes(text)
    data = TextData.from_file(str(path), block_size=16, batch_size=4, val_fraction=0.25, seed=3)
    assert data.train.size + data.val.size == len(text) + 2                   # + one newline each
    assert bytes(data.train[:-1]) + bytes(data.val[:-1]) == text              # val is the tail
    x, y = data.batch(5)
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int64
    assert np.array_equal(x[:, 1:], y[:, :-1])
    assert (np.diff(x, axis=1) % 256 == 1).all()                             # contiguous windows
    x2, y2 = data.batch(5)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(x, data.batch(6)[0])
    assert not np.array_equal(x, TextData.from_file(str(path), 16, 4, 0.25, seed=4).batch(5)[0])
    xv, yv = data.windows("val")
    assert xv.shape[1] == 16 and np.array_equal(xv.ravel(), data.val[:xv.size])  # non-overlapping
    assert np.array_equal(xv[:, 1:], yv[:, :-1])
    assert data.windows("train", max_windows=3)[0].shape == (3, 16)
    with pytest.raises(ValueError, match="split"):
        data.batch(0, split="test")
    with pytest.raises(ValueError, match="documents"):
        TextData([("a", b"short")], block_size=16, batch_size=2)


def test_stdlib_corpus_is_read_deterministically():
    assert list(STDLIB_MODULES) == sorted(STDLIB_MODULES)
    docs = [("textwrap", module_source("textwrap")), ("string", module_source("string"))]
    a = TextData(docs, block_size=32, batch_size=2)
    b = TextData(docs, block_size=32, batch_size=2)
    assert np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)
    assert "def " in decode(a.train) and 3.0 < a.unigram_entropy() < 6.0
    with pytest.raises(ValueError, match="source"):
        module_source("sys")                                                  # built in: no .py file


def test_evaluate_loss_is_the_mean_over_all_positions(randomize, tiny, tokens):
    model = randomize(tiny(1, max_len=8, dtype=np.float64), seed=21)
    x, y = tokens(5, 8, seed=22), tokens(5, 8, seed=23)
    whole = F.cross_entropy(model.forward(x), y)[0]
    assert evaluate_loss(model, x, y, batch_size=2) == pytest.approx(whole, rel=1e-12)


# --- command line -------------------------------------------------------------------------------

def test_cli_run_and_generate(tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("def add(a, b):\n    return a + b\n\n" * 40)
    ck = str(tmp_path / "ck.npz")
    rc = cli(["run", "tinygpt", "--text", str(text), "--steps", "3", "--d-model", "16",
              "--n-heads", "2", "--n-layers", "1", "--max-len", "16", "--batch-size", "2",
              "--eval-windows", "2", "--eval-every", "2", "--checkpoint", ck, "--sample-tokens", "8",
              "--temperatures", "0.5,1", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and os.path.exists(ck)
    assert "unigram entropy" in out and "bits/byte" in out and "temperature 0.5" in out
    args = ["generate", "--checkpoint", ck, "--prompt", "def ", "--max-new-tokens", "12",
            "--seed", "3", "--top-k", "20", "--top-p", "0.9"]
    assert cli(args) == 0
    first = capsys.readouterr().out
    assert cli(args) == 0
    assert capsys.readouterr().out == first and first.startswith("def ")
    assert len(first.encode()) >= len("def ") + 1
    with pytest.raises(SystemExit) as e:
        cli(["generate", "--help"])
    assert e.value.code == 0
    assert "--top-p" in capsys.readouterr().out
