"""``python -m tformer decoding``: speculative decoding and the samplers, measured on the long run's model.

    α = E_x[Σ_v min(p_v, q_v)]                          acceptance rate (p: target, q: draft)
    E[tokens per round] = (1 − α^{k+1}) / (1 − α)       k drafts proposed a round
    S = (1 − α^{k+1}) / ((1 − α)(c·k + 1))              Leviathan et al. 2023, c = draft/target step

**The target** is the book's long-run model, TinyGPT 3x128 on the 8,192 BPE tokens of the 38
plays, as it is shipped to readers: int8 weights (``w8``), ``long_run.load_shipped``, the model a
reader decodes with ``generate --draft``. Its int8 layers turn their weights back into float32 at
every call, a cost that does not grow with the positions a pass scores; the same weights in
float32 (``dequantized``), with float32 drafts, are measured beside it.
``--target`` takes another checkpoint of the same shape instead.

**The drafts** are smaller TinyGPTs of the same tokenizer, trained by this command when their file
is missing, with the scaling sweep's recipe and seed (``scaling_sweep.build``, ``schedule``):
``DRAFTS`` lists their shapes and budgets (two of them are runs of the sweep itself: the result
records the sweep's loss beside theirs), and each is shipped with int8 weights in ``book/data``.

**What is measured**, at batch 1 and within the target's context of 64 tokens (a prompt of
``PROMPT_TOKENS`` tokens of the yardstick and ``NEW_TOKENS`` new ones: beyond the context
``speculative_sample`` falls back to plain sampling, which is not what is measured here):

- α, exactly, as the mean overlap Σ_v min(p_v, q_v) along texts the target sampled, and as counted
  by the rounds (``Stats``) at every lookahead k in ``LOOKAHEADS``;
- the time of plain KV decoding (``generate.sample``) of the target and of each draft, and of
  speculative decoding for every draft and k, in interleaved rounds (``timing.interleaved``), the
  same sampler settings for both, at temperature 1 and greedy (``--modes``); c is the ratio of the
  draft's time per token to the target's, and the cost of verifying k + 1 tokens in one pass of the
  target is timed too;
- the samplers (``SAMPLERS``) on the target: the share of the words of their samples that are
  words of the plays, repetition (distinct word n-grams within a sample), and the target's own
  log-likelihood per token of what it wrote.
"""
import copy
import os
import time

import numpy as np

from tformer.decoding import kv_cache
from tformer.core import parallel
from tformer.core.atomic import write_json
from tformer.decoding.generate import sample
from tformer.models.tinygpt import TinyGPT
from tformer.runs.flags import UsageError
from tformer.runs.declare import may_read, reads, updates, writes
from tformer.decoding.samplers import probabilities
from tformer.fast.losses import log_softmax, token_logp
from tformer.decoding.quantize import dequantized
from tformer.decoding.speculative import speculative_sample
from tformer.core.provenance import load_average, now, record
from tformer.experiments.scaling_sweep import RECIPE, model_config, shape_name, train_model
from tformer.core.timing import interleaved

DEFAULT_OUT = "book/data/decoding.json"
DATA = "book/data"
SWEEP = "book/data/scaling_sweep.json"
# (shape, budget in FLOPs): the sweep's recipe at a budget where the shape is near its best; the
# 2x32 and 2x48 runs are the sweep's own (V8192, seed 0), so their loss is known beforehand.
DRAFTS = (((1, 32), 2.5e12), ((2, 32), 6.3e12), ((2, 48), 1.6e13))
LOOKAHEADS = (1, 2, 3, 4, 5, 6)
PROMPT_TOKENS, NEW_TOKENS = 8, 56          # 64 tokens in all: the target's whole context
MODES = {"sample": dict(temperature=1.0), "greedy": dict(temperature=0.0)}
SAMPLERS = {"greedy": dict(temperature=0.0), "T=0.5": dict(temperature=0.5),
            "T=0.8": dict(temperature=0.8), "T=1": dict(temperature=1.0),
            "top-k 20": dict(top_k=20), "top-p 0.9": dict(top_p=0.9),
            "min-p 0.05": dict(min_p=0.05), "min-p 0.1": dict(min_p=0.1),
            "T=1.5": dict(temperature=1.5), "T=1.5, min-p 0.1": dict(temperature=1.5, min_p=0.1)}


