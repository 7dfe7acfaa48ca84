"""The complete Transformer (tformer/models/transformer.py) and every training feature its guide
promises, each proved.

The guide's ``validate_model()`` (output shape, parameter count, gradient flow) becomes tests, and the
gradient flow is checked against finite differences; then cross-entropy with padding, Adam,
schedules, clipping, accumulation, checkpoints (atomic, bit-exact resume), the NaN guard, greedy and
beam search, and the padded sequence task.
"""
import os

import numpy as np
import pytest

from tformer.nn import functional as F
from tformer.decoding.beam import MarkovTable, beam_search, exhaustive_search, gnmt_penalty, sequence_scores
from tformer.training.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from tformer.data.sequences import BOS, EOS, PAD, SEP, SequenceTask
from tformer.decoding.generate import greedy
from tformer.core.gradcheck import check_module
from tformer.models.transformer import Transformer, parameter_count
from tformer.training.optim import SGD, Adam, cosine_with_warmup
from tformer.training.train import NonFiniteLossError, train


def tiny(dtype=np.float64, dropout=0.0, seed=0, **kw):
    cfg = dict(vocab_size=9, d_model=8, n_heads=2, n_layers=2, d_ff=12, max_len=12)
    cfg.update(kw)
    return Transformer(dropout=dropout, seed=seed, dtype=dtype, **cfg)


def padded_tokens():
    return np.array([[1, 4, 5, 2, 5, 4, 3, 0, 0],
                     [1, 6, 7, 8, 2, 8, 7, 6, 3],
                     [1, 4, 2, 4, 3, 0, 0, 0, 0]])


# ---------------------------------------------------------------- the guide's validate_model()

def test_validate_model_output_shape():
    model = Transformer(vocab_size=1000, d_model=128, n_heads=4, n_layers=2)   # the guide's call
    ids = np.random.default_rng(0).integers(0, 1000, (2, 10))
    model.eval()
    out = model.forward(ids)
    assert out.shape == (2, 10, 1000) and out.dtype == np.float32
    assert np.isfinite(out).all()


def test_parameter_count_matches_formula_and_hand_count():
    # the guide's validate_model() config (d_ff=2048 and max_len=5000 are the guide's defaults):
    # blocks 2·(4·128² + 4·128 + 2·128·2048 + 2048 + 128 + 4·128), embedding 1000·128,
    # projection 128·1000 + 1000, final LayerNorm 2·128
    hand = 2 * (66_048 + 526_464 + 512) + 128_000 + 129_000 + 256
    assert hand == 1_443_304
    assert parameter_count(1000, 128, 2, 2048) == hand
    assert Transformer(vocab_size=1000, d_model=128, n_heads=4, n_layers=2).num_parameters() == hand
    for cfg in [dict(vocab_size=9, d_model=8, n_heads=2, n_layers=2, d_ff=12),
                dict(vocab_size=50, d_model=16, n_heads=4, n_layers=3, d_ff=64)]:
        m = Transformer(max_len=16, dropout=0.0, **cfg)
        assert m.num_parameters() == m.count_parameters()
    # the guide's Base / Large tables, for this decoder-only architecture with V = 10000
    assert parameter_count(10_000, 512, 6, 2048) == 29_165_328
    assert parameter_count(10_000, 1024, 24, 4096) == 322_801_424


def test_every_parameter_receives_a_gradient():
    model = tiny(dropout=0.1)                      # train mode, as the guide's check
    ids = padded_tokens()
    out = model.forward(ids)
    model.zero_grad()
    model.backward(np.ones_like(out))              # the guide's loss = output.sum()
    top = max(np.abs(g).max() for _, _, g in model.named_parameters())
    for name, _, g in model.named_parameters():
        if name.endswith("attn.k.b"):
            # softmax ignores a shift shared by all keys: q·(k_j + b) = q·k_j + q·b for every j,
            # so the key bias's gradient is zero in exact arithmetic (here: rounding only)
            assert np.abs(g).max() < 1e-12 * top, name
        else:
            assert np.abs(g).max() > 1e-6 * top, f"{name} gets no gradient"


