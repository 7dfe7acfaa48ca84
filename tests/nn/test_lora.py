"""LoRA (tformer.nn.lora, tformer.training.lora_file): the adapter's gradients three ways, training only the
adapters, merging, the adapter file and its refusal of another base model, and bad input."""
import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.core import parallel
from tformer.training import batch_threads
from tformer.core.gradcheck import check_module, numerical_grad
from tformer.nn.layers import Linear
from tformer.nn.lora import (Adapters, LoRALinear, apply_lora, fingerprint, merge_lora,
                          resolve_targets)
from tformer.decoding import kv_cache
from tformer.training.lora_file import load_adapter, save_adapter
from tformer.models.tinygpt import TinyGPT
from tformer.training.batch_threads import BatchCut
from tformer.training.optim import AdamW, clip_grad_norm


def tiny(seed=0, dtype=np.float32):
    return TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=seed, dtype=dtype)


def tokens(B=4, T=8, seed=1):
    return np.random.default_rng(seed).integers(0, 256, (B, T))


def lora_layer(r=3, alpha=6.0, seed=0):
    """A float64 LoRALinear with a random (non-zero) B, so that every gradient is exercised."""
    layer = LoRALinear(Linear(5, 4, True, seed=seed, dtype=np.float64), r, alpha, seed=seed)
    layer.B[...] = np.random.default_rng([seed, 1]).standard_normal(layer.B.shape)
    layer.base.b[...] = np.random.default_rng([seed, 2]).standard_normal(4)
    return layer