def draft_path(shape, folder=DATA):
    """Where the draft of ``shape`` is shipped: ``decoding_draft_LxC.npz`` (int8 weights)."""
    return os.path.join(folder, f"decoding_draft_{shape_name(shape)}.npz")


def draft_run(shape, budget, vocab_size, recipe=RECIPE, seed=0):
    """The run of a draft, as the sweep plans one: ``steps = round(budget / (f·B·T))``."""
    from tformer.experiments.scaling_sweep import flops_per_token, run_key, weights
    T, B = recipe["block_size"], recipe["batch_size"]
    f = flops_per_token(shape, vocab_size, T)
    steps = max(1, round(budget / (f * B * T)))
    run = dict(shape=list(shape), vocab_size=vocab_size, block_size=T, batch_size=B,
               budget=float(budget), seed=seed, lr=recipe["lr"], n_weights=weights(shape, vocab_size),
               steps=steps, tokens=steps * B * T, flops=steps * B * T * f)
    run["key"] = run_key(run)
    return run


def train_draft(run, corpus, recipe=RECIPE):
    """``(model, record)``: the float TinyGPT of ``run`` trained with the sweep's recipe, and its
    seconds and nats per character of the yardstick."""
    model, _, seconds, _ = train_model(run, corpus, recipe)
    val = corpus.nats_per_char(model.eval(), run["block_size"])
    return model, dict(run, seconds=seconds, val_nats_per_char=val, params=model.num_parameters(),
                       threads=parallel.get_num_threads(), finished=now())


def ship_draft(model, rec, corpus, path):
    """Write the draft with int8 weights (and its run, its tokenizer's fingerprint) to ``path``;
    the record gains the int8 model's nats per character, the file's path and size."""
    from tformer.runs.files import tokenizer_record
    from tformer.decoding.quantize import quantize_model, save_quantized
    q = quantize_model(copy.deepcopy(model), "w8")
    rec = dict(rec, w8_val_nats_per_char=corpus.nats_per_char(q, rec["block_size"]))
    save_quantized(path, q, step=rec["steps"],
                   extra=dict(run=rec, tokenizer=tokenizer_record(corpus.tokenizer)))
    return dict(rec, path=path, bytes=os.path.getsize(path))


def load_draft(path, vocab_size, block_size):
    """``(model, record)``: a shipped draft (int8), and the run its file records with the file's
    path and size."""
    from tformer.training.checkpoint import read_checkpoint
    from tformer.decoding.quantize import load_model
    meta = read_checkpoint(path)[0]
    run = dict(meta["extra"]["run"], tokenizer=meta["extra"]["tokenizer"], path=path,
               bytes=os.path.getsize(path))
    model = TinyGPT(**model_config(run["shape"], vocab_size, block_size), seed=0)
    load_model(path, model)
    return model.eval(), run


def ensure_drafts(drafts, corpus_fn, vocab_size, block_size, folder=DATA, log=print):
    """``[(model, record)]`` for every ``(shape, budget)``: read from its file, or trained and
    shipped there first (``corpus_fn()`` gives the corpus, prepared only when one is missing)."""
    out, corpus = [], None
    for shape, budget in drafts:
        path = draft_path(shape, folder)
        if not os.path.exists(path):
            corpus = corpus or corpus_fn()
            run = draft_run(shape, budget, vocab_size)
            log(f"training the draft {shape_name(shape)}: {run['steps']:,} steps "
                f"({budget:.3g} FLOPs)")
            model, rec = train_draft(run, corpus)
            rec = ship_draft(model, rec, corpus, path)
            log(f"  {rec['val_nats_per_char']:.4f} nats/char (int8: {rec['w8_val_nats_per_char']:.4f}), "
                f"{rec['seconds']:.0f} s, {rec['bytes']:,} bytes -> {path}")
        out.append(load_draft(path, vocab_size, block_size))
    return out


# --- what the samplers write ------------------------------------------------------------------

def distinct(words, n):
    """Distinct-n: the share of a text's word n-grams that are different (1: no n-gram repeats);
    NaN for a text of fewer than n words."""
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def log_likelihood(model, tokens, start):
    """ln p(x_t | x_<t) under ``model``'s own distribution (temperature 1, no filter), for the
    tokens from position ``start`` on: ``tokens: (B, T)`` -> ``(B, T − start)``."""
    logp = log_softmax(model.forward(tokens[:, :-1]).astype(np.float64))       # (B, T − 1, V)
    picked = token_logp(logp, tokens[:, 1:])                                   # (B, T − 1)
    return picked[:, start - 1:]


