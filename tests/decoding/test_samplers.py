"""The samplers (tformer.decoding.samplers) as transformations of a distribution: what mass each keeps, its
limits (top_p = 1 and min_p = 0 keep everything, top_k = 1 and τ → 0 are greedy), their one order,
clear errors, and every filter and their composition against Hugging Face transformers' logits
processors in float64 (marked torch_parity: a skip fails the run, tests/conftest.py)."""
import decimal
import itertools
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tformer.decoding import generate, samplers
from tformer.decoding.samplers import (filter_logits, min_p_filter, probabilities, sample_from_logits,
                              top_k_filter, top_p_filter)

from properties_support import PROFILE

logit_rows = hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 12)),
                        elements=st.floats(-30, 30))


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@PROFILE
@given(z=logit_rows, k=st.integers(1, 14))
def test_top_k_keeps_the_k_largest_and_their_ties(z, k):
    kept = np.isfinite(top_k_filter(z, k))
    for row, keep in zip(z, kept):
        assert keep.sum() >= min(k, row.size)
        if not keep.all():
            assert row[keep].min() > row[~keep].max()                 # the largest, nothing else
            assert keep.sum() == (row >= np.sort(row)[-k]).sum()       # k, more only on a tie


@PROFILE
@given(z=logit_rows, p=st.floats(0.01, 1.0))
def test_top_p_keeps_the_smallest_nucleus_of_mass_p(z, p):
    pi, kept = softmax(z), np.isfinite(top_p_filter(z, p))
    for prob, keep in zip(pi, kept):
        assert prob[keep].sum() >= p - 1e-12                           # the mass reaches p
        if not keep.all():
            assert prob[keep].min() >= prob[~keep].max()               # the most probable
            assert prob[keep].sum() - prob[keep].min() < p + 1e-12     # and no token more


def test_top_p_near_one_keeps_the_exact_nucleus():
    """At p = 1 − 1e-12 over 8192 tokens the tokens at the boundary are about 1e-15, as small as the
    rounding of a running sum from the most probable token: a sum from the top keeps a token too
    many or too few in about half of these rows. The filter must keep exactly the nucleus that
    exact arithmetic keeps: the smallest prefix of the sorted tokens (ties by index) whose mass
    reaches p, in Python's decimal at 60 digits, on the float64 softmax renormalised exactly."""
    V, p = 8192, 1 - 1e-12
    z = np.random.default_rng(0).standard_normal((300, V)) * 8
    kept = np.isfinite(top_p_filter(z, p))
    wrong = 0
    with decimal.localcontext(prec=60):
        for prob, keep in zip(softmax(z), kept):
            order = np.argsort(-prob, kind="stable")
            mass = list(map(Decimal, prob[order].tolist()))
            limit = Decimal(p) * sum(mass)
            before = itertools.accumulate(mass[:-1], initial=Decimal(0))   # Σ_{i<j} π_(i)
            exact = np.array([b < limit for b in before])
            wrong += not np.array_equal(keep[order], exact)
    assert wrong == 0, f"{wrong} of {len(z)} rows differ from the exact nucleus"


@PROFILE
@given(z=logit_rows, m=st.floats(0.0, 1.0))
def test_min_p_keeps_the_tokens_of_at_least_min_p_times_the_largest(z, m):
    pi, kept = softmax(z), np.isfinite(min_p_filter(z, m))
    ratio = pi / pi.max(axis=-1, keepdims=True)
    assert kept[ratio >= m * (1 + 1e-9)].all() and not kept[ratio < m * (1 - 1e-9)].any()
    assert kept[np.arange(len(z)), z.argmax(axis=-1)].all()            # the argmax always stays


