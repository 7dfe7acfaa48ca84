"""The architecture pictures (book/figures/architecture*.svg) are current: drawn by
tools/draw_architectures.py from its description of each system, deterministic, byte for byte."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("draw_architectures",
                                                  ROOT / "tools" / "draw_architectures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_pictures_are_current():
    tool = _tool()
    files = tool.outputs()
    assert len(files) == 6
    stale = [name for name, text in files.items()
             if not (tool.OUT / name).exists()
             or (tool.OUT / name).read_text(encoding="utf-8") != text]
    assert not stale, f"{stale}: run python tools/draw_architectures.py and commit the SVGs"


def test_drawing_is_deterministic_and_undated():
    tool = _tool()
    first, second = tool.render(["tinygpt"]), tool.render(["tinygpt"])
    assert first == second
    assert "<dc:date>" not in first


def test_every_system_is_drawn_with_the_wiring_its_model_has():
    """The pictures' blocks against the models: where the norms sit and how many residual sums."""
    tool = _tool()
    kinds = {name: [i[0] if i[0] != "box" else i[2] for i in spec["items"]]
             for name, spec in tool.SYSTEMS.items()}
    assert "add" not in kinds["attention_layer"] and "norm" not in kinds["attention_layer"]
    assert kinds["two_layer"].count("add") == 2 and "norm" not in kinds["two_layer"]
    # post-norm (the complete Transformer, the encoder): each ⊕ is followed by a LayerNorm;
    # pre-norm (TinyGPT): each skip by one
    for name in ("encoder", "transformer"):
        k = kinds[name]
        assert all(k[i + 1] == "norm" for i, x in enumerate(k) if x == "add")
    k = kinds["tinygpt"]
    assert all(k[i + 1] == "norm" for i, x in enumerate(k) if x == "skip")
    assert k[-5:-1] == ["end", "norm", "out", "io"]             # final LayerNorm, LM head
    from tformer.nn.blocks import PostNormBlock, PreNormBlock
    from tformer.models import Encoder, TinyGPT, Transformer
    assert all(isinstance(b, PostNormBlock) for b in Encoder(d_model=8, n_heads=2, d_ff=8).blocks)
    assert all(isinstance(b, PostNormBlock) for b in Transformer(11, 8, 2, 2, 8).blocks)
    assert all(isinstance(b, PreNormBlock) for b in TinyGPT(d_model=8, n_layers=2).blocks)
