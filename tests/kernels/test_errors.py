"""Bad or edge-case input at the boundaries: each raises a ValueError/TypeError that names the
argument (or the file) and what is wrong, or behaves as its docstring says.

Decided here (and written in the docstrings):
- ``TinyGPT.forward`` on an empty batch (B = 0) or empty sequences (T = 0): ValueError naming
  ``tokens``. The kernels underneath follow NumPy instead: empty in, empty out.
- ``greedy``/``sample``: an empty prompt raises ValueError naming ``prompt``; a prompt longer than
  ``max_len`` is cropped on the left (only its last ``max_len`` tokens are fed); ``temperature=0``
  is greedy decoding (the same tokens as ``greedy``); NaN, ∞ or negative temperatures raise.
- ``beam_search``: an empty prompt, or one that with ``max_new_tokens`` does not fit ``max_len``,
  raises ValueError before any work (beam search does not crop).
- Checkpoints: a truncated file, a file in another format, a corrupt member and a member holding
  pickled objects each raise ValueError naming the file and the problem.
"""
import os
import zipfile

import numpy as np
import pytest

from tformer.decoding import beam, generate
from tformer.training.checkpoint import load_checkpoint, save_checkpoint
from tformer.models.tinygpt import TinyGPT


@pytest.fixture(scope="module")
def model():
    return TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, seed=0)


@pytest.mark.parametrize("shape", [(0, 4), (2, 0), (0, 0)])
def test_tinygpt_forward_refuses_an_empty_batch_or_empty_sequences(model, shape):
    with pytest.raises(ValueError, match=r"tokens: expected at least one sequence .*got shape "
                                         + repr(shape).replace("(", r"\(").replace(")", r"\)")):
        model.forward(np.zeros(shape, np.int64))


def test_tinygpt_forward_beyond_max_len_names_tokens_and_max_len(model):
    with pytest.raises(ValueError, match=r"tokens: 9 positions exceed max_len = 8"):
        model.forward(np.zeros((1, 9), np.int64))


@pytest.mark.parametrize("fn", [generate.greedy,
                                lambda m, p, n: generate.sample(m, p, n, temperature=0.7)])
@pytest.mark.parametrize("shape,what", [((0, 3), "at least one row"), ((2, 0), "at least one token")])
def test_decoding_refuses_an_empty_prompt(model, fn, shape, what):
    with pytest.raises(ValueError, match=f"prompt: expected {what}"):
        fn(model, np.zeros(shape, np.int64), 3)


@pytest.mark.parametrize("fn", [generate.greedy,
                                lambda m, p, n: generate.sample(m, p, n, temperature=0.7)])
@pytest.mark.parametrize("bad", [-1, 256])
def test_decoding_names_the_prompt_for_ids_outside_the_vocabulary(model, fn, bad):
    prompt = np.array([[1, 2, bad]])
    with pytest.raises(ValueError, match=r"^prompt: .*256"):
        fn(model, prompt, 2)


def test_greedy_crops_a_prompt_longer_than_max_len_on_the_left(model):
    rng = np.random.default_rng(1)
    long = rng.integers(0, 256, size=(2, 13))
    out = generate.greedy(model, long, 4)
    assert out.shape == (2, 17)
    np.testing.assert_array_equal(out[:, :13], long)
    # Each new token is the argmax of the model on the last max_len tokens, and nothing else.
    ctx = out[:, :13]
    for t in range(4):
        want = model.forward(ctx[:, -8:])[:, -1].argmax(axis=-1)
        np.testing.assert_array_equal(out[:, 13 + t], want)
        ctx = out[:, :14 + t]


def test_temperature_zero_is_greedy_and_draws_nothing(model):
    prompt = np.random.default_rng(2).integers(0, 256, size=(3, 4))
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    out = generate.sample(model, prompt, 6, temperature=0, top_k=5, top_p=0.5, rng=rng)
    np.testing.assert_array_equal(out, generate.greedy(model, prompt, 6))
    assert rng.bit_generator.state == state


@pytest.mark.parametrize("temperature", [-0.5, float("nan"), float("inf")])
def test_sample_refuses_a_temperature_that_is_not_a_finite_number_at_least_zero(model, temperature):
    with pytest.raises(ValueError, match="temperature: expected a finite number ≥ 0"):
        generate.sample(model, np.zeros((1, 2), np.int64), 2, temperature=temperature)
    with pytest.raises(ValueError, match="temperature: expected a finite number ≥ 0"):
        generate.sample_from_logits(np.zeros((1, 4)), np.random.default_rng(0), temperature)


