"""Module.flatten_parameters: one buffer of parameters, one of gradients; the optimizers' flat sweep."""
import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.nn.layers import FeedForward, Linear, Module
from tformer.models.tinygpt import TinyGPT
from tformer.training.optim import SGD, Adam, AdamW


def _step(model, opt, seed=0):
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 256, (3, 8)), rng.integers(0, 256, (3, 8))
    model.zero_grad()
    loss, d = F.cross_entropy(model.forward(x), y)
    model.backward(d)
    opt.step()
    return loss


def _unflattened(model):
    """The same model with its flat buffers forgotten: every parameter updated on its own."""
    object.__setattr__(model, "_flat", None)
    return model


def test_tinygpt_lives_in_flat_buffers_with_attributes_rebound():
    m = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=0)
    P, G = m.flat_buffers()
    assert P.size == m.num_parameters() == G.size
    lin = m.blocks[0].attn.qkv
    assert lin.W is lin.params["W"] and lin.W.base is P and lin.grads["W"].base is G
    assert m.ln_f.gamma is m.ln_f.params["gamma"] and (m.ln_f.gamma == 1).all()


def test_flattening_changes_no_value_and_no_output():
    a = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=1, dtype=np.float64)
    before = {k: v.copy() for k, v in a.state_dict().items()}
    tokens = np.random.default_rng(0).integers(0, 256, (2, 8))
    out_before = a.forward(tokens).copy()
    a.flatten_parameters()                        # a second time: copies into a new pair of buffers
    assert all(np.array_equal(before[k], v) for k, v in a.state_dict().items())
    assert np.array_equal(a.forward(tokens), out_before)


def test_a_deep_copy_of_a_flattened_model_is_flattened_with_the_same_values():
    import copy
    a = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=2)
    a.blocks[0].attn.qkv.freeze()
    _step(a, AdamW(a, lr=1e-2))                   # gradients that are not zero
    b = copy.deepcopy(a)
    (Pa, Ga), (Pb, Gb) = a.flat_buffers(), b.flat_buffers()
    assert Pb is not Pa and Gb is not Ga
    assert np.array_equal(Pa, Pb) and np.array_equal(Ga, Gb)
    assert b.blocks[0].attn.qkv.is_frozen("W") and b.blocks[0].attn.qkv.W.base is Pb
    assert (b.blocks[0].attn.qkv._frozen["W"] == 0).all()     # its place stays zero
    b.blocks[0].attn.qkv.W[0, 0] += 1.0           # its own arrays: a's are untouched
    assert a.blocks[0].attn.qkv.W[0, 0] != b.blocks[0].attn.qkv.W[0, 0]


@pytest.mark.parametrize("make_opt", [lambda m: AdamW(m, lr=1e-2), lambda m: Adam(m, lr=1e-2),
                                      lambda m: SGD(m, lr=0.1, momentum=0.9, weight_decay=0.01)])
def test_flat_sweep_equals_per_parameter_updates_bit_for_bit(make_opt):
    flat = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=2)
    per_param = _unflattened(TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=2))
    opt_flat, opt_pp = make_opt(flat), make_opt(per_param)
    assert opt_flat._flat is not None and opt_pp._flat is None
    for step in range(3):
        assert _step(flat, opt_flat, step) == _step(per_param, opt_pp, step)
    for (name, p, _), (_, q, _) in zip(flat.named_parameters(), per_param.named_parameters()):
        assert np.array_equal(p, q), name
    sd_flat, sd_pp = opt_flat.state_dict(), opt_pp.state_dict()
    for key, value in sd_pp.items():
        assert np.array_equal(np.asarray(sd_flat[key]), np.asarray(value)), key


def test_optimizer_state_loads_into_the_flat_views():
    m = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, seed=3)
    opt = AdamW(m, lr=1e-2)
    _step(m, opt)
    saved = opt.state_dict()
    m2 = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, seed=3)
    m2.load_state_dict(m.state_dict())
    opt2 = AdamW(m2, lr=1e-2)
    opt2.load_state_dict(saved)
    assert np.array_equal(opt2._flat[2]["m"], opt._flat[2]["m"])       # loaded into the flat arrays
    assert _step(m, opt, 1) == _step(m2, opt2, 1)
    assert all(np.array_equal(p, q) for (_, p, _), (_, q, _) in zip(m.named_parameters(), m2.named_parameters()))


def test_a_replaced_parameter_falls_back_to_per_parameter_updates():
    m = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, seed=4)
    m.lm_head.params["b"] = m.lm_head.b.copy()                 # no longer in the flat buffer
    assert m.flat_buffers() is None
    opt = AdamW(m)
    assert opt._flat is None
    _step(m, opt)                                              # still trains, parameter by parameter


