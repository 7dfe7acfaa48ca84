"""Step-sorted batching (tformer.data.batching.SortedTask): each step's fixed batch,
sorted by length and split into micro-batches under a token budget, gives the fixed
batch's loss and gradient."""
import numpy as np
import pytest

from tformer.__main__ import main as cli
from tformer.training.checkpoint import load_checkpoint
from tformer.data.batching import (SortedTask, counting, default_budget, row_lengths,
                                   split_by_length)
from tformer.data.sequences import PAD, SequenceTask
from tformer.models.transformer import Transformer
from tformer.training.optim import SGD, Adam, cosine_with_warmup
from tformer.experiments.memory_batching import Run, verdict
from tformer.training.train import micro_batches, train


def _model(task, dtype=np.float64, dropout=0.0, seed=1):
    return Transformer(vocab_size=task.vocab_size, d_model=32, n_heads=4, n_layers=2,
                       d_ff=64, max_len=task.seq_len, dropout=dropout, seed=seed,
                       dtype=dtype)


def _step(task, source, accum=1):
    """Loss and every parameter gradient of one training step (lr 0: nothing moves)."""
    model = _model(task)
    hist = train(model, SGD(model, lr=0.0), source, task.forward_loss, 1,
                 accum_steps=accum, progress_bar=False)
    return hist["loss"][0], {n: g.copy() for n, _, g in model.named_parameters()}


@pytest.mark.parametrize("rows_per_budget", [1, 3, 7, 24])
def test_sorted_step_has_the_fixed_batch_loss_and_gradient(rows_per_budget):
    """float64: the weighted micro-batches give the fixed padded batch's loss and gradient
    to 1e-12 relative, for budgets from one row per micro-batch to the whole batch."""
    task = SequenceTask("reverse", 10, 1, 12, seed=3)
    sorted_task = SortedTask(task, 24, rows_per_budget * task.seq_len)
    parts = sorted_task.batch(0)
    assert len(parts) > 1 or rows_per_budget == 24
    loss_f, g_f = _step(task, lambda i: task.batch(i, 24))
    loss_s, g_s = _step(task, sorted_task.batch)
    assert abs(loss_s - loss_f) <= 1e-12 * abs(loss_f)
    scale = max(np.abs(g).max() for g in g_f.values())
    for name, g in g_f.items():
        assert np.abs(g_s[name] - g).max() <= 1e-12 * scale, name
        # per tensor too, except the key biases: their gradient is zero in exact
        # arithmetic (softmax ignores a shift shared by all keys): the rest is rounding
        if not name.endswith("attn.k.b"):
            assert np.linalg.norm(g_s[name] - g) <= 1e-12 * np.linalg.norm(g), name


def test_sorted_with_accumulation_equals_fixed_with_accumulation():
    task = SequenceTask("reverse", 10, 1, 12, seed=4)
    sorted_task = SortedTask(task, 12, 4 * task.seq_len)
    loss_f, g_f = _step(task, lambda i: task.batch(i, 12), accum=3)
    loss_s, g_s = _step(task, sorted_task.batch, accum=3)
    assert abs(loss_s - loss_f) <= 1e-12 * abs(loss_f)
    scale = max(np.abs(g).max() for g in g_f.values())
    assert all(np.abs(g_s[n] - g).max() <= 1e-12 * scale for n, g in g_f.items())


def test_the_weights_matter():
    """A plain mean of the micro-batches' mean losses is another gradient: the weights
    N_j/N are what makes the step the fixed batch's (so the test above can fail)."""
    task = SequenceTask("reverse", 10, 1, 12, seed=3)
    sorted_task = SortedTask(task, 24, 3 * task.seq_len)

    def unweighted(i):
        parts = sorted_task.batch(i)
        return [dict(p, weight=1 / len(parts)) for p in parts]
    loss_f, g_f = _step(task, lambda i: task.batch(i, 24))
    loss_u, g_u = _step(task, unweighted)
    assert abs(loss_u - loss_f) > 1e-3 * abs(loss_f)
    assert max(np.abs(g_u[n] - g).max() for n, g in g_f.items()) > 1e-4