def test_whole_model_gradients_match_finite_differences():
    model = tiny(dropout=0.1).eval()                                    # dropout off in eval
    ids = padded_tokens()
    targets = np.where(ids > 2, np.roll(ids, -1, axis=1), PAD)          # some targets ignored
    errs = check_module(model, ids, check_input=False,                  # every entry of every array
                        loss=lambda y: F.cross_entropy(y, targets, ignore_index=PAD))
    assert len(errs) == len(list(model.named_parameters()))
    assert max(errs.values()) < 1e-6, errs


def test_gradients_without_embedding_scale_random_upstream():
    model = tiny(scale_embedding=False, seed=1)
    errs = check_module(model, padded_tokens(), check_input=False, seed=3, max_entries=25)
    assert max(errs.values()) < 1e-6, errs


# ---------------------------------------------------------------- masks and modes

def test_padding_mask_shape_and_values():
    ids = padded_tokens()
    m = F.create_padding_mask(ids, pad_idx=0)
    assert m.shape == (3, 1, 1, 9) and m.dtype == bool
    assert np.array_equal(m[:, 0, 0], ids != 0)


def test_no_attention_reaches_a_padding_key():
    model = tiny().eval()
    ids = padded_tokens()
    model.forward(ids)
    for block in model.blocks:
        att = block.attn.att                                        # (B, H, T, T)
        pad = (ids == PAD)[:, None, None, :]
        assert np.abs(np.where(pad, att, 0.0)).max() == 0.0
        assert np.abs(np.triu(att, k=1)).max() == 0.0               # causal: no future key
        rows = att.sum(-1)
        assert np.allclose(rows, 1.0, atol=1e-12)                   # every query has a real key


def test_masked_positions_do_not_change_other_outputs():
    model = tiny().eval()
    ids = np.array([[1, 4, 5, 6, 2, 6, 5, 4]])
    mask = np.ones((1, 1, 1, 8), bool)
    mask[..., 2:4] = False                                          # treat positions 2, 3 as padding
    a = model.forward(ids, padding_mask=mask)
    ids2 = ids.copy()
    ids2[0, 2:4] = [7, 8]
    b = model.forward(ids2, padding_mask=mask)
    keep = [0, 1, 4, 5, 6, 7]
    assert np.allclose(a[:, keep], b[:, keep], rtol=0, atol=1e-12)
    c = model.forward(ids2)                                         # without the mask they do
    assert np.abs(a[:, 4:] - c[:, 4:]).max() > 1e-3


def test_causal_mask_future_tokens_do_not_matter():
    model = tiny().eval()
    ids = np.array([[1, 4, 5, 6, 7, 8]])
    ids2 = ids.copy()
    ids2[0, 4:] = [5, 5]
    a, b = model.forward(ids), model.forward(ids2)
    assert np.allclose(a[:, :4], b[:, :4], rtol=0, atol=1e-12)
    assert np.abs(a[:, 4:] - b[:, 4:]).max() > 1e-3


def test_dropout_is_on_in_train_and_off_in_eval():
    ids = padded_tokens()
    model = tiny(dropout=0.3)
    plain = tiny(dropout=0.0)                           # same seed: same weights
    assert model.training
    a, b = model.forward(ids), model.forward(ids)
    assert np.abs(a - b).max() > 1e-3                   # fresh masks each call
    model.eval()
    assert not any(m.training for m in model.blocks) and not model.drop.training
    c, d = model.forward(ids), model.forward(ids)
    assert np.array_equal(c, d)
    assert np.allclose(c, plain.eval().forward(ids), rtol=0, atol=1e-12)
    model.train()
    assert model.blocks[0].drop1.training


def test_one_generator_drives_all_dropout():
    model = tiny(dropout=0.1)
    gens = {id(model.rng), id(model.drop.rng)}
    for blk in model.blocks:
        gens |= {id(blk.drop1.rng), id(blk.drop2.rng)}
    assert gens == {id(model.rng)}


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=10, n_heads=4), "d_model"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(pad_idx=99), "pad_idx"),
])
def test_bad_configuration_raises(kwargs, match):
    cfg = dict(vocab_size=9, d_model=8, n_heads=2, n_layers=1, d_ff=8, max_len=8, dropout=0.0)
    cfg.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Transformer(**cfg)