def test_zero_grad_clears_the_flat_gradient_buffer():
    m = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, seed=5)
    _step(m, SGD(m, lr=0.0))
    assert np.abs(m.flat_buffers()[1]).sum() > 0
    m.zero_grad()
    assert not m.flat_buffers()[1].any()


def test_flatten_rejects_mixed_dtypes_and_empty_modules():
    class Mixed(Module):
        def __init__(self):
            super().__init__()
            self.a = Linear(2, 3, dtype=np.float32)
            self.b = Linear(3, 2, dtype=np.float64)
    with pytest.raises(ValueError, match="flatten_parameters: parameters must share one dtype"):
        Mixed().flatten_parameters()
    with pytest.raises(ValueError, match="flatten_parameters: the module has no parameters"):
        Module().flatten_parameters()
    ff = FeedForward(4, 8, "gelu", dtype=np.float64)
    P, _ = ff.flatten_parameters()
    assert ff.fc1.W.base is P and ff.flat_buffers() is not None


def test_parameter_attributes_are_declared_by_assignment():
    """``param_attributes`` names what the forward pass reads; flattening, mixed precision and the
    replicas of the cut batch rebind exactly these, whatever array they hold at the time."""
    lin = Linear(3, 2, seed=0)
    assert sorted(lin.param_attributes()) == [("W", "W"), ("b", "b")]
    model = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, vocab_size=32, seed=0,
                    tie_embeddings=True)
    assert ("W", "W") in model.lm_head.param_attributes()        # the tied head's view of W_te
    lin.W = np.zeros((3, 2))                                     # no longer the parameter
    assert lin.param_attributes() == [("b", "b")]
    lin.W = lin.params["W"]
    assert sorted(lin.param_attributes()) == [("W", "W"), ("b", "b")]


def test_the_flat_layout_names_each_parameters_slice():
    """``flat_layout()``: name -> (offset, shape), written once by ``flatten_parameters``: each
    parameter is ``P[offset:offset + size].reshape(shape)`` (writing there changes it) and its
    gradient the same slice of G; the slices tile P; a tied weight has one slice under both names."""
    m = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, vocab_size=32, seed=0,
                tie_embeddings=True)
    P, G = m.flat_buffers()
    layout = m.flat_layout()
    assert sorted(layout) == sorted(n for n, _, _ in m.named_parameters())
    assert layout["wte.W"] == layout["lm_head.W"]
    for name, p, g in m.named_parameters():
        at, shape = layout[name]
        assert shape == p.shape
        assert np.array_equal(P[at:at + p.size].reshape(shape), p)
        P[at] += 1.0                                             # the same memory
        G[at + p.size - 1] = 7.0
        assert p.reshape(-1)[0] == P[at] and g.reshape(-1)[-1] == 7.0
        P[at] -= 1.0
    places = sorted({layout[n][0]: p.size for n, p, _ in m.named_parameters()}.items())
    assert [a for a, _ in places] == list(np.cumsum([0] + [s for _, s in places])[:-1])
    assert sum(s for _, s in places) == P.size                   # the slices tile P


def test_the_layout_is_none_when_the_tree_no_longer_matches_it():
    m = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, seed=0)
    assert m.flat_layout() is not None and m.frozen_mask() is not None
    m.replace("lm_head", Linear(16, 256, seed=1))             # new arrays: not in the buffers
    assert m.flat_buffers() is None and m.flat_layout() is None and m.frozen_mask() is None
    b = FeedForward(4, 8, "gelu", dtype=np.float64)
    b.flatten_parameters()
    b.fc3 = b.fc2                                              # the same arrays under a new name
    assert b.flat_buffers() is not None and b.flat_layout() is None


def test_the_frozen_mask_marks_the_frozen_parameters_places():
    m = TinyGPT(d_model=16, n_heads=2, n_layers=2, max_len=8, seed=0)
    m.blocks[0].attn.freeze()
    m.lm_head.freeze("b")
    mask, layout = m.frozen_mask(), m.flat_layout()
    expect = np.zeros(mask.size, bool)
    for name, p, g in m.named_parameters():
        at, _ = layout[name]
        expect[at:at + p.size] = g is None
    assert np.array_equal(mask, expect)
    assert mask.sum() == sum(p.size for n, p, g in m.named_parameters() if g is None) > 0
    assert not m.flat_buffers()[1][mask].any()                 # their gradient places stay zero
