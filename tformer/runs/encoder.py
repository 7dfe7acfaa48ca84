"""``python -m tformer run encoder``: the post-LN encoder trained to reconstruct its input.

The headline to reproduce: 2 layers, d_model 64, 4 heads, d_ff 256, Adam without weight decay,
MSE 0.0043 after 500 epochs. The data (``tformer.data.reconstruction``): 256 fixed training
sequences of 16 tokens, each token a standardised 64-d row of a 65-row table; an epoch is one
shuffled pass over them in mini-batches of 32 (8 updates). After every epoch the MSE over the
whole training set (the number its source reports) and over 64 held-out sequences is measured;
the run prints the final MSE, the first epoch whose training MSE is ≤ the target 0.0043, and the
wall time.
"""
import time

from tformer.data.reconstruction import ReconstructionData, forward_loss, mse
from tformer.models.encoder import Encoder
from tformer.training.optim import Adam
from tformer.training.train import train
from tformer.runs.flag_groups import Flag, add_model_flags, add_output_flags, add_training_flags
from tformer.runs.flags import Deprecated, heads_divide, nonnegative_float, positive_int

HEADLINE_MSE = 0.0043          # the source's "Final MSE Loss" after 500 epochs


def add_arguments(parser):
    """The flags of ``python -m tformer run encoder``; the defaults are the source's headline configuration."""
    add_model_flags(parser, n_layers=Flag(2, "number of post-LN blocks"),
                    d_model=Flag(64, "model width d (also the data's width)"),
                    n_heads=Flag(4, "attention heads (must divide d_model)"),
                    d_ff=Flag(256, "hidden width of the ReLU feed-forward network"),
                    seq_len=Flag(16, "tokens per sequence T"))
    add_training_flags(parser, steps=Flag(None, "optimizer steps (default: 500 epochs, passes over "
                                                "the training set, of ⌈n_train / batch_size⌉ "
                                                "steps each: 4000 with the default data)"),
                       lr=Flag(1e-3, "Adam learning rate η (betas 0.9, 0.999, ε 1e-8)"),
                       batch_size=Flag(32, "sequences per mini-batch"),
                       seed=Flag(0, "seed of the data and of the initial weights"))
    parser.add_argument("--n-train", type=positive_int, default=256,
                        help="training sequences (fixed for the whole run)")
    parser.add_argument("--n-test", type=positive_int, default=64,
                        help="held-out sequences from the same token table")
    parser.add_argument("--vocab-size", type=positive_int, default=65,
                        help="rows V of the token table")
    parser.add_argument("--target", type=nonnegative_float, default=HEADLINE_MSE,
                        help="report the first epoch whose training MSE is at most this")
    add_output_flags(parser, no_progress=Flag(False, "hide the progress bar"))
    # The spellings of earlier releases, kept for one release (a message names the new one).
    parser.add_argument("--layers", dest="n_layers", type=positive_int, action=Deprecated,
                        new="--n-layers")
    parser.add_argument("--heads", dest="n_heads", type=positive_int, action=Deprecated,
                        new="--n-heads")
    parser.add_argument("--epochs", dest="epochs", type=positive_int, action=Deprecated,
                        new="--steps", note=" (N epochs are N·⌈n_train / batch_size⌉ steps)")


def files(args):
    """What the run writes (``tformer.runs.declare``): ``--log``."""
    from tformer.runs.declare import writes
    return [writes("--log", getattr(args, "log", None))]


def check_args(args):
    """The flags that must agree (ValueError naming them): ``--n-heads`` divides an even
    ``--d-model``; the old ``--epochs`` and ``--steps`` are not both given."""
    heads_divide(args.d_model, args.n_heads, even=True)
    if getattr(args, "epochs", None) is not None and args.steps is not None:
        raise ValueError(f"--epochs: the old spelling of --steps, expected one of the two, got "
                         f"--epochs {args.epochs} and --steps {args.steps}")