def test_bad_tokens_raise():
    model = tiny()
    with pytest.raises(ValueError, match="max_len"):
        model.forward(np.ones((1, 13), np.int64))
    with pytest.raises(ValueError, match="tokens"):
        model.forward(np.array([[1, 9]]))
    with pytest.raises(TypeError, match="tokens"):
        model.forward(np.ones((1, 3)))
    with pytest.raises(TypeError, match="padding_mask"):
        model.forward(np.ones((1, 3), np.int64), padding_mask=np.ones((1, 1, 1, 3)))


# ---------------------------------------------------------------- the task and its loss

def test_task_rows_and_targets():
    task = SequenceTask("reverse", n_symbols=5, min_len=1, max_len=4, seed=1)
    b = task.batch(0, 8)
    assert b["inputs"].shape == b["targets"].shape == (8, 2 * 4 + 2)
    for row, tgt, n in zip(b["inputs"], b["targets"], b["lengths"]):
        x = row[1:1 + n] - 4
        assert row[0] == BOS and row[n + 1] == SEP
        assert np.array_equal(row[n + 2:2 * n + 2] - 4, x[::-1])
        expect = np.full(row.shape, PAD)
        expect[n + 1:2 * n + 1] = 4 + x[::-1]
        expect[2 * n + 1] = EOS
        assert np.array_equal(tgt, expect)                             # loss on y_1 … y_n EOS only
    assert np.array_equal(task.batch(0, 8)["inputs"], b["inputs"])      # a pure function of the index
    s = SequenceTask("sort", n_symbols=5, min_len=1, max_len=4, seed=1).batch(0, 8)
    for row, n in zip(s["inputs"], s["lengths"]):
        assert np.array_equal(row[n + 2:2 * n + 2], np.sort(row[1:1 + n]))


def test_heldout_sequences_never_appear_in_training():
    task = SequenceTask("reverse", n_symbols=4, min_len=2, max_len=4, seed=0)
    train_rows = {tuple(r) for i in range(60) for r in task.batch(i, 64)["inputs"].tolist()}
    test_rows = set()
    for n, (x, y) in task.heldout(300).items():
        assert task.is_heldout(np.pad(x, ((0, 0), (0, 4 - n))), np.full(len(x), n)).all()
        row = task.encode(np.pad(x, ((0, 0), (0, 4 - n))), np.full(len(x), n))[:, :-1]
        test_rows |= {tuple(r) for r in row.tolist()}
    n_test = sum(len(y) for _, y in task.heldout(300).values())
    assert len(train_rows) > 100 and len(test_rows) == n_test > 20        # distinct sequences
    assert not train_rows & test_rows


def test_cross_entropy_ignores_padding():
    task = SequenceTask("reverse", n_symbols=5, min_len=1, max_len=4)
    b = task.batch(3, 8)
    logits = np.random.default_rng(0).standard_normal((8, 10, task.vocab_size))
    loss, dlogits = F.cross_entropy(logits, b["targets"], ignore_index=PAD)
    keep = b["targets"] != PAD
    z = logits[keep]
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    manual = -logp[np.arange(len(z)), b["targets"][keep]].mean()
    assert abs(loss - manual) < 1e-12
    assert np.abs(dlogits[~keep]).max() == 0.0                          # no gradient at padding
    logits2 = logits.copy()
    logits2[~keep] += 100 * np.random.default_rng(1).standard_normal(logits2[~keep].shape)
    assert abs(F.cross_entropy(logits2, b["targets"], ignore_index=PAD)[0] - loss) < 1e-12


# ---------------------------------------------------------------- training features

def _setup(dtype=np.float64, dropout=0.0, seed=0):
    task = SequenceTask("reverse", n_symbols=4, min_len=1, max_len=4, seed=seed)
    model = Transformer(vocab_size=task.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                        max_len=task.seq_len, dropout=dropout, seed=seed, dtype=dtype)
    return task, model


