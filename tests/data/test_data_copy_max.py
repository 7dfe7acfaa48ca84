"""The copy-the-max-row task (tformer/data/copy_max.py, copy_max_centered.py) of the single
attention layer and the two-layer transformer: its targets recomputed by loops, its batches as
pure functions of (seed, split, index), and its nearest-row accuracy by hand."""
import numpy as np
import pytest

from tformer.data import copy_max, copy_max_centered


def test_copy_max_targets_checked_by_loops():
    x, y = copy_max.copy_max_batch(3, batch_size=5, seq_len=7, d_model=4, seed=9, dtype=np.float64)
    assert x.shape == y.shape == (5, 7, 4)
    assert 0.0 <= x.min() and x.max() < 1.0                        # U(0, 1)
    for b in range(5):
        firsts = [float(x[b, t, 0]) for t in range(7)]
        j = firsts.index(max(firsts))
        assert copy_max.argmax_rows(x)[b] == j
        for t in range(7):
            assert list(y[b, t]) == list(x[b, j])


def test_copy_max_batches_are_pure_functions_of_seed_split_index():
    a = copy_max.copy_max_batch(4, batch_size=2, seq_len=3, d_model=2, seed=1)
    b = copy_max.copy_max_batch(4, batch_size=2, seq_len=3, d_model=2, seed=1)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    for other in (copy_max.copy_max_batch(5, batch_size=2, seq_len=3, d_model=2, seed=1),
                  copy_max.copy_max_batch(4, batch_size=2, seq_len=3, d_model=2, seed=2),
                  copy_max.copy_max_batch(4, batch_size=2, seq_len=3, d_model=2, seed=1, split="test")):
        assert np.abs(other[0] - a[0]).max() > 1e-3
    assert a[0].dtype == np.float32
    with pytest.raises(ValueError, match="split"):
        copy_max.copy_max_batch(0, split="valid")
    with pytest.raises(ValueError, match="index"):
        copy_max.copy_max_batch(-1)
    with pytest.raises(ValueError, match="seq_len"):
        copy_max.copy_max_batch(0, seq_len=0)


def test_centered_task_targets_and_distribution():
    x, y = copy_max_centered.centered_copy_max_batch(0, batch_size=64, seq_len=6, d_model=8,
                                                     dtype=np.float64)
    assert x.min() < -1.0 and abs(x.mean()) < 0.1 and abs(x.std() - 1.0) < 0.1    # N(0, 1)
    for b in range(64):
        j = max(range(6), key=lambda t: x[b, t, 0])
        assert np.array_equal(y[b], np.repeat(x[b, j][None], 6, axis=0))
    held = copy_max_centered.held_out(2, batch_size=3, seq_len=4, d_model=2)
    assert len(held) == 2 and held[0][0].shape == (3, 4, 2)


def test_nearest_row_accuracy_by_hand():
    x = np.array([[[0.1, 0.0], [0.9, 1.0], [0.5, 0.0]]])            # row 1 has the largest first feature
    assert copy_max.argmax_rows(x).tolist() == [1]
    y = np.array([[[0.8, 0.9], [0.4, 0.1], [0.9, 1.0]]])            # nearest rows: 1, 2, 1
    assert copy_max.nearest_rows(y, x).tolist() == [[1, 2, 1]]
    assert abs(copy_max.nearest_row_accuracy(y, x, np.array([1])) - 2 / 3) < 1e-15
    m = copy_max.evaluate(IdentityTarget(), [(x, copy_max.copy_max_targets(x))])
    assert m == {"loss": 0.0, "accuracy": 1.0, "seq_accuracy": 1.0}


class IdentityTarget:
    """A perfect 'model' of the copy-max task, for checking the metric."""

    def forward(self, x):
        return copy_max.copy_max_targets(x)