def text_measures(texts, tokens, start, model, vocab):
    """Word share, distinct-1/2/3 (mean over texts) and the model's ln p per token of
    ``tokens[:, start:]``, the tokens that spell ``texts``."""
    from tformer.data.words import share, words
    known = total = 0
    for t in texts:
        k, n = share(t, vocab)
        known, total = known + k, total + n
    ws = [words(t) for t in texts]
    ll = log_likelihood(model, tokens, start)
    return dict(word_share=known / max(total, 1), words=total,
                **{f"distinct_{n}": float(np.nanmean([distinct(w, n) for w in ws])) for n in (1, 2, 3)},
                log_likelihood=float(ll.mean()), log_likelihood_sd=float(ll.mean(axis=1).std()))


def compare_samplers(model, tokenizer, vocab, samplers=SAMPLERS, n=64, seed=0, shown=3):
    """Every sampler's measures on ``n`` samples that fill the context after a newline, with the
    same seed (the same uniform numbers), the first ``shown`` texts and every sample's tokens."""
    prompt = np.tile(tokenizer.encode(b"\n").astype(np.int64)[None], (n, 1))   # (n, P)
    P, new = prompt.shape[1], model.max_len - prompt.shape[1]
    rows = []
    for name, s in samplers.items():
        out = sample(model, prompt, new, seed=seed, **s)                       # (n, max_len)
        texts = [tokenizer.decode(r[P:].tolist()) for r in out]
        rows.append(dict(name=name, settings=s, **text_measures(texts, out, P, model, vocab),
                         texts=texts[:shown], tokens=out.tolist()))
    return rows


def reference_text(model, tokenizer, ids, vocab, n=64):
    """The same measures on ``n`` windows of the plays' own text (the yardstick), context-long."""
    T = model.max_len
    starts = np.linspace(0, ids.size - T - 1, n).astype(np.int64)
    win = ids[starts[:, None] + np.arange(T)].astype(np.int64)                 # (n, T)
    texts = [tokenizer.decode(r[1:].tolist()) for r in win]
    return dict(name="the plays", **text_measures(texts, win, 1, model, vocab), texts=texts[:3])


# --- acceptance -----------------------------------------------------------------------------

def overlap(target, draft, tokens, start, filters, chunk=8):
    """Σ_v min(p_v, q_v) at every position from ``start`` on, p and q the filtered next-token
    distributions of target and draft after ``tokens[:, :t]``: the chance that a draft token is
    accepted there. ``tokens: (B, T)`` -> ``(B, T − start)``, ``chunk`` sequences at a time."""
    V, out = target.config["vocab_size"], []
    for i in range(0, tokens.shape[0], chunk):
        x = tokens[i:i + chunk, :-1]                                           # (b, T − 1)
        p = probabilities(target.forward(x)[:, start - 1:].reshape(-1, V), **filters)
        q = probabilities(draft.forward(x)[:, start - 1:].reshape(-1, V), **filters)
        out.append(np.minimum(p, q).sum(axis=-1).reshape(x.shape[0], -1))
    return np.concatenate(out)


def tokens_per_round(alpha, k):
    """E[tokens a round writes] = Σ_{i=0}^{k} α^i = (1 − α^{k+1}) / (1 − α) (k + 1 at α = 1)."""
    return float(sum(alpha ** i for i in range(k + 1)))


def predicted_speedup(alpha, k, c):
    """Leviathan et al. (2023), Theorem 3.8: (1 − α^{k+1}) / ((1 − α)(c·k + 1))."""
    return tokens_per_round(alpha, k) / (c * k + 1)


# --- time -----------------------------------------------------------------------------------

def prompts_of(ids, n, length=PROMPT_TOKENS):
    """``n`` prompts ``(1, length)`` cut from ``ids`` at evenly spaced places."""
    starts = np.linspace(0, ids.size - length - 1, n).astype(np.int64)
    return [ids[s:s + length].astype(np.int64)[None] for s in starts]