@PROFILE
@given(z=logit_rows)
def test_the_limits_keep_everything_or_only_the_argmax(z):
    tiny = z - 1e4 * (z < z.max(axis=-1, keepdims=True))              # probabilities below 1e-300
    for row in (z, tiny):
        assert np.array_equal(top_p_filter(row, 1.0), row)
        assert np.array_equal(min_p_filter(row, 0.0), row)
        assert np.array_equal(top_k_filter(row, row.shape[-1]), row)
        assert np.array_equal(filter_logits(row, 1.0), row)
    top = z == z.max(axis=-1, keepdims=True)
    assert np.array_equal(np.isfinite(top_k_filter(z, 1)), top)
    pi = softmax(z)                   # min_p = 1: the ties of the largest *probability*
    assert np.array_equal(np.isfinite(min_p_filter(z, 1.0)), pi == pi.max(axis=-1, keepdims=True))
    first = np.eye(z.shape[-1])[z.argmax(axis=-1)]
    assert np.array_equal(probabilities(z, temperature=0), first)
    draws = sample_from_logits(z, np.random.default_rng(0), temperature=1.0, top_k=1)
    assert top[np.arange(len(z)), draws].all()                         # top-k 1 draws the argmax


def test_a_falling_temperature_tends_to_the_argmax():
    z = np.random.default_rng(0).standard_normal((4, 50))
    s = np.sort(z, axis=-1)
    gap = (s[:, -1] - s[:, -2]).min()
    first = np.eye(50)[z.argmax(axis=-1)]
    for tau in (0.1, 0.03, 0.01):
        err = np.abs(probabilities(z, temperature=tau) - first).max()
        assert err <= 49 * np.exp(-gap / tau) + 1e-15     # Σ_{v ≠ argmax} e^{−(z_max − z_v)/τ}


def test_the_order_is_temperature_then_top_k_top_p_min_p():
    z = np.random.default_rng(1).standard_normal((3, 40)) * 2
    step = top_k_filter(z.astype(np.float64) / 0.7, 20)
    step = min_p_filter(top_p_filter(step, 0.8), 0.05)
    np.testing.assert_array_equal(filter_logits(z, 0.7, top_k=20, top_p=0.8, min_p=0.05), step)
    # the order matters: the nucleus of the tempered distribution is not the tempered nucleus
    flat = np.log(np.array([[0.5, 0.3, 0.2]]))
    after = np.isfinite(filter_logits(flat, 3.0, top_p=0.75)).sum()
    before = np.isfinite(top_p_filter(flat, 0.75)).sum()
    assert (before, after) == (2, 3)


def test_sampling_never_leaves_the_filtered_set_and_follows_its_distribution():
    z = np.log(np.array([[0.45, 0.25, 0.15, 0.1, 0.05]]))
    pi = probabilities(z, temperature=0.9, top_k=4, top_p=0.8, min_p=0.2)
    assert pi[0, 3:].sum() == 0 and (pi[0, :3] > 0).all() and abs(pi.sum() - 1) < 1e-15
    draws = sample_from_logits(np.repeat(z, 40_000, axis=0), np.random.default_rng(2),
                               temperature=0.9, top_k=4, top_p=0.8, min_p=0.2)
    freq = np.bincount(draws, minlength=5) / draws.size
    sd = np.sqrt(pi[0] * (1 - pi[0]) / draws.size)
    assert (np.abs(freq - pi[0]) <= 5 * sd + 1e-12).all()              # 5 σ: false alarm < 1e-5


@pytest.mark.parametrize("kw, words", [
    ({"top_p": 0.0}, "top_p: expected a probability mass in (0, 1], got 0.0"),
    ({"top_p": 1.5}, "top_p: expected a probability mass in (0, 1], got 1.5"),
    ({"top_p": float("nan")}, "top_p: expected a probability mass in (0, 1], got nan"),
    ({"top_p": "0.5"}, "top_p: expected a probability mass in (0, 1], got '0.5'"),
    ({"top_k": 0}, "top_k: expected an integer ≥ 1, got 0"),
    ({"top_k": 2.0}, "top_k: expected an integer ≥ 1, got 2.0"),
    ({"top_k": True}, "top_k: expected an integer ≥ 1, got True"),
    ({"min_p": -0.1}, "min_p: expected a fraction of the largest probability in [0, 1], got -0.1"),
    ({"min_p": 1.01}, "min_p: expected a fraction of the largest probability in [0, 1], got 1.01"),
    ({"min_p": float("nan")}, "min_p: expected a fraction of the largest probability in [0, 1]"),
    ({"temperature": float("inf")}, "temperature: expected a finite number ≥ 0, got inf"),
    ({"temperature": -1.0}, "temperature: expected a finite number ≥ 0, got -1.0"),
])
def test_bad_settings_name_the_argument_the_expected_and_the_actual(kw, words):
    from tformer.models.tinygpt import TinyGPT
    model = TinyGPT(d_model=8, n_heads=1, n_layers=1, max_len=8, vocab_size=5)
    for call in (lambda: sample_from_logits(np.zeros((1, 5)), np.random.default_rng(0), **kw),
                 lambda: probabilities(np.zeros((1, 5)), **kw),
                 lambda: generate.sample(model, np.zeros((1, 2), np.int64), 2, **kw)):
        with pytest.raises(ValueError) as e:
            call()
        assert words in str(e.value)


