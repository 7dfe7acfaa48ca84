"""Draw the five source systems' wirings, one SVG each and all five side by side.

    python tools/draw_architectures.py            # (re)write book/figures/architecture_*.svg
    python tools/draw_architectures.py --check    # exit 1 if a committed file is not current

Each picture reads from top (input) to bottom (output), as the model's ``forward`` does. Boxes are
the layers (colour = kind: embedding and positions, attention, feed-forward, normalisation,
output), ⊕ is a residual sum, the line that bypasses a box is its skip connection, and the dashed
frame holds what repeats N times. The wiring of each one is the code's, checked against
``tformer/models/`` (and ``tformer/nn/blocks.py``) when this file was written; if a model changes its
wiring, change its ``SYSTEMS`` entry here, rerun, and commit the SVGs.

The files are deterministic (``svg.hashsalt`` fixed, no date, text as paths with the pinned
Matplotlib and its bundled DejaVu font), so ``--check`` (run by ``tests/book/test_architecture.py``)
can compare them byte for byte.
"""
import argparse
import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "figures"

COLOURS = {                       # fill colours by kind (colour-blind-safe, light)
    "embed": "#cfe8cf",           # embeddings and positions
    "attn": "#fddbb0",            # attention
    "ffn": "#c9dcf2",             # feed-forward / MLP
    "norm": "#f6efa6",            # LayerNorm
    "out": "#e3d2ee",             # output projection
    "drop": "#eeeeee",            # dropout
}

# One list per system, top to bottom. Items:
#   ("io", text)                      input or output, no box
#   ("box", text, kind)               a layer
#   ("skip",)                         a residual branch starts here (the skip line leaves)
#   ("add",)                          ⊕: the skip line joins here
#   ("repeat", text) ... ("end",)     a dashed frame around the repeated block, labelled text
SYSTEMS = {
    "attention_layer": dict(
        title="Single attention layer\n(one head)",
        items=[("io", "X  (B, T, d)"),
               ("box", r"$Q, K, V = XW_q, XW_k, XW_v$", "attn"),
               ("box", r"$\mathrm{softmax}(QK^\top/\sqrt{d})\,V$", "attn"),
               ("box", r"$\cdot\, W_o$", "attn"),
               ("io", "Y  (B, T, d)"),
               ("note", "one head, no biases,\nno residual, no LayerNorm")]),
    "two_layer": dict(
        title="Two-layer transformer\n(no LayerNorm)",
        items=[("io", "X  (B, T, d)"),
               ("repeat", "× 2"),
               ("skip",),
               ("box", r"attention, 1 head, $W_o$", "attn"),
               ("add",),
               ("skip",),
               ("box", r"$\mathrm{swish}(\tilde X W_1)\, W_2$", "ffn"),
               ("add",),
               ("end",),
               ("io", "Y  (B, T, d)"),
               ("note", "no biases,\nno LayerNorm")]),
    "encoder": dict(
        title="Post-LN encoder\n(bidirectional)",
        items=[("io", "X  (B, T, d)"),
               ("box", "+ sinusoidal PE", "embed"),
               ("repeat", "× N"),
               ("skip",),
               ("box", "multi-head attention", "attn"),
               ("add",),
               ("box", "LayerNorm", "norm"),
               ("skip",),
               ("box", "FFN: ReLU, biases", "ffn"),
               ("add",),
               ("box", "LayerNorm", "norm"),
               ("end",),
               ("io", "Ŷ  (B, T, d)"),
               ("note", "bidirectional (no mask);\nno final LayerNorm")]),
    "transformer": dict(
        title="Complete Transformer\n(decoder-only here)",
        items=[("io", "tokens  (B, T)"),
               ("box", r"embedding $\cdot\sqrt{C}$", "embed"),
               ("box", "+ sinusoidal PE, dropout", "embed"),
               ("repeat", "× N"),
               ("skip",),
               ("box", "masked multi-head attn", "attn"),
               ("box", "dropout", "drop"),
               ("add",),
               ("box", "LayerNorm", "norm"),
               ("skip",),
               ("box", "FFN: ReLU, biases", "ffn"),
               ("box", "dropout", "drop"),
               ("add",),
               ("box", "LayerNorm", "norm"),
               ("end",),
               ("box", "final LayerNorm", "norm"),
               ("box", r"Linear $\to V$", "out"),
               ("io", "logits  (B, T, V)"),
               ("note", "decoder-only; mask =\ncausal AND padding")]),
    "tinygpt": dict(
        title="TinyGPT\n(byte-level, pre-norm)",
        items=[("io", "bytes  (B, T)"),
               ("box", r"$W_{te}[t] + W_{pe}[0{:}T]$", "embed"),
               ("repeat", "× N"),
               ("skip",),
               ("box", "LayerNorm", "norm"),
               ("box", r"causal attn, fused $W_{qkv}$", "attn"),
               ("add",),
               ("skip",),
               ("box", "LayerNorm", "norm"),
               ("box", "MLP: GELU, biases", "ffn"),
               ("add",),
               ("end",),
               ("box", "final LayerNorm", "norm"),
               ("box", r"LM head (bias) $\to 256$", "out"),
               ("io", "logits  (B, T, 256)"),
               ("note", "pre-norm: the skip path\nhas no LayerNorm")]),
}
ORDER = ["attention_layer", "two_layer", "encoder", "transformer", "tinygpt"]