def pass_seconds(model, prompt, ns, filters, rounds):
    """``{n: median seconds}`` of one pass of ``model`` over ``n`` new tokens after ``prompt``
    through its KV cache, with the filtered distributions of the n positions (what a round's
    verification costs the target for n = k + 1, and one plain step for n = 1), the ``ns``
    interleaved round by round."""
    caches = kv_cache.new_caches(model, 1)
    model.forward(prompt, kv_cache=caches)
    start = prompt.shape[1]

    def one(n):
        fed = np.arange(1, n + 1, dtype=np.int64)[None]
        def run():
            for c in caches:
                c.crop(start)
            probabilities(model.forward(fed, kv_cache=caches)[0], **filters)
        return run
    times = interleaved({n: one(n) for n in ns}, rounds)
    return {str(n): float(np.median(t)) for n, t in times.items()}


def time_decoding(target, drafts, prompts, new_tokens, modes, lookaheads, rounds):
    """Seconds of every way of decoding the prompts, in interleaved rounds: plain KV sampling of the
    target and of each draft, and speculative decoding with each draft and k; the ``Stats`` of every
    speculative run (the same in every round: each prompt has its own seed)."""
    fns, stats = {}, {}

    def plain(model, filters):
        return lambda: [sample(model, p, new_tokens, seed=i, **filters) for i, p in enumerate(prompts)]

    def speculative(draft, k, filters, key):
        def run():
            stats[key] = [speculative_sample(target, draft, p, new_tokens, k, seed=i, **filters)[1]
                          for i, p in enumerate(prompts)]
        return run

    for mode, filters in modes.items():
        fns[(mode, "target")] = plain(target, filters)
        for name, d in drafts.items():
            fns[(mode, name)] = plain(d, filters)
            for k in lookaheads:
                fns[(mode, name, k)] = speculative(d, k, filters, (mode, name, k))
    return interleaved(fns, rounds), stats


def speed_summary(times, stats, modes, drafts, lookaheads, alphas, n_tokens):
    """Per mode: the target's and each draft's plain seconds per token (median over rounds), c,
    and for every draft and k the measured α, tokens per round, tokens/s, speed-up and the paper's
    prediction from the exact α and the measured c."""
    med = {key: float(np.median(v)) / n_tokens for key, v in times.items()}   # seconds per token
    out = {}
    for mode in modes:
        t_p = med[(mode, "target")]
        rows = []
        for name in drafts:
            c = med[(mode, name)] / t_p
            for k in lookaheads:
                st = stats[(mode, name, k)]
                acc = sum(sum(s.accepted) for s in st)
                tested = sum(sum(min(n, a + 1) for n, a in zip(s.proposed, s.accepted)) for s in st)
                rounds = sum(len(s.proposed) for s in st)
                assert all(s.plain == 0 for s in st), "measured within the target's context"
                rows.append(dict(draft=name, k=k, c=c, alpha_exact=alphas[mode][name],
                                 alpha_counted=acc / tested, accepted=acc, tested=tested,
                                 rounds=rounds, tokens_per_round=n_tokens / rounds,
                                 seconds_per_token=med[(mode, name, k)],
                                 tokens_per_second=1 / med[(mode, name, k)],
                                 speedup=t_p / med[(mode, name, k)],
                                 predicted=predicted_speedup(alphas[mode][name], k, c)))
        out[mode] = dict(target_seconds_per_token=t_p, target_tokens_per_second=1 / t_p,
                         draft_seconds_per_token={n: med[(mode, n)] for n in drafts},
                         c={n: med[(mode, n)] / t_p for n in drafts}, rows=rows,
                         rounds_seconds={"/".join(map(str, key)): v for key, v in times.items()
                                         if key[0] == mode})
    return out


def add_arguments(p):
    """The command's flags."""
    from tformer.runs.flag_groups import Flag, add_data_flags, add_output_flags, add_timing_flags
    add_output_flags(p, out=DEFAULT_OUT)
    p.add_argument("--target", default=None,
                   help="a TinyGPT checkpoint (float or int8) of the long run's shape to measure "
                        "instead of the shipped int8 model")
    add_data_flags(p, tokenizer=Flag(None, "with --target: its tokenizer (JSON); default: the "
                                           "shipped one if it exists, else the sweep's tokenizer "
                                           "trained anew"))
    p.add_argument("--drafts", default=DATA, help="the folder of the drafts (trained if missing)")
    p.add_argument("--modes", nargs="+", choices=sorted(MODES), default=list(MODES),
                   help="decoding settings to time: sampling at temperature 1, greedy")
    p.add_argument("--prompts", type=_prompt_count, default=16, help="prompts timed per round")
    add_timing_flags(p, rounds=3)
    p.add_argument("--texts", type=_prompt_count, default=64,
                   help="target-sampled texts on which α is computed exactly")