def test_sample_refuses_a_temperature_that_is_not_a_number(model):
    with pytest.raises(TypeError, match="temperature: expected a number ≥ 0, got str"):
        generate.sample(model, np.zeros((1, 2), np.int64), 2, temperature="0.5")


@pytest.mark.parametrize("shape", [(0, 3), (1, 0)])
def test_beam_search_refuses_an_empty_prompt(model, shape):
    with pytest.raises(ValueError, match="prompt: expected at least one row of at least one token"):
        beam.beam_search(model, np.zeros(shape, np.int64), 2, 3)


@pytest.mark.parametrize("T0,n", [(12, 1), (6, 4)])
def test_beam_search_refuses_a_prompt_that_does_not_fit_max_len(model, T0, n):
    with pytest.raises(ValueError, match=rf"prompt, max_new_tokens: .* = {T0 + n - 1} positions, "
                                         r"more than the model's max_len = 8"):
        beam.beam_search(model, np.zeros((1, T0), np.int64), 2, n)


def test_beam_search_up_to_max_len_works(model):
    out = beam.beam_search(model, np.zeros((1, 5), np.int64), 2, 4)    # 5 + 4 − 1 = 8 = max_len
    assert out.shape == (1, 9)


# --- checkpoints --------------------------------------------------------------------------------

@pytest.fixture()
def saved(model, tmp_path):
    return str(save_checkpoint(tmp_path / "ok.npz", model))


def _refused(path, model, *patterns):
    before = {k: v.copy() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError) as info:
        load_checkpoint(path, model)
    message = str(info.value)
    assert message.startswith(f"path: {str(path)!r} ")
    for p in patterns:
        assert p in message, message
    for k, v in model.state_dict().items():                   # nothing was loaded
        np.testing.assert_array_equal(v, before[k])
    return message


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.99])
def test_a_truncated_checkpoint_is_a_value_error_naming_the_file(model, saved, tmp_path, keep):
    data = open(saved, "rb").read()
    bad = tmp_path / "cut.npz"
    bad.write_bytes(data[:int(len(data) * keep)])
    _refused(str(bad), model, "not a zip (.npz) archive", "truncated", f"{int(len(data) * keep)} bytes")


def test_another_format_is_a_value_error_naming_the_file(model, tmp_path):
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"\x80\x02}q\x00.")                      # a pickle, as torch.save writes
    _refused(str(bad), model, "not a zip (.npz) archive")


def test_a_corrupt_member_is_a_value_error_naming_the_file(model, saved, tmp_path):
    data = bytearray(open(saved, "rb").read())
    w = model.state_dict()["wte.W"]
    at = bytes(data).find(w.tobytes()[:64]) + 200
    data[at] ^= 0x55                                           # one byte inside W_te's data
    bad = tmp_path / "flipped.npz"
    bad.write_bytes(bytes(data))
    _refused(str(bad), model, "a member is corrupt or cut short", "CRC")


def test_a_pickled_member_is_refused_before_it_is_read(model, saved, tmp_path):
    with np.load(saved) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["model/evil"] = np.array([{"os": "system"}], dtype=object)
    bad = tmp_path / "pickled.npz"
    np.savez(bad, **arrays)
    msg = _refused(str(bad), model, "member 'model/evil.npy' holds pickled Python objects",
                   "never loaded")
    assert "allow_pickle" not in msg                          # not NumPy's message


def test_a_zip_without_meta_is_a_value_error(model, tmp_path):
    bad = tmp_path / "nometa.npz"
    np.savez(bad, x=np.zeros(3))
    _refused(str(bad), model, "no 'meta' entry")


def test_a_zip_of_other_files_is_a_value_error(model, tmp_path):
    bad = tmp_path / "other.npz"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("meta.npy", "hello, not an array")
    _refused(str(bad), model, "member 'meta.npy' is not a NumPy array")


def test_meta_that_is_not_json_is_a_value_error(model, saved, tmp_path):
    with np.load(saved) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["meta"] = np.array("{not json")
    bad = tmp_path / "badmeta.npz"
    np.savez(bad, **arrays)
    _refused(str(bad), model, "'meta' entry is not JSON")


def test_a_folder_and_a_missing_file(model, tmp_path):
    _refused(str(tmp_path), model, "is a folder")
    with pytest.raises(FileNotFoundError, match="path: no checkpoint at"):
        load_checkpoint(os.path.join(tmp_path, "nothing.npz"), model)


def test_a_good_checkpoint_still_loads(model, saved):
    other = TinyGPT(d_model=16, n_heads=2, n_layers=1, max_len=8, seed=3)
    load_checkpoint(saved, other)
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, model.state_dict()[k])