def test_forward_is_x_times_w_plus_s_a_b():
    layer = lora_layer()
    x = np.random.default_rng(3).standard_normal((2, 3, 5))
    W, b, A, B = layer.base.W, layer.base.b, layer.A, layer.B
    np.testing.assert_allclose(layer(x), x @ (W + (6.0 / 3) * A @ B) + b, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(layer.merged_weight(), W + 2.0 * A @ B, rtol=1e-14, atol=1e-14)


def test_finite_differences_of_dA_dB_dX():
    """float64 central differences of ⟨G, Y⟩ with a random G; W and b stay without gradient."""
    layer = lora_layer()
    x = np.random.default_rng(4).standard_normal((2, 3, 5))
    errors = check_module(Adapters(layer), x)
    assert set(errors) == {"A", "B", "input"}
    assert max(errors.values()) < 1e-8, errors
    assert not layer.base.grads["W"].any() and not layer.base.grads["b"].any()


def test_backward_accumulates():
    layer = lora_layer()
    x = np.random.default_rng(5).standard_normal((3, 5))
    g = np.random.default_rng(6).standard_normal((3, 4))
    layer(x)
    layer.backward(g)
    once = {k: v.copy() for k, v in layer.grads.items()}
    layer(x)
    layer.backward(g)
    for k in ("A", "B"):
        np.testing.assert_allclose(layer.grads[k], 2 * once[k], rtol=1e-14, atol=1e-14)


def test_matches_pytorch_float64(torch):
    layer = lora_layer(r=2, alpha=5.0, seed=7)
    x = np.random.default_rng(8).standard_normal((2, 3, 5))
    g = np.random.default_rng(9).standard_normal((2, 3, 4))
    y = layer(x)
    dx = layer.backward(g)
    tx, tA, tB = (torch.tensor(a, requires_grad=True) for a in (x, layer.A, layer.B))
    tW, tb = torch.tensor(layer.base.W), torch.tensor(layer.base.b)
    ty = tx @ tW + tb + 2.5 * (tx @ tA) @ tB                     # s = α / r = 5 / 2
    ty.backward(torch.tensor(g))
    for ours, theirs in ((y, ty), (dx, tx.grad), (layer.grads["A"], tA.grad),
                         (layer.grads["B"], tB.grad)):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_b_zero_start_is_the_base_model_bit_for_bit():
    model = tiny()
    x = tokens()
    before = model.forward(x)
    apply_lora(model, 4, targets="all")
    assert np.array_equal(model.forward(x), before)


def test_targets_by_name_and_group():
    model = tiny()
    assert resolve_targets(model, "attn") == [f"blocks.{i}.attn.{n}" for i in (0, 1)
                                               for n in ("qkv", "o")]
    assert resolve_targets(model, ["fc2", "lm_head"]) == ["blocks.0.ffn.fc2", "blocks.1.ffn.fc2",
                                                          "lm_head"]
    assert len(resolve_targets(model, "all")) == 9


def test_model_gradients_of_the_adapters_by_finite_differences():
    """The whole adapted TinyGPT in float64: dL/dA and dL/dB against central differences."""
    model = tiny(dtype=np.float64)
    apply_lora(model, 2, 4.0, "all", seed=3)
    rng = np.random.default_rng(2)
    for _, p, _ in Adapters(model).named_parameters():
        p[...] = 0.1 * rng.standard_normal(p.shape)
    x, y = tokens(2, 8, 3), tokens(2, 8, 4)

    def loss():
        return F.cross_entropy(model.forward(x), y)[0]
    model.zero_grad()
    model.backward(F.cross_entropy(model.forward(x), y)[1])
    for name, p, g in Adapters(model).named_parameters():
        num, idx = numerical_grad(loss, p, rng=np.random.default_rng(5), max_entries=6)
        np.testing.assert_allclose(g.reshape(-1)[idx], num, rtol=1e-6, atol=1e-9, err_msg=name)


@pytest.fixture
def threads(monkeypatch):
    before = parallel.get_num_threads()
    monkeypatch.setattr(batch_threads, "MIN_PART_MACS", 0)             # cut even a tiny batch
    yield parallel.set_num_threads
    parallel.set_num_threads(before)


def adapter_grads(model, x, y):
    model.zero_grad()
    model.backward(F.cross_entropy(model.forward(x), y)[1])
    return {n: g.copy() for n, _, g in Adapters(model).named_parameters()}


def test_gradients_on_one_and_two_threads(threads):
    """The adapted model keeps one flat buffer, so the batch is cut across two threads; the
    adapters' gradients agree with one thread's to rounding (float64)."""
    model = tiny(dtype=np.float64)
    apply_lora(model, 3, targets="all", seed=1)
    for _, p, _ in Adapters(model).named_parameters():
        p[...] = np.random.default_rng(p.size).standard_normal(p.shape) * 0.1
    x, y = tokens(4, 8, 5), tokens(4, 8, 6)
    threads(1)
    one = adapter_grads(model, x, y)
    threads(2)
    net = BatchCut(model)                                         # as tformer.training.train runs it
    net.forward(x)
    assert net.replicas.last is not None                          # the batch was cut
    two = adapter_grads(net, x, y)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_training_leaves_the_base_weights_bit_for_bit(threads, n_threads):
    threads(n_threads)
    model = tiny()
    base = {n: p.copy() for n, p, _ in model.named_parameters()}
    fp = fingerprint(model)
    apply_lora(model, 2, 4.0, "all")
    view = Adapters(model)
    opt = AdamW(view, lr=1e-2, weight_decay=0.1)
    start = view.state_dict()
    for step in range(3):
        model.zero_grad()
        model.backward(F.cross_entropy(model.forward(tokens(seed=step)), tokens(seed=9 + step))[1])
        clip_grad_norm(view, 1.0)
        opt.step()
    assert set(opt.state) == {n for n, _, _ in view.named_parameters()}
    assert all(not np.array_equal(p, start[n]) for n, p, _ in view.named_parameters())
    after = {n.replace(".base.", "."): p for n, p, _ in model.named_parameters()
             if not n.endswith((".A", ".B"))}
    assert after.keys() == base.keys()
    assert all(np.array_equal(after[n], base[n]) for n in base)
    assert fingerprint(model) == fp


def test_merge_gives_the_same_logits_and_a_plain_model():
    model = tiny()
    apply_lora(model, 4, 8.0, "all")
    rng = np.random.default_rng(0)
    for _, p, _ in Adapters(model).named_parameters():
        p += 0.05 * rng.standard_normal(p.shape).astype(p.dtype)
    x = tokens()
    unmerged = model.forward(x)
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert model.num_parameters() == tiny().num_parameters() and model.flat_buffers() is not None
    assert all(c.lean for c in kv_cache.new_caches(model, 1))  # merged: TinyGPT's row paths
    np.testing.assert_allclose(model.forward(x), unmerged, rtol=1e-5, atol=1e-5)


def test_adapter_file_round_trip_and_another_base_refused(tmp_path):
    model = tiny()
    apply_lora(model, 2, targets=["qkv", "fc1"])
    for _, p, _ in Adapters(model).named_parameters():
        p += 0.1
    path = save_adapter(tmp_path / "a.npz", model)
    x = tokens()
    other = tiny()                                                 # the same base
    meta = load_adapter(path, other)
    assert meta["r"] == 2 and meta["targets"] == ["qkv", "fc1"]
    assert np.array_equal(other.forward(x), model.forward(x))
    with np.load(path) as z:                                       # A, B and the meta only
        assert all(k.startswith("lora/") and k.endswith((".A", ".B")) for k in z.files
                   if k != "meta")
    with pytest.raises(ValueError, match=r"path: the adapter .* another base model"):
        load_adapter(path, tiny(seed=1))


def test_a_checkpoint_is_not_an_adapter_file(tmp_path):
    from tformer.training.checkpoint import save_checkpoint
    path = save_checkpoint(tmp_path / "c.npz", tiny())
    with pytest.raises(ValueError, match="path: .* is not a LoRA adapter file"):
        load_adapter(path, tiny())


@pytest.mark.parametrize("kwargs, error, match", [
    ({"r": 0}, ValueError, r"r: expected an integer ≥ 1, got 0"),
    ({"r": 2.5}, TypeError, r"r: expected an integer ≥ 1, got float 2.5"),
    ({"r": 2, "alpha": 0.0}, ValueError, r"alpha: expected a finite number > 0, got 0.0"),
    ({"r": 2, "targets": ["qkv", "wq"]}, ValueError, r"targets: expected names among .*'qkv'.*got wq"),
    ({"r": 2, "targets": []}, ValueError, r"targets: expected names among"),
])
def test_bad_input_names_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        apply_lora(tiny(), **kwargs)


def test_adapters_of_a_model_without_any():
    with pytest.raises(ValueError, match="model: has no LoRA adapters"):
        Adapters(tiny())


def test_gradient_checkpointing_gives_the_same_adapter_gradients():
    """Recomputed segments re-run the adapters' forward: the same gradients, bit for bit."""
    x, y = tokens(3, 8, 7), tokens(3, 8, 8)
    grads = []
    for checkpointing in (False, True):
        model = TinyGPT(d_model=16, n_heads=2, n_layers=3, max_len=8, dtype=np.float64,
                        gradient_checkpointing=checkpointing)
        apply_lora(model, 2, targets="all")
        for _, p, _ in Adapters(model).named_parameters():
            p[...] = 0.1 * np.random.default_rng(p.size).standard_normal(p.shape)
        grads.append(adapter_grads(model, x, y))
    assert all(np.array_equal(grads[0][n], grads[1][n]) for n in grads[0])


def test_the_fingerprint_of_the_adapters_view_is_the_base_models():
    """``fingerprint`` hashes the base weights whether it is handed the model or its ``Adapters``
    view (whose named_parameters yield A and B alone): an adapter file saved from the view
    names the base it was trained on."""
    from tformer.nn.lora import Adapters, apply_lora, fingerprint
    from tformer.models.tinygpt import TinyGPT
    model = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, vocab_size=32, seed=0)
    before = fingerprint(model)
    apply_lora(model, 2, targets="attn", seed=0)
    assert fingerprint(model) == fingerprint(Adapters(model)) == before
    assert before != fingerprint(TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8,
                                         vocab_size=32, seed=1))