# The most prompts cut from the yardstick (--prompts, --texts): 4,096, 64 times the default
# --texts; each is sampled or timed, one after the other.
MAX_PROMPTS = 4096


def _prompt_count(text):
    from tformer.runs.flags import _number
    return _number(text, int, f"an integer from 1 to {MAX_PROMPTS:,} (prompts cut from the "
                              f"yardstick)", lambda v: 1 <= v <= MAX_PROMPTS)


def files(args):
    """What the command reads and writes (``tformer.runs.declare``): ``--target`` (default: the
    long run's shipped model), the long run's plan, the tokenizer, the sweep (if present), the
    drafts of ``--drafts`` (read, or trained and written there), ``--out``."""
    from tformer.experiments.long_run import DEFAULT_OUT as PLAN, SHIPPED_MODEL, SHIPPED_TOKENIZER
    if args.target is None:
        model = reads("--target (default: the long run's model)", SHIPPED_MODEL)
        tokenizer = reads("--target's tokenizer (the long run's)", SHIPPED_TOKENIZER)
    else:
        model = reads("--target", args.target)
        tokenizer = reads("--tokenizer", args.tokenizer) if args.tokenizer else \
            may_read("--tokenizer (default: the long run's)", SHIPPED_TOKENIZER)
    drafts = [updates(f"--drafts ({shape_name(shape)})", draft_path(shape, args.drafts))
              for shape, _ in DRAFTS]
    return [model, tokenizer, reads("the long run's plan", PLAN), may_read("the sweep", SWEEP),
            *drafts, writes("--out", args.out)]


def check_flags(args):
    """``--tokenizer`` goes with ``--target`` (the shipped model reads its own)."""
    if args.tokenizer is not None and args.target is None:
        raise ValueError("--tokenizer: the tokenizer of --target; the shipped model reads its "
                         "own, expected --target with it")


def load_target(args):
    """``(model, tokenizer, kind)``: the shipped int8 model, or ``--target``."""
    from tformer.data.bpe import BPETokenizer
    from tformer.experiments.long_run import DEFAULT_OUT as PLAN, SHIPPED_TOKENIZER, load_shipped_model
    if args.target is None:
        model, tok = load_shipped_model("decoding")
        return model, tok, "w8"
    import json
    from tformer.runs.files import MALFORMED, load_tokenizer_file
    from tformer.decoding.quantize import load_model
    with open(PLAN, encoding="utf-8") as f:
        plan = json.load(f)["plan"]
    model = TinyGPT(**model_config(plan["shape"], plan["vocab_size"], plan["block_size"]), seed=0)
    try:
        load_model(args.target, model)
    except MALFORMED as e:
        raise UsageError(f"--target: expected a TinyGPT checkpoint (float or int8) of the long "
                         f"run's shape, got {args.target!r}: {str(e).removeprefix('path: ')}") \
            from None
    path = args.tokenizer or (SHIPPED_TOKENIZER if os.path.exists(SHIPPED_TOKENIZER) else None)
    if path is not None:
        tok = load_tokenizer_file("--tokenizer", path)
        if tok.vocab_size != plan["vocab_size"]:
            raise UsageError(f"--tokenizer: expected a tokenizer of the model's "
                             f"{plan['vocab_size']} tokens, got {tok.vocab_size} in {path!r}")
    else:
        from tformer.experiments.scaling_corpus import prepare
        tok = prepare(plan["vocab_size"]).tokenizer
    return model.eval(), tok, getattr(model, "quantization", None) or "float32"


