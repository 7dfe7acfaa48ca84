"""tformer.data.bpe: round trip, incremental counting = naive recount, the HF tokenizers reference,
errors, save/load; tformer.data.tokens: bits per byte; the bpe-compare command."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer.data import bpe
from tformer.data.bpe import BPETokenizer
from tformer.data.text import TextData, stdlib_documents
from tformer.data.tokens import TokenData, nats_to_bits_per_byte

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def python_text():
    """About 150 kB of the standard library's source: ASCII, punctuation, digits, indentation."""
    docs = stdlib_documents(("difflib", "textwrap", "fractions", "csv", "shlex", "bisect", "heapq"))
    return b"\n".join(raw for _, raw in docs).decode("utf-8")


@pytest.fixture(scope="module")
def tokenizer(python_text):
    return BPETokenizer.train(python_text, 600)


MIXED = "Hello, world!  It's 2024:\tnaïve café — 東京 😀 x_y__z ½ ٣٤ \n\n  end"


# --- pre-tokenisation -------------------------------------------------------------------------

def test_chunks_follow_the_rule():
    chunks = [c.decode() for c in bpe.pretokenize("The king's   2 men,\n\nrun!")]
    assert chunks == ["The", " king", "'", "s", "  ", " 2", " men", ",", "\n\n", "run", "!"]


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_chunks_concatenate_to_the_text(text):
    assert b"".join(bpe.pretokenize(text)) == text.encode("utf-8")


def test_chunk_counts_weigh_repeated_chunks():
    counts = bpe.chunk_counts("to be or not to be")
    assert counts[b" be"] == 2 and counts[b"to"] == 1 and counts[b" to"] == 1
    assert sum(counts.values()) == len(bpe.pretokenize("to be or not to be"))


# --- training ---------------------------------------------------------------------------------

def test_merges_of_a_small_text_by_hand():
    # "aaab" x 1: pairs (a,a)=2, (a,b)=1 -> merge (a,a) first; then [aa, a, b]: (aa,a),(a,b) tie
    # at 1 -> the smaller pair (97, 98) < (256, 97)
    tok = BPETokenizer.train("aaab", 258)
    a, b = ord("a"), ord("b")
    assert tok.merges == [(a, a), (a, b)]
    assert tok.tokens[256:] == [b"aa", b"ab"]
    assert tok.encode("aaab").tolist() == [256, 257]


def test_a_merge_that_remakes_a_token_reuses_its_id():
    # "abc" can be made as ab+c and as a+bc: chunk "abc" x 2, "bc" x 3, "ab" x 2.
    words = [b"abc", b"bc", b"ab"]
    merges, tokens = bpe.train_merges([list(w) for w in words], [2, 3, 2], 300)
    made = [tokens[x] + tokens[y] for x, y in merges]
    assert made[0] == b"bc" and b"abc" in made
    assert len(tokens) == len(set(tokens)) == 256 + len(set(made))


@pytest.mark.parametrize("vocab_size", [300, 700])
def test_incremental_counting_equals_the_naive_recount(python_text, vocab_size):
    counts = bpe.chunk_counts(python_text[:40000])
    words, n = [list(c) for c in counts], list(counts.values())
    fast = bpe.train_merges(words, n, vocab_size)
    slow = bpe.naive_merges(words, n, vocab_size)
    assert fast == slow
    assert len(fast[1]) == vocab_size


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab c", max_size=12), min_size=1, max_size=8),
       st.integers(256, 290))
def test_incremental_equals_naive_on_repetitive_words(texts, vocab_size):
    counts = bpe.chunk_counts(" ".join(texts))
    words, n = [list(c) for c in counts], list(counts.values())
    assert bpe.train_merges(words, n, vocab_size) == bpe.naive_merges(words, n, vocab_size)


def test_encoding_the_training_text_gives_the_training_segmentation(python_text):
    counts = bpe.chunk_counts(python_text)
    merges, tokens = bpe.train_merges([list(c) for c in counts], list(counts.values()), 500)
    tok = BPETokenizer(merges)
    # the trainer's final segmentation of each chunk, replayed merge by merge
    ids = {t: i for i, t in enumerate(tokens)}
    for chunk in list(counts)[:3000]:
        word = list(chunk)
        for pair in merges:
            word = bpe.merge_word(word, pair, ids[tokens[pair[0]] + tokens[pair[1]]])
        assert tok.encode(chunk).tolist() == word


def test_training_stops_when_no_pair_is_left():
    tok = BPETokenizer.train("ab ab", 1000)
    assert tok.vocab_size == 256 + 2 and tok.tokens[-1] == b" ab"


