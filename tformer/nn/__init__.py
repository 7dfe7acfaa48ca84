"""The layers, built on the fast kernels: the module base, attention, the blocks, LoRA and gradient checkpointing; and F, each kernel with its arguments checked, for callers outside the layers.

- ``functional``: ``F``, each kernel's arguments checked, then its fast version (notebooks, the
  losses of the runs and data tasks, a model where it calls a kernel itself);
- ``layers``: ``Module`` (its public seams: what a layer keeps for its backward, ``replace``,
  ``bind``, ``freeze``, the parameter store's ``flat_layout``) and the basic layers;
  ``attention``, ``blocks``, ``modern_layers``;
- ``lora``: low-rank adapters, swapped in with ``Module.replace``; ``recompute``: a stack of
  blocks that keeps only each segment's input (a model's keyword builds it).
"""