def test_lora_swaps_its_layers_through_module_replace(monkeypatch):
    """``apply_lora`` and ``merge_lora`` find the linear layers with ``Module.named_layers`` and
    swap each with ``Module.replace``: one call per adapted layer, and nothing else moves."""
    from tformer.nn.layers import Module
    from tformer.nn.lora import linear_layers
    calls = []
    real = Module.replace
    monkeypatch.setattr(Module, "replace", lambda self, path, new: calls.append(path) or real(self, path, new))
    model = tiny()
    assert [p for p, _ in linear_layers(model)] == [p for p, m in model.named_modules()
                                                    if isinstance(m, Linear)]
    paths = apply_lora(model, 2, targets="attn")
    assert calls == paths and len(paths) == 4                   # qkv and o of two blocks
    assert [p for p, _ in linear_layers(model)] == [p for p, m in model.named_modules()
                                                    if isinstance(m, (Linear, LoRALinear))
                                                    and not p.endswith(".base")]
    calls.clear()
    merge_lora(model)
    assert calls == paths


def test_lora_keeps_its_own_dY_W_transposed_where_bfloat16_rounds_otherwise():
    """LoRA forms dY Wᵀ with ``@`` (its bits, kept): in bfloat16 ``@`` returns float32 where the
    frozen base's backward (``fast.linear.linear_backward_without_dW``) rounds to bfloat16; in
    float32 and float64 the two are the same product, bit for bit."""
    from tformer.core.dtypes import bfloat16
    from tformer.fast import linear as fast_linear
    rng = np.random.default_rng(0)
    for dt, same in ((np.float64, True), (np.float32, True), (bfloat16, False)):
        x, dy = rng.standard_normal((6, 5)).astype(dt), rng.standard_normal((6, 4)).astype(dt)
        W = rng.standard_normal((5, 4)).astype(dt)
        ours = dy @ W.T
        kernel, _ = fast_linear.linear_backward_without_dW(dy, (x, W, False))
        assert (ours.dtype == kernel.dtype and np.array_equal(ours, kernel)) == same
        assert np.abs(ours.astype(np.float64) - kernel.astype(np.float64)).max() < 0.05
