"""Bad or edge-case input to the single attention layer, the two-layer transformer, the post-LN
encoder and the complete Transformer (and TinyGPT, for the cases it shares),
their decoders and their run commands: each raises a ValueError/TypeError that names the argument
with what was expected and what came, or behaves as the docstring says.

Decided here (and written in the docstrings):
- Every model refuses an empty batch (B = 0) or empty sequences (T = 0) with ValueError naming
  its input (``x`` or ``tokens``), as TinyGPT does: there is nothing to predict, and a mean loss
  over no targets is undefined. The layers and kernels underneath keep NumPy's empty in, empty out.
- Float-row models (AttentionLayer, TwoLayerTransformer, Encoder): ``x`` must be a 3-axis float
  array of the model's dtype, with last axis d_model and no NaN or ±inf. AttentionLayer and
  TwoLayerTransformer have no positional table and take any T ≥ 1; the Encoder takes T ≤ max_len.
- Token models (Transformer, TinyGPT): ``tokens`` must be a 2-axis integer array with ids in
  [0, V) and T ≤ max_len.
- Masks (Encoder ``mask``, Transformer ``padding_mask``) must broadcast to the scores (B, H, T, T);
  the Encoder's may be additive float (no NaN or +inf), the Transformer's is boolean. A query
  whose keys are all masked gets zero attention output, so the result stays finite.
- ``backward`` needs a forward pass first (RuntimeError) and an upstream gradient of the last
  output's shape and dtype.
- ``beam_search`` also refuses prompt ids or a ``stop_token`` outside the vocabulary and a
  ``length_penalty`` that is not a finite number ≥ 0; greedy decoding of the Transformer crops a
  prompt longer than max_len on the left, as for TinyGPT.
- Run commands: a bad flag value is argparse's usage error naming the flag (exit status 2).
"""
import re

import numpy as np
import pytest

from tformer.decoding import beam, generate
from tformer.__main__ import main as cli
from tformer.models import AttentionLayer, Encoder, TinyGPT, Transformer, TwoLayerTransformer

D = 8            # d_model of every small model here
MAX_LEN = 6      # max_len of the Encoder, the Transformer and TinyGPT
V = 11           # the Transformer's vocabulary

FLOAT_MODELS = {
    "attention_layer": lambda: AttentionLayer(d_model=D, seed=0),
    "two_layer": lambda: TwoLayerTransformer(d_model=D, seed=0),
    "two_layer_no_mlp": lambda: TwoLayerTransformer(d_model=D, use_mlp=False, seed=0),
    "encoder": lambda: Encoder(d_model=D, n_heads=2, n_layers=1, d_ff=16, max_len=MAX_LEN, seed=0),
}
TOKEN_MODELS = {
    "transformer": lambda: Transformer(vocab_size=V, d_model=D, n_heads=2, n_layers=1, d_ff=16,
                                       max_len=MAX_LEN, dropout=0.0, seed=0),
    "transformer_flash": lambda: Transformer(vocab_size=V, d_model=D, n_heads=2, n_layers=1, d_ff=16,
                                             max_len=MAX_LEN, dropout=0.0, seed=0, attention="flash"),
    "tinygpt": lambda: TinyGPT(d_model=D, n_heads=2, n_layers=1, max_len=MAX_LEN, vocab_size=V, seed=0),
}
GRAD_NAME = {"attention_layer": "dy", "two_layer": "dy", "two_layer_no_mlp": "dy",
             "encoder": "dout", "transformer": "dlogits", "transformer_flash": "dlogits"}


def shape_re(shape):
    return re.escape(repr(tuple(shape)))


@pytest.fixture(params=sorted(FLOAT_MODELS))
def float_model(request):
    return request.param, FLOAT_MODELS[request.param]()


@pytest.fixture(params=sorted(TOKEN_MODELS))
def token_model(request):
    return request.param, TOKEN_MODELS[request.param]()