# --- round trip -------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text())
def test_round_trip_of_any_text(tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids.dtype == np.int64 and (ids.size == 0 or ids.max() < tokenizer.vocab_size)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode_bytes(ids) == text.encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(st.binary())
def test_round_trip_of_any_bytes(tokenizer, raw):
    assert tokenizer.decode_bytes(tokenizer.encode(raw)) == raw


def test_round_trip_of_mixed_scripts(tokenizer, python_text):
    for text in (MIXED, python_text):
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_merges_compress(tokenizer, python_text):
    assert len(tokenizer.encode(python_text)) < 0.6 * len(python_text.encode())
    assert tokenizer.bytes_per_token(python_text) > 1.6


def test_a_cut_character_decodes_to_the_replacement_character(tokenizer):
    ids = tokenizer.encode("é")
    first = tokenizer.decode_bytes(ids)[:1]
    assert tokenizer.decode(tokenizer.encode(first)) == "\ufffd"


# --- errors -----------------------------------------------------------------------------------

def test_text_that_is_not_str_or_bytes(tokenizer):
    for bad in (3, None, ["a"], np.array([1, 2])):
        with pytest.raises(TypeError, match=r"text: expected str or bytes, got "):
            tokenizer.encode(bad)
    with pytest.raises(TypeError, match="text: expected str or bytes, got int"):
        BPETokenizer.train(5, 300)


def test_a_lone_surrogate_is_refused(tokenizer):
    with pytest.raises(ValueError, match=r"lone surrogate U\+D800 at index 2"):
        tokenizer.encode("ab\ud800c")


def test_ids_outside_the_vocabulary(tokenizer):
    V = tokenizer.vocab_size
    for bad in ([0, V], [-1, 3]):
        with pytest.raises(ValueError, match=rf"ids: expected token ids in \[0, {V}\).*got min"):
            tokenizer.decode(bad)
    with pytest.raises(TypeError, match="ids: expected integer token ids, got an array of float64"):
        tokenizer.decode([1.0, 2.0])
    with pytest.raises(TypeError, match="ids: expected integer token ids"):
        tokenizer.decode(["a"])


def test_vocab_size_below_256():
    with pytest.raises(ValueError, match="vocab_size: expected an integer ≥ 256.*got 100"):
        BPETokenizer.train("abc", 100)
    with pytest.raises(TypeError, match="vocab_size: expected an int, got float"):
        BPETokenizer.train("abc", 300.0)


def test_merges_that_name_unknown_ids():
    with pytest.raises(ValueError, match=r"merges: expected merge 1 to be a pair of ids in \[0, 257\)"):
        BPETokenizer([(97, 98), (97, 300)])


# --- save / load ------------------------------------------------------------------------------

def test_save_and_load(tmp_path, tokenizer):
    path = tmp_path / "tok.json"
    tokenizer.save(path)
    loaded = BPETokenizer.load(path)
    assert loaded.merges == tokenizer.merges and loaded.tokens == tokenizer.tokens
    assert loaded.encode(MIXED).tolist() == tokenizer.encode(MIXED).tolist()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_load_refuses_another_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="path: expected a 'tformer-bpe' file"):
        BPETokenizer.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="path: expected a tokenizer's JSON"):
        BPETokenizer.load(path)
    path.write_text(json.dumps({"format": "tformer-bpe", "version": 1, "pattern": bpe.PATTERN,
                                "vocab_size": 300, "merges": [[97, 98]]}))
    with pytest.raises(ValueError, match="says vocab_size 300, its merges make 257"):
        BPETokenizer.load(path)


# --- the reference: HF tokenizers -------------------------------------------------------------

@pytest.fixture(scope="module")
def reference():
    pytest.importorskip("tokenizers")
    from tformer.data import bpe_reference
    return bpe_reference


def test_the_reference_splits_the_same_chunks(reference, python_text):
    assert reference.hf_chunks(python_text) == bpe.pretokenize(python_text)


def test_the_byte_level_alphabet(reference):
    chars = reference.byte_level_alphabet()
    assert len(set(chars)) == 256 and chars[ord("A")] == "A" and chars[ord(" ")] == "\u0120"
    import tokenizers
    assert set(chars) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())


@pytest.mark.parametrize("vocab_size", [400, 1000])
def test_merges_match_the_reference(reference, python_text, vocab_size):
    hf = reference.hf_merges(python_text, vocab_size)
    ours = reference.tformer_merges(python_text, vocab_size, order=reference.hf_byte_order())
    assert len(hf) == len(ours) == vocab_size - 256
    assert reference.first_difference(ours, hf) is None
    # with tformer's own numbering (bytes by value) they agree up to a tie broken the other way
    natural = reference.tformer_merges(python_text, vocab_size)
    i = reference.first_difference(natural, hf)
    if i is not None:
        done = natural[:i]
        assert (reference.pair_count(python_text, done, natural[i])
                == reference.pair_count(python_text, done, hf[i]))


