"""The layers: F (each kernel's arguments checked once, then its fast version), the modules built from it, attention, the blocks, LoRA and gradient checkpointing.

- ``functional``: ``F``, the one entry point from the layers to the mathematics;
- ``layers``: ``Module`` (its public seams: what a layer keeps for its backward, ``replace``,
  ``bind``) and the basic layers; ``attention``, ``blocks``, ``modern_layers``;
- ``lora``: low-rank adapters, swapped in with ``Module.replace``; ``recompute``: a stack of
  blocks that keeps only each segment's input (a model's keyword builds it).
"""
