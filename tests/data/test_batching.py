"""Dynamic batching (tformer.data.batching): budgets, determinism, and padding that never leaks."""
import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.data.batching import (BucketedTask, BucketSampler, bucket, check_budget,
                                   pad_sequences, padding_share)
from tformer.data.sequences import PAD, SequenceTask
from tformer.models.transformer import Transformer


def test_bucket_cuts_sorted_batches_under_the_budget():
    lengths = np.random.default_rng(0).integers(3, 67, 500)
    batches = bucket(lengths, 640, np.random.default_rng(1))
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    for b in batches:
        assert len(b) * lengths[b].max() <= 640
    # greedy: adding the next row of the sorted order would have broken the budget
    by_start = sorted(batches, key=lambda b: lengths[b].min())
    for b, nxt in zip(by_start, by_start[1:]):
        assert (len(b) + 1) * max(lengths[b].max(), lengths[nxt].min()) > 640
    again = bucket(lengths, 640, np.random.default_rng(1))
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))


@pytest.mark.parametrize("budget,error,match", [
    (0, ValueError, "max_tokens: expected a positive integer, got 0"),
    (-5, ValueError, "max_tokens: expected a positive integer, got -5"),
    (2.5, TypeError, "max_tokens: expected a positive integer"),
    (True, TypeError, "max_tokens"),
    (10, ValueError, "max_tokens: a budget of 10 tokens is smaller than one sequence of 12 tokens"),
])
def test_bad_budgets(budget, error, match):
    with pytest.raises(error, match=match):
        bucket([3, 12, 5], budget)


def test_budget_smaller_than_a_row_of_the_task():
    task = SequenceTask(max_len=8)
    with pytest.raises(ValueError, match="max_tokens: a budget of 17 tokens is smaller than one "
                                         "sequence of 18 tokens"):
        BucketedTask(task, 17)
    with pytest.raises(ValueError, match="max_tokens"):
        BucketSampler(4, lengths=np.array([3, 5]))
    assert check_budget(18, 18) == 18


def test_finite_dataset_sampler_is_a_pure_function_of_the_step():
    lengths = np.random.default_rng(2).integers(1, 40, 300)
    a = BucketSampler(200, lengths=lengths, pool_size=128, seed=4)
    seen = [a.indices(i) for i in range(60)]
    b = BucketSampler(200, lengths=lengths, pool_size=128, seed=4)
    for i in (59, 17, 0):                                   # a resumed run, any order
        assert np.array_equal(b.indices(i)[0], seen[i][0])
    for idx, rows in seen:
        assert np.array_equal(lengths[idx], rows) and len(idx) * rows.max() <= 200
    # the first epoch's pools hold every example once
    n_first = a._ends[1]                                    # batches of pools 0 and 1 (256 examples)
    first = np.concatenate([seen[i][0] for i in range(n_first)])
    assert first.size == 256 and np.unique(first).size == 256
    other = BucketSampler(200, lengths=lengths, pool_size=128, seed=5)
    assert not np.array_equal(other.indices(0)[0], seen[0][0])


def test_bucketed_task_batches_and_padding_share():
    task = SequenceTask(min_len=1, max_len=32, seed=0)
    budget = 64 * task.seq_len
    bt = BucketedTask(task, budget, pool_size=512, seed=0)
    fixed = [task.batch(i, 64)["inputs"] for i in range(20)]
    bucketed = [bt.batch(i) for i in range(20)]
    for b in bucketed:
        B, T = b["inputs"].shape
        assert B * T <= budget and T == 2 * b["lengths"].max() + 2
        assert b["targets"].shape == (B, T)
        n_answer = (b["targets"] != PAD).sum()
        assert n_answer == (b["lengths"] + 1).sum()          # y_1 … y_n EOS of every row
    share_fixed = np.mean([padding_share(x) for x in fixed])
    share_bucketed = np.mean([padding_share(b["inputs"]) for b in bucketed])
    assert share_bucketed < 0.5 * share_fixed
    assert np.array_equal(bt.batch(7)["inputs"], BucketedTask(task, budget, 512, seed=0).batch(7)["inputs"])


def test_pad_sequences():
    x = pad_sequences([[5, 6, 7], [8], []], pad_id=0)
    assert x.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert padding_share(x) == pytest.approx(5 / 9)


def test_padding_never_leaks():
    """The loss and every gradient of a padded batch equal those of its rows run one by one,
    each at its own length with no padding (float64)."""
    task = SequenceTask(min_len=1, max_len=7, seed=3)
    b = task.batch(0, 6, lengths=np.array([1, 7, 3, 5, 2, 7]))
    kw = dict(vocab_size=task.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64,
              max_len=task.seq_len, dropout=0.0, seed=1, dtype=np.float64)
    model = Transformer(**kw)
    loss, dlogits = F.cross_entropy(model.forward(b["inputs"]), b["targets"], ignore_index=PAD)
    model.backward(dlogits)
    padded = {n: g.copy() for n, _, g in model.named_parameters()}
    n_total = int((b["targets"] != PAD).sum())
    model.zero_grad()
    total = 0.0
    for x, y, n in zip(b["inputs"], b["targets"], b["lengths"]):
        T = 2 * n + 2
        x1, y1 = x[None, :T], y[None, :T]
        assert (x1 != PAD).all()                             # nothing padded
        l1, d1 = F.cross_entropy(model.forward(x1), y1, ignore_index=PAD)
        w = (n + 1) / n_total                               # this row's share of the answer tokens
        total += w * l1
        model.backward(d1 * w)
    assert abs(total - loss) <= 1e-13 * abs(loss)
    # one scale for all: the key bias's gradient is zero in exact arithmetic (softmax ignores a
    # shift shared by all keys), so its own size is rounding noise of ~1e-18
    scale = max(np.abs(g).max() for g in padded.values())
    for name, _, g in model.named_parameters():
        assert np.abs(g - padded[name]).max() <= 1e-12 * scale, name


def test_counting_adds_real_tokens_positions_rows_and_batches():
    from tformer.data.batching import counting
    batches = [{"inputs": np.array([[5, 6, 0], [7, 0, 0]])}, {"inputs": np.array([[1, 2, 3, 4]])}]
    count = {"real": 0, "positions": 0, "rows": 0, "batches": 0}
    batch = counting(lambda i: batches[i], count, pad=0)
    assert batch(0) is batches[0] and batch(1) is batches[1]
    assert count == {"real": 7, "positions": 10, "rows": 3, "batches": 2}