def test_split_by_length_keeps_every_row_and_counted_target():
    task = SequenceTask("reverse", 10, 1, 32, seed=0)
    b = task.batch(5, 64)
    budget = 8 * task.seq_len
    parts = split_by_length(b, budget, PAD)
    assert sum(p["weight"] for p in parts) == pytest.approx(1.0, abs=1e-15)
    n_total = int((b["targets"] != PAD).sum())
    T_prev = 0
    for p in parts:
        B_j, T_j = p["inputs"].shape
        assert B_j * T_j <= budget and p["targets"].shape == (B_j, T_j)
        assert T_j == 2 * p["lengths"].max() + 2           # trimmed to its longest row
        assert p["weight"] == int((p["targets"] != PAD).sum()) / n_total
        assert T_j >= T_prev                                         # shortest rows first
        T_prev = T_j
    # every row once: rebuild the batch from its micro-batches, padded back to T
    rebuilt = np.full_like(b["inputs"], PAD)
    targets = np.full_like(b["targets"], PAD)
    order = np.argsort(b["lengths"], kind="stable")
    at = 0
    for p in parts:
        rows = order[at:at + len(p["lengths"])]
        assert np.array_equal(b["lengths"][rows], p["lengths"])
        rebuilt[rows, :p["inputs"].shape[1]] = p["inputs"]
        targets[rows, :p["targets"].shape[1]] = p["targets"]
        at += len(rows)
    assert at == 64 and np.array_equal(targets, b["targets"])
    # the inputs cut off: at most each row's EOS, which predicts nothing (target PAD)
    cut = (b["inputs"] != rebuilt)
    assert cut.sum(axis=1).max() <= 1 and (b["targets"][cut] == PAD).all()


def test_row_lengths_end_at_the_last_counted_target():
    y = np.array([[PAD, 5, 6, PAD, PAD], [PAD, PAD, PAD, PAD, 7], [PAD] * 5])
    assert row_lengths(y, PAD).tolist() == [3, 5, 1]


def test_sorted_batches_cut_padding_by_more_than_half():
    task = SequenceTask("reverse", 10, 1, 32, seed=0)
    budget = default_budget("sorted", 64, task.seq_len)
    assert budget == 64 * 66 // 8
    count = {k: {"real": 0, "positions": 0, "rows": 0, "batches": 0}
             for k in ("fixed", "sorted")}
    fixed = counting(lambda i: task.batch(i, 64), count["fixed"], PAD)
    sorted_ = counting(SortedTask(task, 64, budget).batch, count["sorted"], PAD)
    for i in range(40):
        fixed(i), sorted_(i)
    share = {k: 1 - c["real"] / c["positions"] for k, c in count.items()}
    # the same rows; a row that sets its micro-batch's length loses its last input, an EOS
    # whose target is PAD (test_split_by_length_keeps_every_row_and_counted_target)
    lost = count["fixed"]["real"] - count["sorted"]["real"]
    assert 0 < lost < 0.01 * count["fixed"]["real"]
    assert count["sorted"]["rows"] == count["fixed"]["rows"] == 40 * 64
    assert 0.40 < share["fixed"] < 0.50 and share["sorted"] < share["fixed"] / 2
    assert count["sorted"]["batches"] > count["fixed"]["batches"]   # more, smaller ones


def test_sorted_task_is_a_pure_function_of_the_step():
    task = SequenceTask("reverse", 10, 1, 32, seed=2)
    a, b = SortedTask(task, 64, 600), SortedTask(task, 64, 600)
    first = [a.batch(i) for i in range(5)]
    for i in (4, 0, 2):                                        # a resumed run, any order
        for p, q in zip(b.batch(i), first[i]):
            for k in ("inputs", "targets", "lengths"):
                assert np.array_equal(p[k], q[k])
            assert p["weight"] == q["weight"]
    other = SortedTask(SequenceTask("reverse", 10, 1, 32, seed=3), 64, 600).batch(0)
    assert not np.array_equal(other[0]["inputs"], first[0][0]["inputs"])