def test_generate_keeps_the_samplers_names():
    for name in ("top_k_filter", "top_p_filter", "min_p_filter", "sample_from_logits"):
        assert getattr(generate, name) is getattr(samplers, name)


# Hugging Face transformers, the reference (tests/conftest.py: a skipped parity test fails the run)

def _hf(torch, z, processors):
    scores = torch.tensor(z, dtype=torch.float64)
    for proc in processors:
        scores = proc(None, scores)
    return scores.numpy()


SETTINGS = [dict(temperature=0.7), dict(temperature=1.0, top_k=5), dict(temperature=1.0, top_k=100),
            dict(temperature=1.0, top_p=0.3), dict(temperature=1.0, top_p=0.9),
            dict(temperature=1.0, min_p=0.05), dict(temperature=1.0, min_p=0.5),
            dict(temperature=1.3, top_k=20, top_p=0.85, min_p=0.02),
            dict(temperature=0.5, top_k=10, top_p=0.6, min_p=0.2)]


@pytest.mark.torch_parity
@pytest.mark.parametrize("kw", SETTINGS, ids=[str(s) for s in SETTINGS])
def test_the_samplers_equal_hugging_face_logits_processors(torch, kw):
    lp = pytest.importorskip("transformers.generation.logits_process")
    # generate's own order (GenerationMixin._get_logits_processor): temperature, top-k, top-p, min-p
    procs = [lp.TemperatureLogitsWarper(float(kw["temperature"]))]
    if "top_k" in kw:
        procs.append(lp.TopKLogitsWarper(kw["top_k"]))
    if "top_p" in kw:
        procs.append(lp.TopPLogitsWarper(kw["top_p"]))
    if "min_p" in kw:
        procs.append(lp.MinPLogitsWarper(kw["min_p"]))
    for seed in range(5):
        z = np.random.default_rng(seed).standard_normal((4, 64)) * (1 + seed)
        ours, theirs = filter_logits(z, **kw), _hf(torch, z, procs)
        assert np.array_equal(np.isfinite(ours), np.isfinite(theirs))
        kept = np.isfinite(ours)
        np.testing.assert_allclose(ours[kept], theirs[kept], rtol=1e-15, atol=0)
        np.testing.assert_allclose(probabilities(z, **kw), softmax(theirs), rtol=0, atol=1e-14)


@pytest.mark.torch_parity
def test_the_one_difference_a_tie_across_the_nucleus_boundary(torch):
    """Both keep a token while the mass before it is below p, HF counting from the least likely
    side (it drops a token when the mass up to it from below is ≤ 1 − p). In exact arithmetic that
    is the same set; on a tie at the boundary tformer keeps the lower index, HF the higher: the
    same number of tokens and the same mass, another token."""
    lp = pytest.importorskip("transformers.generation.logits_process")
    z = np.log(np.array([[0.4, 0.3, 0.3]]))
    ours = np.isfinite(top_p_filter(z, 0.5))[0]
    theirs = np.isfinite(_hf(torch, z, [lp.TopPLogitsWarper(0.5)]))[0]
    assert ours.tolist() == [True, True, False] and theirs.tolist() == [True, False, True]
    p = softmax(z)[0]
    assert ours.sum() == theirs.sum() and abs(p[ours].sum() - p[theirs].sum()) < 1e-15