# geometry, in data units (1 unit = 1 inch at the figure's size)
BOX_W, BOX_H, STEP = 1.62, 0.27, 0.40
SKIP_X = BOX_W / 2 + 0.12                     # the skip line runs right of the boxes
COL_W = 2.0                                  # one system's column
FONT = 7.5


def _arrow(ax, x0, y0, x1, y1):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=7,
                                 lw=0.8, color="#333333", shrinkA=0, shrinkB=0))


def draw(ax, x, spec):
    """Draw one system in column ``x`` of ``ax``; returns the lowest y used."""
    ax.text(x, 0.0, spec["title"], ha="center", va="top", fontsize=FONT + 0.5,
            fontweight="bold", linespacing=1.3)
    y = -0.62
    prev = None                                   # bottom of the previous element
    skips, frame = [], None
    for item in spec["items"]:
        kind = item[0]
        if kind == "note":
            ax.text(x, y - 0.08, item[1], ha="center", va="top", fontsize=FONT - 0.5,
                    style="italic", color="#444444", linespacing=1.3)
            y -= 0.5
            continue
        if kind == "repeat":
            frame = (y + 0.05, item[1])
            y -= 0.10
            continue
        if kind == "end":
            top, label = frame
            bottom = y + 0.02
            left, right = x - BOX_W / 2 - 0.07, x + SKIP_X + 0.09
            ax.add_patch(FancyBboxPatch((left, bottom), right - left,
                                        top - bottom, boxstyle="round,pad=0,rounding_size=0.06",
                                        fill=False, ls=(0, (3, 2)), lw=0.8, ec="#777777"))
            ax.text(right - 0.05, top, label, ha="right", va="center",
                    fontsize=FONT + 0.5, color="#555555",
                    bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none"))
            y -= 0.14
            continue
        if kind == "skip":
            # the branch point: a dot on the main line, just above the next element
            skips.append(y + 0.04)
            continue
        if kind == "add":
            r = 0.075
            cy = y - r
            if prev is not None:
                _arrow(ax, x, prev, x, cy + r)
            ax.add_patch(Circle((x, cy), r, fc="white", ec="#333333", lw=0.8))
            ax.plot([x - r * 0.6, x + r * 0.6], [cy, cy], color="#333333", lw=0.8)
            ax.plot([x, x], [cy - r * 0.6, cy + r * 0.6], color="#333333", lw=0.8)
            top = skips.pop()
            ax.plot([x, x + SKIP_X, x + SKIP_X], [top, top, cy], color="#333333", lw=0.8)
            _arrow(ax, x + SKIP_X, cy, x + r, cy)
            ax.add_patch(Circle((x, top), 0.018, color="#333333"))
            prev = cy - r
            y = cy - r - (STEP - BOX_H)
            continue
        # a box or an input/output line of text
        h = BOX_H if kind == "box" else 0.2
        top = y
        if prev is not None:
            _arrow(ax, x, prev, x, top)
        if kind == "box":
            ax.add_patch(FancyBboxPatch((x - BOX_W / 2, top - h), BOX_W, h,
                                        boxstyle="round,pad=0,rounding_size=0.04",
                                        fc=COLOURS[item[2]], ec="#555555", lw=0.7))
            ax.text(x, top - h / 2, item[1], ha="center", va="center", fontsize=FONT)
        else:
            ax.text(x, top - h / 2, item[1], ha="center", va="center", fontsize=FONT,
                    family="DejaVu Sans Mono")
        prev = top - h
        y = top - h - (STEP - BOX_H)
    return y


def figure(names):
    plt.rcParams.update({"svg.hashsalt": "tformer-architecture", "svg.fonttype": "path",
                         "font.family": "DejaVu Sans"})
    heights = []
    for name in names:                         # a dry run on a throw-away axis for the height
        fig = plt.figure()
        heights.append(-draw(fig.add_axes([0, 0, 1, 1]), 0, SYSTEMS[name]))
        plt.close(fig)
    width, height = COL_W * len(names), max(heights) + 0.1
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes([0, 0, 1, 1])
    for i, name in enumerate(names):
        draw(ax, COL_W * (i + 0.5) - 0.06, SYSTEMS[name])
    ax.set_xlim(0, width)
    ax.set_ylim(-height, 0.05)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


def render(names):
    fig = figure(names)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return buf.getvalue()


def outputs():
    """{file name: SVG text} of every picture: one per system and all five side by side."""
    files = {f"architecture_{name}.svg": render([name]) for name in ORDER}
    files["architectures.svg"] = render(ORDER)
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed files instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for name, text in outputs().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".svg.tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"not current: {', '.join(stale)}; run python tools/draw_architectures.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