def test_resume_with_sorted_batches_is_bit_exact(tmp_path):
    task = SequenceTask("reverse", 10, 1, 8, seed=0)
    source = SortedTask(task, 16, 3 * task.seq_len).batch
    path = tmp_path / "ck.npz"

    def run(model, opt, steps, start=0, every=0):
        return train(model, opt, source, task.forward_loss, steps, start_step=start,
                     clip_norm=1.0, progress_bar=False,
                     lr_schedule=lambda s: cosine_with_warmup(s, 3e-3, 2, 6),
                     checkpoint_path=path if every else None, checkpoint_every=every)
    full = _model(task, np.float32, 0.2)
    h_full = run(full, Adam(full, lr=1e-3), 6)
    first = _model(task, np.float32, 0.2)
    run(first, Adam(first, lr=1e-3), 3, every=3)
    resumed = _model(task, np.float32, 0.2)
    opt = Adam(resumed, lr=1e-3)
    start = load_checkpoint(path, resumed, opt)["step"]
    assert start == 3
    assert run(resumed, opt, 6, start=start)["loss"] == h_full["loss"][3:]
    for (n, p, _), (_, q, _) in zip(full.named_parameters(), resumed.named_parameters()):
        assert np.array_equal(p, q), n


@pytest.mark.parametrize("budget,error,match", [
    (0, ValueError, "max_tokens: expected a positive integer, got 0"),
    (-3, ValueError, "max_tokens: expected a positive integer, got -3"),
    (2.5, TypeError, "max_tokens: expected a positive integer"),
    (True, TypeError, "max_tokens"),
    (17, ValueError,
     "max_tokens: a budget of 17 tokens is smaller than one sequence of 18 tokens"),
])
def test_sorted_bad_budget(budget, error, match):
    with pytest.raises(error, match=match):
        SortedTask(SequenceTask(max_len=8), 16, budget)


def test_sorted_bad_batch_and_batch_size():
    task = SequenceTask(max_len=8)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="batch_size: expected a positive integer"):
            SortedTask(task, bad, 100)
    b = task.batch(0, 4)
    with pytest.raises(ValueError, match="batch: expected inputs and targets of one"):
        split_by_length({"inputs": b["inputs"], "targets": b["targets"][:, :-1]}, 100)


def test_micro_batches_of_train():
    b = {"inputs": np.zeros((1, 2))}
    assert micro_batches(b) == [(1.0, b)]
    parts = [dict(b, weight=0.25), dict(b, weight=0.75)]
    assert [w for w, _ in micro_batches(parts)] == [0.25, 0.75]