def test_adam_with_warmup_learns_the_task_loss():
    task, model = _setup(dtype=np.float32)
    opt = Adam(model, lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    hist = train(model, opt, lambda i: task.batch(i, 32), task.forward_loss, 60, clip_norm=1.0,
                 lr_schedule=lambda s: cosine_with_warmup(s, 3e-3, 10, 60), progress_bar=False)
    assert hist["lr"][9] == pytest.approx(3e-3) and hist["lr"][0] == pytest.approx(3e-4)
    first, last = np.mean(hist["loss"][:5]), np.mean(hist["loss"][-5:])
    assert last < 0.75 * first, (first, last)


def test_run_schedules_peak_at_lr_at_warmup():
    from argparse import Namespace

    from tformer.runs.transformer import make_schedule
    for name in ("noam", "cosine"):
        lr = make_schedule(Namespace(schedule=name, lr=2e-3, warmup=50, steps=500))
        values = np.array([lr(s) for s in range(1, 501)])
        assert values.argmax() + 1 == 50 and values.max() == pytest.approx(2e-3, rel=1e-12)
    guide = make_schedule(Namespace(schedule="noam", lr=2e-3, warmup=50, steps=500))
    for s in (1, 17, 50, 51, 400):                       # lr·√w · min(s^-0.5, s·w^-1.5), the guide's factor
        assert guide(s) == pytest.approx(2e-3 * 50 ** 0.5 * min(s ** -0.5, s * 50 ** -1.5), rel=1e-12)


def test_clipping_logs_the_norm_before_and_bounds_the_update():
    task, model = _setup()
    w0 = {n: p.copy() for n, p, _ in model.named_parameters()}
    lr, clip = 0.1, 1e-3
    hist = train(model, SGD(model, lr=lr), lambda i: task.batch(i, 16), task.forward_loss, 1,
                 clip_norm=clip, progress_bar=False)
    assert hist["grad_norm"][0] > 100 * clip                            # logged before clipping
    step = np.sqrt(sum(((p - w0[n]) ** 2).sum() for n, p, _ in model.named_parameters()))
    assert step == pytest.approx(lr * clip, rel=1e-9)                   # the update used ‖g‖ = clip


def _big_batch(task, micro, k, make=None):
    make = make or (lambda i, micro: task.batch(i, micro))

    def batch(i):
        parts = [make(i * k + j, micro) for j in range(k)]
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    return batch


def _after(task, batch_fn, accum, steps=3):
    _, model = _setup(seed=0)
    train(model, SGD(model, lr=0.5), batch_fn, task.forward_loss, steps, accum_steps=accum,
          progress_bar=False)
    return {n: p.copy() for n, p, _ in model.named_parameters()}


def test_gradient_accumulation_equals_one_large_batch():
    task, _ = _setup()
    k, micro = 4, 8                  # 8 rows = each length 1..4 twice: same token count per micro-batch
    a = _after(task, lambda i: task.batch(i, micro), accum=k)
    b = _after(task, _big_batch(task, micro, k), accum=1)
    for n in a:
        assert np.allclose(a[n], b[n], rtol=1e-10, atol=1e-12), n
    # with micro-batches of unequal token counts the mean of means is a different weighting
    def one_length(i, micro=8):                      # micro-batch i: every row of length 1 + i mod 4
        return task.batch(i, micro, lengths=np.full(micro, 1 + i % 4))
    c = _after(task, one_length, accum=k)
    d = _after(task, _big_batch(task, micro, k, one_length), accum=1)
    assert max(np.abs(c[n] - d[n]).max() for n in c) > 1e-6


def _run(model, opt, task, steps, start=0, path=None, every=0):
    return train(model, opt, lambda i: task.batch(i, 16), task.forward_loss, steps, start_step=start,
                 clip_norm=1.0, lr_schedule=lambda s: cosine_with_warmup(s, 3e-3, 2, 8),
                 checkpoint_path=path, checkpoint_every=every, progress_bar=False)


def test_resume_from_checkpoint_is_bit_exact(tmp_path):
    path = tmp_path / "ck.npz"
    task, full = _setup(dtype=np.float32, dropout=0.2)
    h_full = _run(full, Adam(full, lr=1e-3), task, 8)

    _, first = _setup(dtype=np.float32, dropout=0.2)
    _run(first, Adam(first, lr=1e-3), task, 4, path=path, every=4)
    meta, state, _ = read_checkpoint(path)
    assert meta["step"] == 4 and meta["config"] == first.config and meta["rng_state"] is not None

    _, resumed = _setup(dtype=np.float32, dropout=0.2)                  # a fresh process would do this
    opt = Adam(resumed, lr=1e-3)
    start = load_checkpoint(path, resumed, opt)["step"]
    assert opt.t == 4
    h_res = _run(resumed, opt, task, 8, start=start)
    assert h_res["loss"] == h_full["loss"][4:]                          # identical floats
    for (n, p, _), (_, q, _) in zip(full.named_parameters(), resumed.named_parameters()):
        assert np.array_equal(p, q), n

    _, forgetful = _setup(dtype=np.float32, dropout=0.2)                # the dropout stream matters:
    opt = Adam(forgetful, lr=1e-3)
    load_checkpoint(path, forgetful, opt)
    forgetful.rng.bit_generator.state = np.random.default_rng(123).bit_generator.state
    _run(forgetful, opt, task, 8, start=4)
    assert not all(np.array_equal(p, q) for (_, p, _), (_, q, _)
                   in zip(full.named_parameters(), forgetful.named_parameters()))


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "ck.npz"
    task, model = _setup()
    save_checkpoint(path, model, Adam(model), step=1)
    before = path.read_bytes()

    def broken(f, **arrays):
        f.write(b"half a checkpoint")
        raise OSError("disk full")
    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, Adam(model), step=2)
    monkeypatch.undo()
    assert path.read_bytes() == before                                  # the old file is intact
    assert os.listdir(tmp_path) == ["ck.npz"]                           # no temporary file left
    assert read_checkpoint(path)[0]["step"] == 1


