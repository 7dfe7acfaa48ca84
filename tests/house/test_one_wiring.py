"""One wiring of the forward (issue 52): decoding runs the model's own forward with a cache.

Counted by reading the source:

- **Wirings of the model**: functions of the package that run a model's blocks (a call
  ``x.blocks(...)``, a loop over ``x.blocks``, or a call of a ``block_step``) and apply its LM
  head (a call of ``x.lm_head`` or of one of its methods other than the backward ones): exactly
  one, ``TinyGPT.forward``. Before, ``kv_cache.Decoder.__call__`` and ``kv_cache.lean_step``
  were two more. ``ALLOWED`` lists, with its reason, a file whose wiring is not TinyGPT's.
- **Copies of a block outside its class**: functions outside ``tformer/nn/blocks.py`` that read
  a block's norms (``obj.ln1`` / ``obj.ln2``, ``obj`` not ``self``): none. Before,
  ``fast.decode.block_step`` (the one-token step, a second copy of the block) and
  ``kv_cache._lean_blocks`` (its many-condition check). The one-token step is now each layer's
  row path (``rows``), chosen in the block's and the model's forward.

The counts are printed; a planted second wiring (the old ``Decoder.__call__``) and a planted copy
of the block fail the checks.
"""
import ast
from pathlib import Path

import tformer

PACKAGE = Path(tformer.__file__).resolve().parent

#: file -> reason: wirings that are not TinyGPT's.
ALLOWED = {
    "bench/torch_gpt.py": "PyTorch's GPT-2 block stack, the benchmark's other side (not tformer's model)",
}

BACKWARDS = {"backward", "backward_without_dW"}

#: The old decoder's step (kv_cache.py before this change), planted to show the count fail.
PLANTED_WIRING = '''
class Decoder:
    def __call__(self, tokens, caches):
        model = self.model
        start = check(model, tokens, caches)
        x = model.embed(tokens, start)
        for blk, cache in zip(model.blocks, caches):
            x = blk(x, None, cache)
        return model.lm_head(model.ln_f(x))
'''

#: The old one-token block step (fast/decode.py before this change), first lines.
PLANTED_BLOCK = '''
def block_step(x, blk, cache, ones_C, ones_L):
    a = layernorm_rows(x, blk.ln1.gamma, blk.ln1.beta, blk.ln1.eps, ones_C)
    return a
'''


def _chain(node):
    """The attribute names of ``a.b.c`` (``["a", "b", "c"]``; a call or subscript in the chain
    ends it)."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def _applies_head(fn):
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            chain = _chain(node.func)
            if "lm_head" in chain[1:] and chain[-1] not in BACKWARDS:
                return True
    return False


def _runs_blocks(fn):
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            chain = _chain(node.func)
            if chain[-1:] == ["blocks"] and len(chain) > 1 or chain[-1:] == ["block_step"]:
                return True
        if isinstance(node, (ast.For, ast.comprehension)):
            if any(isinstance(n, ast.Attribute) and n.attr == "blocks" for n in ast.walk(node.iter)):
                return True
    return False


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def wirings(sources):
    """``[(file, function)]`` of every function that runs the blocks and applies the head."""
    found = []
    for name, text in sources.items():
        for fn in _functions(ast.parse(text)):
            if _runs_blocks(fn) and _applies_head(fn):
                found.append((name, fn.name))
    return found


def block_copies(sources):
    """``[(file, function)]`` outside ``nn/blocks.py`` that read another object's ``ln1``/``ln2``."""
    found = []
    for name, text in sources.items():
        if name == "nn/blocks.py":
            continue
        for fn in _functions(ast.parse(text)):
            if any(isinstance(n, ast.Attribute) and n.attr in ("ln1", "ln2")
                   and not (isinstance(n.value, ast.Name) and n.value.id == "self")
                   for n in ast.walk(fn)):
                found.append((name, fn.name))
    return found


def _package():
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))
            if p.relative_to(PACKAGE).as_posix() not in ALLOWED}


def test_the_model_is_wired_once():
    found = wirings(_package())
    print(f"wirings of embed → blocks → ln_f → lm_head: {len(found)} {found}")
    assert found == [("models/tinygpt.py", "forward")]
    planted = wirings({**_package(), "decoding/kv_cache.py": PLANTED_WIRING})
    assert len(planted) == 2 and ("decoding/kv_cache.py", "__call__") in planted


def test_no_copy_of_a_block_outside_its_class():
    found = block_copies(_package())
    print(f"functions outside nn/blocks.py reading a block's norms: {len(found)} {found}")
    assert found == []
    assert block_copies({"fast/decode.py": PLANTED_BLOCK}) == [("fast/decode.py", "block_step")]


def test_allowed_files_exist_and_wire_a_model():
    for name in ALLOWED:
        text = (PACKAGE / name).read_text()
        assert wirings({name: text}), name