def measure_pair(target, drafts, ids, alpha_modes, modes, args):
    """α (exact, on ``args.texts`` texts the target wrote, for every mode of ``alpha_modes``) and
    the timings of ``time_decoding`` (``modes``) with their summary, for one target and its drafts."""
    texts = np.concatenate(prompts_of(ids, args.texts))                        # (n, P)
    alphas, alpha_texts = {}, {}
    for mode, filters in alpha_modes.items():
        written = sample(target, texts, NEW_TOKENS, seed=0, **filters)          # (n, T)
        alpha_texts[mode] = written.tolist()
        alphas[mode] = {n: float(overlap(target, d, written, PROMPT_TOKENS, filters).mean())
                        for n, d in drafts.items()}
        print(f"{mode}: α = " + ", ".join(f"{n} {a:.3f}" for n, a in alphas[mode].items()), flush=True)
    prompts = prompts_of(ids, args.prompts)
    times, stats = time_decoding(target, drafts, prompts, NEW_TOKENS, modes, LOOKAHEADS, args.rounds)
    speed = speed_summary(times, stats, modes, drafts, LOOKAHEADS, alphas, NEW_TOKENS * len(prompts))
    for mode, filters in modes.items():              # one pass over n positions, and a draft step
        speed[mode]["verify_seconds"] = pass_seconds(target, prompts[0],
                                                     range(1, max(LOOKAHEADS) + 2), filters, 50)
        speed[mode]["draft_step_seconds"] = {name: pass_seconds(d, prompts[0], [1], filters, 50)["1"]
                                             for name, d in drafts.items()}
        s = speed[mode]
        best = max(s["rows"], key=lambda r: r["speedup"])
        print(f"{mode}: target {s['target_tokens_per_second']:.0f} tokens/s; best: draft {best['draft']} "
              f"k = {best['k']}, α {best['alpha_counted']:.3f}, c {best['c']:.3f}: "
              f"{best['speedup']:.2f}× (predicted {best['predicted']:.2f}×)", flush=True)
    return dict(alpha=alphas, alpha_texts=alpha_texts, speed=speed)


def main(args):
    from tformer.data.all_plays import all_plays_data, all_plays_documents, yardstick
    from tformer.runs.files import tokenizer_record
    from tformer.experiments.long_run import plays_vocabulary
    from tformer.experiments.scaling_corpus import prepare
    t_start, prov = time.perf_counter(), record("decoding")
    target, tok, kind = load_target(args)
    V, T = target.config["vocab_size"], target.max_len
    pairs = ensure_drafts(DRAFTS, lambda: prepare(V), V, T, args.drafts)
    for _, run in pairs:
        if run["tokenizer"]["fingerprint"] != tok.fingerprint():
            raise UsageError(f"--drafts: the draft {shape_name(run['shape'])} was trained with another "
                             f"tokenizer than the target's; move its file away to train it anew")
    drafts = {shape_name(run["shape"]): m for m, run in pairs}
    swept = {}
    if os.path.exists(SWEEP):
        import json
        with open(SWEEP, encoding="utf-8") as f:
            swept = {r["key"]: r["val_nats_per_char"] for r in json.load(f).get("runs", [])}
    docs = all_plays_documents()
    ids = tok.encode(yardstick(all_plays_data(documents=docs), docs).tobytes())
    vocab = plays_vocabulary()
    modes = {m: MODES[m] for m in args.modes}
    print(f"target: TinyGPT {shape_name((target.config['n_layers'], target.config['d_model']))}, "
          f"{kind}; drafts: {', '.join(drafts)}", flush=True)

    load_before = load_average()
    pairs_out = {kind: measure_pair(target, drafts, ids, MODES, modes, args)}
    if kind == "w8":                  # the same weights in float32, computed once: another regime
        sampled = {"sample": MODES["sample"]}
        pairs_out["float32"] = measure_pair(dequantized(target),
                                            {n: dequantized(d) for n, d in drafts.items()},
                                            ids, sampled, sampled, args)
    load_after = load_average()

    samplers = compare_samplers(target, tok, vocab)
    reference = reference_text(target, tok, ids, vocab)
    for r in samplers + [reference]:
        print(f"{r['name']:>18s}: words {100 * r['word_share']:5.1f} %, distinct-2 {r['distinct_2']:.3f}, "
              f"ln p/token {r['log_likelihood']:.3f}", flush=True)

    write_json(args.out, dict(
        target=dict(kind=kind, path=args.target or "book/data/long_run_w8.npz",
                    config={k: v for k, v in target.config.items() if k != "dtype"},
                    tokenizer=tokenizer_record(tok)),
        drafts=[dict(run, name=shape_name(run["shape"]), sweep_val_nats_per_char=swept.get(run["key"]))
                for _, run in pairs],
        prompt_tokens=PROMPT_TOKENS, new_tokens=NEW_TOKENS, prompts=args.prompts,
        rounds=args.rounds, lookaheads=list(LOOKAHEADS), modes=modes,
        texts=args.texts, pairs=pairs_out, samplers=samplers, reference=reference,
        threads=parallel.get_num_threads(),
        provenance=dict(prov, load_average_timing=[load_before, load_after], finished=now(),
                        seconds=time.perf_counter() - t_start)))
    print(f"written to {args.out} in {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0