def test_checkpoint_refuses_another_config(tmp_path):
    path = tmp_path / "ck.npz"
    task, model = _setup()
    save_checkpoint(path, model, step=0)
    other = Transformer(vocab_size=task.vocab_size, d_model=16, n_heads=4, n_layers=1, d_ff=32,
                        max_len=task.seq_len, dropout=0.0, dtype=np.float64)
    with pytest.raises(ValueError, match="n_heads"):
        load_checkpoint(path, other)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    path = tmp_path / "ck.npz"
    task, model = _setup(dtype=np.float32)
    saved = {}

    def forward_loss(m, batch):
        if batch["index"] == 4:                         # step 5: a weight blows up (simulated)
            saved.update(m.state_dict())
            m.proj.W[0, 0] = np.inf
        return task.forward_loss(m, batch)

    def batch(i):
        return dict(task.batch(i, 16), index=i)

    with pytest.raises(NonFiniteLossError) as err:
        train(model, Adam(model, lr=1e-3), batch, forward_loss, 10, checkpoint_path=path,
              checkpoint_every=2, progress_bar=False)
    msg = str(err.value)
    assert "step 5" in msg and "ck.npz" in msg and "the last good checkpoint" in msg
    meta, state, _ = read_checkpoint(path)
    assert meta["step"] == 4
    for name, value in state.items():
        assert np.isfinite(value).all() and np.array_equal(value, saved[name]), name


# ---------------------------------------------------------------- decoding