def test_run_transformer_sorted(tmp_path, capsys):
    status = cli(["run", "transformer", "--steps", "3", "--eval-every", "0", "--target",
                  "0",
                  "--max-len", "6", "--d-model", "16", "--n-heads", "2", "--d-ff", "32",
                  "--eval-size", "20", "--beam-width", "2", "--batching", "sorted",
                  "--max-tokens", "42", "--checkpoint", str(tmp_path / "t.npz"),
                  "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0
    assert "micro-batches of at most 42 padded positions" in out
    assert "micro-batches per step" in out
    too_small = ("--max-tokens: expected at least one row of 2·--max-len + 2 = 14 "
                 "positions")
    for budget, message in (("10", too_small + ", got 10"),
                            ("0", "--max-tokens")):
        with pytest.raises(SystemExit) as e:               # the command's usage error
            cli(["run", "transformer", "--steps", "1", "--batching", "sorted",
                 "--max-tokens", budget, "--max-len", "6",
                 "--checkpoint", str(tmp_path / "u.npz"),
                 "--no-progress"])
        assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "u.npz").exists()


def test_interleaved_runs_train_as_one_run():
    """The comparison advances each run a chunk at a time: the same losses as one call."""
    task = SequenceTask("reverse", 10, 1, 6, seed=0)
    a = Run(task, "sorted", 0, 6, batch_size=8, warmup=2, max_tokens=28)
    for end in (2, 4, 6):
        a.advance(end)
    b = Run(task, "sorted", 0, 6, batch_size=8, warmup=2, max_tokens=28)
    b.advance(6)
    assert a.hist["loss"] == b.hist["loss"] and len(a.chunk_wall) == 3
    heldout = task.heldout(30)
    assert 0 <= a.evaluate(heldout) <= 1
    r = a.result()
    n_heldout = sum(len(y) for _, y in heldout.values())
    assert sum(v[1] for v in r["by_length"].values()) == n_heldout
    assert r["batches_per_step"] > 1 and 0 < r["padding_share"] < 1
    assert r["tokens_per_cpu_s"] > 0


def test_verdict_same_accuracy_rule():
    def run(mode, seed, em, pad):
        return {"batching": mode, "seed": seed, "exact_match": em, "padding_share": pad,
                "tokens_per_s": 100.0, "tokens_per_cpu_s": 200.0}
    runs = [run("fixed", 0, 0.40, 0.45), run("fixed", 1, 0.38, 0.45),
            run("sorted", 0, 0.37, 0.14), run("sorted", 1, 0.36, 0.14),
            run("bucketed", 0, 0.27, 0.08), run("bucketed", 1, 0.26, 0.08)]
    s = verdict(runs)
    assert s["sorted"]["difference"] == pytest.approx(-0.025)
    assert s["sorted"]["tolerance"] == 0.03 and s["sorted"]["same_accuracy"]
    assert s["sorted"]["padding_halved"] and s["bucketed"]["padding_halved"]
    assert not s["bucketed"]["same_accuracy"]
    spread = [run("sorted", 0, 0.30, 0.14), run("sorted", 1, 0.45, 0.14)]
    wide = verdict(runs[:2] + spread)
    assert wide["sorted"]["tolerance"] == pytest.approx(0.15)
    assert wide["sorted"]["same_accuracy"]


def test_dropout_stream_changes_only_the_dropout_masks():
    task = SequenceTask("reverse", 10, 1, 6, seed=0)
    a = Run(task, "fixed", 0, 4, batch_size=8, warmup=1)
    b = Run(task, "fixed", 0, 4, batch_size=8, warmup=1, dropout_stream=1)
    pairs = zip(a.model.named_parameters(), b.model.named_parameters())
    for (n, p, _), (_, q, _) in pairs:
        assert np.array_equal(p, q), n                         # the same initial weights
    a.advance(2), b.advance(2)
    assert a.hist["loss"][0] != b.hist["loss"][0]                   # other masks


def test_sorted_training_follows_the_fixed_trajectory():
    """float64, no dropout: ten Adam steps with clipping on sorted micro-batches end at
    the parameters of ten steps on fixed batches (rounding apart): the same run, computed
    otherwise."""
    task = SequenceTask("reverse", 10, 1, 12, seed=5)

    def run(source):
        model = _model(task)
        hist = train(model, Adam(model, lr=3e-3), source, task.forward_loss, 10,
                     clip_norm=0.5, progress_bar=False)
        return hist["loss"], {n: p.copy() for n, p, _ in model.named_parameters()}
    loss_f, p_f = run(lambda i: task.batch(i, 24))
    loss_s, p_s = run(SortedTask(task, 24, 4 * task.seq_len).batch)
    assert np.allclose(loss_s, loss_f, rtol=1e-10, atol=0)
    for n, p in p_f.items():
        assert np.abs(p_s[n] - p).max() <= 1e-9 * max(1.0, np.abs(p).max()), n