def run(layers=2, d_model=64, heads=4, d_ff=256, epochs=500, lr=1e-3, batch_size=32, seed=0,
        n_train=256, n_test=64, seq_len=16, vocab_size=65, target=HEADLINE_MSE, progress_bar=None,
        log_path=None, steps=None):
    """Train the encoder on the reconstruction set; returns a dict of the results.

    ``steps``: optimizer steps instead of ``epochs`` whole passes (evaluated after every epoch
    and at the last step; an epoch is ``steps_per_epoch`` steps).

    Keys: ``model``, ``data``, ``history`` (from ``tformer.training.train.train``), ``epochs`` and
    ``train_mse`` / ``test_mse`` (one entry per epoch, measured after it), ``crossed`` (the first
    epoch with training MSE ≤ ``target``, or None), ``final_mse``, ``final_test_mse``, ``seconds``.
    """
    if epochs < 1:
        raise ValueError(f"epochs: expected at least 1, got {epochs}")
    data = ReconstructionData(n_train=n_train, n_test=n_test, seq_len=seq_len, d_model=d_model,
                              vocab_size=vocab_size, batch_size=batch_size, seed=seed)
    model = Encoder(d_model=d_model, n_heads=heads, n_layers=layers, d_ff=d_ff,
                    max_len=seq_len, seed=seed)
    opt = Adam(model, lr=lr)
    spe = data.steps_per_epoch

    def evaluate(m):
        return {"train_mse": mse(m, data.train), "test_mse": mse(m, data.test)}

    t0 = time.perf_counter()
    steps = epochs * spe if steps is None else steps
    hist = train(model, opt, data.batch, forward_loss, steps, evaluate=evaluate, eval_every=spe,
                 progress_bar=progress_bar, desc="encoder", log_every=1,
                 log_path=log_path)
    seconds = time.perf_counter() - t0
    ep = [step // spe if step % spe == 0 else round(step / spe, 3) for step, _ in hist["eval"]]
    tr, te = ([m[key] for _, m in hist["eval"]] for key in ("train_mse", "test_mse"))   # per epoch
    crossed = next((e for e, v in zip(ep, tr) if v <= target), None)
    return {"model": model, "data": data, "history": hist, "epochs": ep, "train_mse": tr, "test_mse": te,
            "crossed": crossed, "target": target, "final_mse": tr[-1], "final_test_mse": te[-1],
            "seconds": seconds}


def main(args):
    d = ReconstructionData(n_train=args.n_train, n_test=args.n_test, seq_len=args.seq_len,
                           d_model=args.d_model, vocab_size=args.vocab_size, batch_size=args.batch_size,
                           seed=args.seed)
    epochs = getattr(args, "epochs", None)
    steps = epochs * d.steps_per_epoch if epochs else args.steps or 500 * d.steps_per_epoch
    print(f"post-LN encoder: {args.n_layers} layers, d_model {args.d_model}, {args.n_heads} heads, "
          f"d_ff {args.d_ff}; Adam lr {args.lr:g}, no weight decay")
    print(f"data: {args.n_train} fixed sequences of {args.seq_len} tokens (rows of a standardised "
          f"{args.vocab_size}x{args.d_model} table), batch {args.batch_size}, "
          f"{d.steps_per_epoch} updates per epoch, {steps} steps ({steps / d.steps_per_epoch:g} "
          f"epochs); held out: {args.n_test} sequences")
    r = run(layers=args.n_layers, d_model=args.d_model, heads=args.n_heads, d_ff=args.d_ff, steps=steps,
            lr=args.lr, batch_size=args.batch_size, seed=args.seed, n_train=args.n_train,
            n_test=args.n_test, seq_len=args.seq_len, vocab_size=args.vocab_size, target=args.target,
            progress_bar=False if args.no_progress else None, log_path=getattr(args, "log", None))
    print(f"parameters: {r['model'].num_parameters():,}")
    print(f"final MSE (training set, after epoch {r['epochs'][-1]}): {r['final_mse']:.6f}")
    print(f"held-out MSE ({args.n_test} unseen sequences): {r['final_test_mse']:.6f}")
    if r["crossed"] is None:
        print(f"MSE never reached {args.target:g} in {steps} steps")
    else:
        print(f"MSE first <= {args.target:g} after epoch {r['crossed']} "
              f"(training-set MSE {r['train_mse'][r['epochs'].index(r['crossed'])]:.6f})")
    print(f"wall time: {r['seconds']:.1f} s")
    return 0