@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("stop", [None, 3])
def test_beam_width_one_is_greedy(seed, stop):
    model = Transformer(vocab_size=6, d_model=8, n_heads=2, n_layers=2, d_ff=16, max_len=16,
                        dropout=0.2, seed=seed, pad_idx=None)
    prompt = np.random.default_rng(seed).integers(0, 6, (4, 3))
    g = greedy(model, prompt, 8, stop_token=stop)
    b = beam_search(model, prompt, 1, 8, length_penalty=0.6, stop_token=stop)
    assert np.array_equal(g, b)
    assert model.training                                               # mode restored


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_search_finds_the_exhaustive_optimum(seed, alpha):
    V, L, stop = 3, 4, 2
    model = Transformer(vocab_size=V, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=8,
                        dropout=0.0, seed=seed, dtype=np.float64, pad_idx=None)
    prompt = np.array([seed % V, 1])
    best, score = exhaustive_search(model, prompt, L, alpha, stop)
    # width ≥ all live hypotheses ((V−1)^(t−1)·V candidates per step): nothing is ever pruned
    found, s = beam_search(model, prompt[None], (V - 1) ** (L - 1) * V, L, alpha, stop, return_scores=True)
    assert s[0] == pytest.approx(score, abs=1e-12)
    row = found[0]
    cut = np.flatnonzero(row[2:] == stop)
    row = row[:2 + cut[0] + 1] if cut.size else row
    assert np.array_equal(row, best)
    # and a small beam's answer is never better than the optimum
    _, s4 = beam_search(model, prompt[None], 2, L, alpha, stop, return_scores=True)
    assert s4[0] <= score + 1e-12


def test_constructed_case_where_beam_beats_greedy():
    # tokens: 0 = start, 1 = "a", 2 = "b", 3 = EOS, 4/5/6 = three fillers.
    # p(a|start) = 0.55, p(b|start) = 0.45; after a the mass is spread, after b EOS is certain-ish.
    P = np.full((7, 7), 1e-9)
    P[0, 1], P[0, 2] = 0.55, 0.45
    P[1, 4:7] = 1 / 3
    P[2, 3] = 0.95
    P[2, 4] = 0.05
    P[4:7, 3] = 1.0
    P[3, 3] = 1.0
    model = MarkovTable(np.log(P / P.sum(1, keepdims=True)))
    prompt = np.array([[0]])
    g = greedy(model, prompt, 3, stop_token=3)
    b, sb = beam_search(model, prompt, 2, 3, length_penalty=0.0, stop_token=3, return_scores=True)
    best, score = exhaustive_search(model, prompt[0], 3, 0.0, stop_token=3)
    sg, _ = sequence_scores(model, prompt[0], g[:, 1:], 0.0, stop_token=3)
    assert g[0, 1] == 1 and b[0, 1] == 2                                # greedy takes "a", beam "b"
    assert np.array_equal(b[0, :3], best) and sb[0] == pytest.approx(score)
    assert np.exp(score) == pytest.approx(0.45 * 0.95, rel=1e-6)
    assert np.exp(sg[0]) == pytest.approx(0.55 / 3, rel=1e-6)          # 0.183 < 0.428


def test_length_penalty_values():
    assert gnmt_penalty(1, 0.6) == pytest.approx(1.0)
    assert gnmt_penalty(11, 1.0) == pytest.approx(16 / 6)
    assert gnmt_penalty(7, 0.0) == 1.0