def rows(B=2, T=4, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype(dtype)


def ids(B=2, T=4, seed=0):
    return np.random.default_rng(seed).integers(1, V, size=(B, T))


# -- models that read float rows: AttentionLayer, TwoLayerTransformer, Encoder -----------------------

@pytest.mark.parametrize("name", sorted({**FLOAT_MODELS, **TOKEN_MODELS}))
@pytest.mark.parametrize("B,T", [(0, 4), (2, 0), (0, 0)])
def test_every_model_refuses_an_empty_batch_or_empty_sequences(name, B, T):
    """The same decision for all seven: ValueError naming the input, with the shape that came."""
    if name in TOKEN_MODELS:
        model, arg, unit, x = TOKEN_MODELS[name](), "tokens", "token", np.zeros((B, T), np.int64)
    else:
        model, arg, unit, x = FLOAT_MODELS[name](), "x", "position", np.zeros((B, T, D), np.float32)
    with pytest.raises(ValueError, match=rf"{arg}: expected at least one sequence \(B ≥ 1\) of at "
                                         rf"least one {unit} \(T ≥ 1\), got shape {shape_re(x.shape)}"):
        model.forward(x)


@pytest.mark.parametrize("bad,kind,message", [
    (np.zeros((2, 4, D), np.int64), TypeError, r"x: expected dtype float32, float64, .*got int64"),
    ([[[0.0] * D]], TypeError, r"x: expected a NumPy float32/float64 array, got list"),
    (np.zeros((4, D), np.float32), ValueError, r"x: expected 3 dimensions, got shape \(4, 8\)"),
    (np.zeros((1, 2, 4, D), np.float32), ValueError, r"x: expected 3 dimensions, got shape \(1, 2, 4, 8\)"),
    (np.zeros((2, 4, D + 1), np.float32), ValueError, r"x: expected last axis d_model = 8, got shape \(2, 4, 9\)"),
    (np.zeros((2, 4, D), np.float64), TypeError, r"x: expected dtype float32 \(the model's\), got float64"),
])
def test_float_models_name_x_with_what_was_expected(float_model, bad, kind, message):
    _, model = float_model
    with pytest.raises(kind, match=message):
        model.forward(bad)


@pytest.mark.parametrize("value,counts", [(np.nan, "1 NaN and 0 ±inf"), (np.inf, "0 NaN and 1 ±inf"),
                                          (-np.inf, "0 NaN and 1 ±inf")])
def test_float_models_refuse_non_finite_rows_instead_of_passing_nan_on(float_model, value, counts):
    _, model = float_model
    x = rows()
    x[1, 2, 3] = value
    with pytest.raises(ValueError, match=f"x: expected finite values, got {counts} entries"):
        model.forward(x)


def test_float_models_follow_their_dtype():
    """The dtype check compares with the model's own dtype, not with float32."""
    for make in (lambda: AttentionLayer(d_model=D, dtype=np.float64),
                 lambda: TwoLayerTransformer(d_model=D, dtype=np.float64),
                 lambda: Encoder(d_model=D, n_heads=2, n_layers=1, d_ff=16, max_len=MAX_LEN,
                                 dtype=np.float64)):
        model = make()
        y = model.forward(rows(dtype=np.float64))
        assert y.dtype == np.float64 and np.isfinite(y).all()
        with pytest.raises(TypeError, match=r"x: expected dtype float64 \(the model's\), got float32"):
            model.forward(rows())


@pytest.mark.parametrize("name", ["attention_layer", "two_layer", "two_layer_no_mlp"])
def test_models_without_a_positional_table_take_any_length(name):
    model = FLOAT_MODELS[name]()
    y = model.forward(rows(B=1, T=40))
    assert y.shape == (1, 40, D) and np.isfinite(y).all()
    # B = 1, T = 1 is the smallest input: one position attends to itself only
    y1 = model.forward(rows(B=1, T=1))
    assert y1.shape == (1, 1, D) and np.isfinite(y1).all()


def test_encoder_refuses_more_positions_than_its_table():
    model = FLOAT_MODELS["encoder"]()
    assert model.forward(rows(T=MAX_LEN)).shape == (2, MAX_LEN, D)
    with pytest.raises(ValueError, match=f"x: {MAX_LEN + 1} positions exceed max_len = {MAX_LEN}"):
        model.forward(rows(T=MAX_LEN + 1))


@pytest.mark.parametrize("mask,kind,message", [
    (np.ones((3, 4), bool), ValueError, r"mask: expected a shape that broadcasts to the scores "
                                        r"\(B, H, T, T\) = \(2, 2, 4, 4\), e\.g\. \(B, 1, 1, T\) = "
                                        r"\(2, 1, 1, 4\); got \(3, 4\)"),
    (np.ones((2, 4), bool), ValueError, r"mask: .*got \(2, 4\)"),
    (np.ones((4, 2, 1, 1, 4), bool), ValueError, r"mask: .*got \(4, 2, 1, 1, 4\)"),
    (np.ones((2, 1, 1, 4), np.int64), TypeError, r"mask: expected a boolean or float NumPy array, got int64"),
    ([[True] * 4], TypeError, r"mask: expected a boolean or float NumPy array, got list"),
    (np.full((2, 1, 1, 4), np.nan, np.float32), ValueError, r"mask: an additive mask must hold no NaN or \+inf"),
    (np.full((2, 1, 1, 4), np.inf, np.float32), ValueError, r"mask: an additive mask must hold no NaN or \+inf"),
])
def test_encoder_mask_of_the_wrong_shape_or_kind(mask, kind, message):
    model = FLOAT_MODELS["encoder"]()
    with pytest.raises(kind, match=message):
        model.forward(rows(), mask)


def test_encoder_mask_that_would_enlarge_the_batch_is_refused():
    """(3, 1, 1, T) broadcasts *with* scores of B = 1, but not *to* them: it would make 3 outputs."""
    model = FLOAT_MODELS["encoder"]()
    with pytest.raises(ValueError, match=r"mask: .*\(1, 2, 4, 4\).*got \(3, 1, 1, 4\)"):
        model.forward(rows(B=1), np.ones((3, 1, 1, 4), bool))


def test_encoder_masks_that_fit_give_finite_output_even_when_a_row_is_all_masked():
    model = FLOAT_MODELS["encoder"]()
    x = rows()
    keep = np.array([[True, True, False, False], [False, False, False, False]])[:, None, None, :]
    additive = np.where(keep, 0.0, -np.inf).astype(np.float32)
    y_bool, y_add = model.forward(x, keep), model.forward(x, additive)
    assert np.isfinite(y_bool).all()
    np.testing.assert_allclose(y_add, y_bool, rtol=0, atol=1e-6)   # the two kinds mean the same
    y_full = model.forward(x, np.broadcast_to(keep, (2, 2, 4, 4)).copy())
    np.testing.assert_array_equal(y_full, y_bool)


# -- backward: after a forward pass, with the output's shape and dtype ----------------------------

def _models_with_grads():
    return sorted(GRAD_NAME)


def _forward(name, model):
    if name in TOKEN_MODELS:
        return model.forward(ids())
    return model.forward(rows())


@pytest.mark.parametrize("name", _models_with_grads())
def test_backward_before_any_forward_pass_is_a_runtime_error(name):
    model = {**FLOAT_MODELS, **TOKEN_MODELS}[name]()
    out_shape = (2, 4, V if name in TOKEN_MODELS else D)
    with pytest.raises(RuntimeError, match="backward: no forward pass to differentiate"):
        model.backward(np.ones(out_shape, np.float32))


@pytest.mark.parametrize("name", _models_with_grads())
def test_backward_names_its_gradient_of_the_wrong_shape_or_dtype(name):
    model = {**FLOAT_MODELS, **TOKEN_MODELS}[name]()
    y = _forward(name, model)
    g = GRAD_NAME[name]
    with pytest.raises(ValueError, match=f"{g}: expected shape {shape_re(y.shape)} .*got "
                                         + shape_re((1, *y.shape[1:]))):
        model.backward(np.ones((1, *y.shape[1:]), y.dtype))
    with pytest.raises(TypeError, match=f"{g}: expected dtype float32 .*got float64"):
        model.backward(np.ones(y.shape, np.float64))
    with pytest.raises(TypeError, match=f"{g}: expected a NumPy"):
        model.backward(y.tolist())
    model.backward(np.ones_like(y))          # the right one still works after the refusals


# -- token models: Transformer (plain and flash), TinyGPT ------------------------------------------

@pytest.mark.parametrize("bad,kind,message", [
    (np.ones((2, 4), np.float32), TypeError, r"tokens: expected an integer NumPy array, got float32"),
    ([[1, 2, 3]], TypeError, r"tokens: expected an integer NumPy array, got list"),
    (np.ones((4,), np.int64), ValueError, r"tokens: expected 2 dimensions, got shape \(4,\)"),
    (np.ones((2, 4, 1), np.int64), ValueError, r"tokens: expected 2 dimensions, got shape \(2, 4, 1\)"),
    (np.full((2, 4), V), ValueError, rf"tokens: expected values in \[0, {V}\), got min {V} and max {V}"),
    (np.full((2, 4), -1), ValueError, rf"tokens: expected values in \[0, {V}\), got min -1 and max -1"),
    (np.ones((1, MAX_LEN + 1), np.int64), ValueError, rf"tokens: {MAX_LEN + 1} positions exceed max_len = {MAX_LEN}"),
])
def test_token_models_name_tokens_with_what_was_expected(token_model, bad, kind, message):
    _, model = token_model
    with pytest.raises(kind, match=message):
        model.forward(bad)


def test_token_models_take_exactly_max_len_positions(token_model):
    _, model = token_model
    z = model.forward(ids(T=MAX_LEN))
    assert z.shape == (2, MAX_LEN, V) and np.isfinite(z).all()


@pytest.mark.parametrize("attention", ["plain", "flash"])
@pytest.mark.parametrize("mask,kind,message", [
    (np.ones((2, 4), bool), ValueError, r"padding_mask: expected a shape that broadcasts to the scores "
                                        r"\(B, H, T, T\) = \(2, 2, 4, 4\), e\.g\. \(B, 1, 1, T\) = "
                                        r"\(2, 1, 1, 4\); got \(2, 4\)"),
    (np.ones((3, 1, 1, 4), bool), ValueError, r"padding_mask: .*got \(3, 1, 1, 4\)"),
    (np.ones((2, 1, 1, 5), bool), ValueError, r"padding_mask: .*got \(2, 1, 1, 5\)"),
    (np.ones((2, 1, 1, 4), np.int64), TypeError, r"padding_mask: expected a boolean NumPy array, got int64"),
    (np.zeros((2, 1, 1, 4), np.float32), TypeError, r"padding_mask: expected a boolean NumPy array, got float32"),
])
def test_transformer_padding_mask_of_the_wrong_shape_or_kind(attention, mask, kind, message):
    model = TOKEN_MODELS["transformer_flash" if attention == "flash" else "transformer"]()
    with pytest.raises(kind, match=message):
        model.forward(ids(), mask)


@pytest.mark.parametrize("name", ["transformer", "transformer_flash"])
def test_transformer_given_padding_mask_equals_the_default_and_all_padding_stays_finite(name):
    model = TOKEN_MODELS[name]()
    model.eval()
    tokens = ids()
    tokens[0, 2:] = 0                                            # PAD at the end of row 0
    tokens[1, :] = 0                                             # row 1 is padding only
    default = model.forward(tokens)
    given = model.forward(tokens, tokens[:, None, None, :] != 0)
    np.testing.assert_array_equal(given, default)
    assert np.isfinite(default).all()


# -- decoding the Transformer: greedy (generate.py) and beam search (beam.py) --------------------------

@pytest.fixture(scope="module")
def transformer():
    return TOKEN_MODELS["transformer"]()


def test_greedy_crops_a_long_prompt_for_the_transformer_too(transformer):
    long = ids(B=2, T=MAX_LEN + 3, seed=4)
    out = generate.greedy(transformer, long, 2)
    assert out.shape == (2, MAX_LEN + 5)
    want = transformer.forward(long[:, -MAX_LEN:])[:, -1].argmax(axis=-1)
    np.testing.assert_array_equal(out[:, MAX_LEN + 3], want)


@pytest.mark.parametrize("kwargs,kind,message", [
    (dict(prompt=np.zeros((0, 2), np.int64)), ValueError, r"prompt: expected at least one row"),
    (dict(prompt=np.full((1, 2), V)), ValueError, rf"prompt: expected values in \[0, {V}\), got min {V}"),
    (dict(prompt=np.ones((1, 2), np.float32)), TypeError, r"prompt: expected an integer NumPy array"),
    (dict(stop_token=V), ValueError, rf"stop_token: expected None or a token id in \[0, {V}\), got {V}"),
    (dict(stop_token=1.5), ValueError, r"stop_token: expected None or a token id"),
    (dict(length_penalty="0.6"), TypeError, r"length_penalty: expected a number α ≥ 0, got str"),
    (dict(length_penalty=float("nan")), ValueError, r"length_penalty: expected a finite α ≥ 0, got nan"),
    (dict(max_new_tokens=MAX_LEN), ValueError, rf"prompt, max_new_tokens: .*max_len = {MAX_LEN}"),
])
def test_beam_search_of_the_transformer_names_the_bad_argument(transformer, kwargs, kind, message):
    args = dict(prompt=np.ones((1, 2), np.int64), beam_width=2, max_new_tokens=3, length_penalty=0.6,
                stop_token=3)
    args.update(kwargs)
    with pytest.raises(kind, match=message):
        beam.beam_search(transformer, args.pop("prompt"), args.pop("beam_width"),
                         args.pop("max_new_tokens"), **args)


def test_beam_search_of_the_transformer_with_good_arguments(transformer):
    out = beam.beam_search(transformer, np.ones((2, 2), np.int64), 2, MAX_LEN - 1, 0.6, stop_token=3)
    assert out.shape[0] == 2 and 3 <= out.shape[1] <= MAX_LEN + 1
    assert out.min() >= 0 and out.max() < V


@pytest.mark.parametrize("prompt,conts,kind,message", [
    (np.array([1, 2]), np.ones((3, 2), np.float32), TypeError, r"continuations: expected an integer"),
    (np.array([1, 2]), np.ones((3,), np.int64), ValueError, r"continuations: expected 2 dimensions"),
    (np.array([[1, 2]]), np.ones((3, 2), np.int64), ValueError, r"prompt: expected 1 dimensions"),
    (np.array([1, 2]), np.full((3, 2), V), ValueError, rf"continuations: expected values in \[0, {V}\)"),
    (np.array([1, -2]), np.ones((3, 2), np.int64), ValueError, rf"prompt: expected values in \[0, {V}\)"),
    (np.array([1, 2]), np.ones((0, 2), np.int64), ValueError, r"prompt, continuations: expected T0 ≥ 1"),
])
def test_sequence_scores_checks_its_arrays(transformer, prompt, conts, kind, message):
    with pytest.raises(kind, match=message):
        beam.sequence_scores(transformer, prompt, conts)


def test_exhaustive_search_wants_one_prompt():
    table = beam.MarkovTable(np.log(np.full((3, 3), 1 / 3)))
    with pytest.raises(ValueError, match=r"prompt: expected 1 dimensions, got shape \(1, 2\)"):
        beam.exhaustive_search(table, np.array([[0, 1]]), 2)
    with pytest.raises(ValueError, match=r"stop_token: expected None or a token id in \[0, 3\)"):
        beam.exhaustive_search(table, np.array([0, 1]), 2, stop_token=5)


# -- the run commands: a bad value is a usage error naming the flag --------------------------------

@pytest.mark.parametrize("argv,message", [
    ("run transformer --min-len 0", r"argument --min-len: expected an integer ≥ 1, got '0'"),
    ("run transformer --max-len -2", r"argument --max-len: expected an integer ≥ 1, got '-2'"),
    ("run transformer --min-len 5 --max-len 3", r"--min-len: expected at most --max-len = 3, got 5"),
    ("run transformer --n-symbols 1", r"argument --n-symbols: expected an integer ≥ 2, got '1'"),
    ("run transformer --d-model 6 --n-heads 4", r"--n-heads: must divide --d-model = 6, got 4"),
    ("run transformer --d-model 9 --n-heads 3", r"--d-model: expected an even width"),
    ("run transformer --dropout 1", r"argument --dropout: expected a probability in \[0, 1\), got '1'"),
    ("run transformer --steps 0", r"argument --steps: expected an integer ≥ 1, got '0'"),
    ("run transformer --batch-size x", r"argument --batch-size: expected an integer ≥ 1, got 'x'"),
    ("run transformer --lr nan", r"argument --lr: expected a finite number ≥ 0, got 'nan'"),
    ("run transformer --beam-width 0", r"argument --beam-width: expected an integer ≥ 1, got '0'"),
    ("run transformer --length-penalty -1", r"argument --length-penalty: expected a finite number ≥ 0"),
    ("run transformer --target -0.5", r"argument --target: expected a share in \[0, 1\], got '-0.5'"),
    ("run transformer --batching bucketed --max-tokens 17",
     r"--max-tokens: expected at least one row of 2·--max-len \+ 2 = 18 positions, got 17"),
    ("run attention --seq-len 0", r"argument --seq-len: expected an integer ≥ 1, got '0'"),
    ("run attention --eps 0", r"argument --eps: expected a finite number > 0, got '0'"),
    ("run transformer2 --d-ff 0", r"argument --d-ff: expected an integer ≥ 1, got '0'"),
    ("run transformer2 --seed -1", r"argument --seed: expected an integer ≥ 0, got '-1'"),
    ("run encoder --n-heads 3", r"--n-heads: must divide --d-model = 64, got 3"),
    ("run encoder --heads 3", r"--n-heads: must divide --d-model = 64, got 3"),    # old spelling
    ("run encoder --seq-len 0", r"argument --seq-len: expected an integer ≥ 1, got '0'"),
    ("run encoder --steps -5", r"argument --steps: expected an integer ≥ 1, got '-5'"),
    ("run encoder --epochs -5", r"argument --epochs: expected an integer ≥ 1, got '-5'"),
    ("run tinygpt --steps 0", r"argument --steps: expected an integer ≥ 1, got '0'"),
    ("run tinygpt --lr -1", r"argument --lr: expected a finite number ≥ 0, got '-1'"),
    ("run tinygpt --batch-size x", r"argument --batch-size: expected an integer ≥ 1, got 'x'"),
    ("run tinygpt --d-model 30 --n-heads 4", r"--n-heads: must divide --d-model = 30, got 4"),
    ("run tinygpt --n-kv-heads 3", r"--n-kv-heads: must divide --n-heads = 4, got 3"),
    ("run tinygpt --val-fraction 0", r"--val-fraction: expected a share in \(0, 1\), got 0.0"),
    ("run tinygpt --init-scale 0", r"argument --init-scale: expected a finite number > 0"),
])
def test_run_commands_refuse_a_bad_flag_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli(argv.split())
    assert e.value.code == 2
    err = capsys.readouterr().err
    system = argv.split()[1]
    assert f"usage: python -m tformer run {system}" in err
    assert re.search(message, err), err


@pytest.mark.parametrize("argv,message", [
    ("memory --chunk 0", r"argument --chunk: expected an integer ≥ 1, got '0'"),
    ("memory --seeds -1", r"argument --seeds: expected an integer ≥ 0, got '-1'"),
    ("fewer-bits --time-rounds 0", r"argument --time-rounds: expected an integer ≥ 1, got '0'"),
    ("generate --temperature -1", r"argument --temperature: expected a finite number ≥ 0"),
    ("generate --max-new-tokens x", r"argument --max-new-tokens: expected an integer ≥ 0"),
])
def test_measurement_commands_refuse_a_bad_flag_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli(argv.split())
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: python -m tformer {argv.split()[0]}" in err
    assert re.search(message, err), err