# --- token data and bits per byte -------------------------------------------------------------

def test_bits_per_byte_conversion():
    assert nats_to_bits_per_byte(math.log(2), 10, 10) == pytest.approx(1.0, rel=1e-12)
    assert nats_to_bits_per_byte(2 * math.log(2), 100, 250) == pytest.approx(0.8, rel=1e-12)
    with pytest.raises(ValueError, match="n_tokens, n_bytes: expected ≥ 1"):
        nats_to_bits_per_byte(1.0, 0, 5)


def test_token_data_splits_and_bits_per_byte(python_text, tokenizer):
    text_data = TextData([("py", python_text.encode())], 16, 4)
    data = TokenData.encode(text_data, tokenizer)
    assert tokenizer.decode_bytes(data.train) == text_data.train.tobytes()
    assert tokenizer.decode_bytes(data.val) == text_data.val.tobytes()
    x, y = data.batch(3)
    assert x.shape == y.shape == (4, 16) and (x[:, 1:] == y[:, :-1]).all()
    assert data.bytes_per_token() == pytest.approx(
        text_data.train.size / data.train.size, rel=1e-12)

    class Uniform:                      # a model that says 1/V to every token: log V nats each
        def forward(self, x):
            return np.zeros(x.shape + (data.vocab_size,), np.float64)
    xv, yv = data.windows("val")
    expected = math.log2(data.vocab_size) * yv.size / data.token_lengths[yv].sum()
    assert data.bits_per_byte(Uniform()) == pytest.approx(expected, rel=1e-9)


def test_bpe_compare_command(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("To be, or not to be, that is the question:\n" * 200)
    out = tmp_path / "bpe.json"
    env = dict(os.environ, TFORMER_PROGRESS="0")
    cmd = [sys.executable, "-m", "tformer", "bpe-compare", "--text", str(text), "--vocab-sizes",
           "256", "280", "--seeds", "0", "1", "--steps", "6", "--warmup", "1", "--eval-every", "3",
           "--d-model", "16", "--n-layers", "1", "--max-len", "8", "--out", str(out), "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["commit"] and len(result["commit"]) == 40     # git ran in the repository
    assert set(result["runs"]) == {"256", "280"} and len(result["runs"]["280"]) == 2
    assert result["tokenizers"]["256"]["bytes_per_token_train"] == 1.0
    assert result["tokenizers"]["280"]["bytes_per_token_train"] > 1.5
    assert all(math.isfinite(r["final_val_bpb"]) for rs in result["runs"].values() for r in rs)
    assert result["summary"]["256"]["diff_mean"] == 0.0
    bad = subprocess.run(cmd[:4] + ["--vocab-sizes", "100"], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path))
    assert bad.returncode != 0 and "--vocab-sizes: expected sizes ≥ 256" in bad.stderr


def test_run_tinygpt_on_bpe_tokens_and_generate(tmp_path):
    text = tmp_path / "t.txt"
    text.write_bytes(stdlib_documents(("difflib",))[0][1])
    ckpt = tmp_path / "m.npz"
    env = dict(os.environ, TFORMER_PROGRESS="0")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "tformer", *args, "--threads", "1"],
                              capture_output=True, text=True, env=env, cwd=str(tmp_path))

    train = run("run", "tinygpt", "--text", str(text), "--bpe", "300", "--steps", "4",
                "--warmup", "1", "--eval-every", "2", "--eval-windows", "2", "--batch-size", "2",
                "--d-model", "16", "--n-layers", "1", "--max-len", "16", "--checkpoint",
                str(ckpt), "--no-progress", "--sample-tokens", "4", "--temperatures", "1")
    assert train.returncode == 0, train.stderr
    tok_path = tmp_path / "m.tokenizer.json"
    tok = BPETokenizer.load(tok_path)
    assert tok.vocab_size == 300 and "bytes/token" in train.stdout
    gen = run("generate", "--checkpoint", str(ckpt), "--tokenizer", str(tok_path),
              "--prompt", "def ", "--max-new-tokens", "5")
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("def ")
    missing = run("generate", "--checkpoint", str(ckpt), "--prompt", "def ")
    assert missing.returncode == 2 and "--tokenizer: the model reads 300 tokens" in missing.stderr
    other = tmp_path / "other.json"
    BPETokenizer.train("abc abc", 258).save(other)
    wrong = run("generate", "--checkpoint", str(ckpt), "--tokenizer", str(other), "--prompt", "R")
    assert wrong.returncode == 2 and "expected a tokenizer of the model's 300 tokens" in wrong.stderr
    small = run("run", "tinygpt", "--bpe", "100", "--steps", "1")
    assert small.returncode == 2 and "--bpe: expected a vocabulary of at least 256" in small.stderr