def test_beam_search_bad_arguments():
    model = tiny()
    p = np.array([[1, 2]])
    with pytest.raises(ValueError, match="beam_width"):
        beam_search(model, p, 0, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        beam_search(model, p, 2, 0)
    with pytest.raises(ValueError, match="length_penalty"):
        beam_search(model, p, 2, 3, length_penalty=-1.0)
    with pytest.raises(TypeError, match="prompt"):
        beam_search(model, p.astype(float), 2, 3)


def test_exact_match_counts_only_exact_answers():
    task = SequenceTask("reverse", n_symbols=5, min_len=2, max_len=3)
    y = np.array([[1, 2], [3, 4], [0, 0]])
    gen = np.array([[5, 6, EOS, EOS], [7, 8, 4, EOS], [4, 4, EOS, EOS]])
    assert task.correct(gen, y).tolist() == [True, False, True]


# ---------------------------------------------------------------- the command line

def test_run_transformer_cli(tmp_path, capsys):
    from tformer.__main__ import main
    path = tmp_path / "ck.npz"
    argv = ["run", "transformer", "--steps", "12", "--warmup", "3", "--max-len", "4", "--d-model", "16",
            "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--batch-size", "16", "--eval-size", "40",
            "--eval-every", "6", "--checkpoint", str(path), "--checkpoint-every", "6", "--no-progress",
            "--target", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "greedy" in out and "beam (k=4" in out and "exact match" in out
    assert read_checkpoint(path)[0]["step"] == 12
    assert main(argv[:-2] + ["--steps", "14", "--resume", "--target", "1"]) == 1      # target missed
    assert "resumed from" in capsys.readouterr().out
    assert read_checkpoint(path)[0]["step"] == 14


# ---------------------------------------------------------------- PyTorch as an independent oracle

@pytest.mark.torch_parity
def test_matches_pytorch_transformer_encoder_layers():
    """The same weights in torch.nn.TransformerEncoderLayer (post-norm, ReLU) give the same logits,
    loss and parameter gradients, in float64, with the causal and the padding mask."""
    torch = pytest.importorskip("torch")
    model = tiny(dropout=0.1).eval()
    ids = padded_tokens()
    targets = np.where(ids > 2, np.roll(ids, -1, axis=1), PAD)
    C, T = 8, ids.shape[1]

    def tt(a):
        return torch.tensor(np.ascontiguousarray(a), dtype=torch.float64)

    layers = []
    for blk in model.blocks:
        layer = torch.nn.TransformerEncoderLayer(C, 2, dim_feedforward=12, dropout=0.0, batch_first=True,
                                                 dtype=torch.float64)
        a = blk.attn
        with torch.no_grad():
            layer.self_attn.in_proj_weight.copy_(tt(np.concatenate([a.q.W.T, a.k.W.T, a.v.W.T])))
            layer.self_attn.in_proj_bias.copy_(tt(np.concatenate([a.q.b, a.k.b, a.v.b])))
            layer.self_attn.out_proj.weight.copy_(tt(a.o.W.T))
            layer.self_attn.out_proj.bias.copy_(tt(a.o.b))
            for lin, ours in ((layer.linear1, blk.ffn.fc1), (layer.linear2, blk.ffn.fc2)):
                lin.weight.copy_(tt(ours.W.T))
                lin.bias.copy_(tt(ours.b))
            for ln, ours in ((layer.norm1, blk.ln1), (layer.norm2, blk.ln2)):
                ln.weight.copy_(tt(ours.gamma))
                ln.bias.copy_(tt(ours.beta))
        layers.append(layer.train())              # train mode with p = 0: the plain (slow) path
    E = tt(model.embed.W).requires_grad_()
    Wout, bout = tt(model.proj.W.T).requires_grad_(), tt(model.proj.b).requires_grad_()
    x = E[torch.tensor(ids)] * C ** 0.5 + tt(F.sinusoidal_positions(T, C, np.float64))
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)          # True = may NOT attend
    for layer in layers:
        x = layer(x, src_mask=causal, src_key_padding_mask=torch.tensor(ids == PAD))
    x = torch.nn.functional.layer_norm(x, (C,), tt(model.ln_f.gamma), tt(model.ln_f.beta))
    logits_t = x @ Wout.T + bout
    loss_t = torch.nn.functional.cross_entropy(logits_t.reshape(-1, 9), torch.tensor(targets).reshape(-1),
                                               ignore_index=PAD)
    loss_t.backward()

    logits = model.forward(ids)
    loss, dlogits = F.cross_entropy(logits, targets, ignore_index=PAD)
    model.zero_grad()
    model.backward(dlogits)
    np.testing.assert_allclose(logits, logits_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert abs(loss - loss_t.item()) < 1e-12
    np.testing.assert_allclose(model.embed.grads["W"], E.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.proj.grads["W"], Wout.grad.numpy().T, rtol=1e-9, atol=1e-12)
    a, layer = model.blocks[0].attn, layers[0]
    dW_in = np.concatenate([a.q.grads["W"].T, a.k.grads["W"].T, a.v.grads["W"].T])
    np.testing.assert_allclose(dW_in, layer.self_attn.in_proj_weight.grad.numpy(), rtol=1e-8, atol=1e-11)
    np.testing.assert_allclose(model.blocks[1].ffn.fc1.grads["W"].T, layers[1].linear1.weight.grad.numpy(),
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.blocks[1].ln2.grads["gamma"], layers[1].norm2.weight.grad.numpy(),
                               rtol=1e-9, atol=1e-12)
