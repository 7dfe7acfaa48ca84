"""tformer: the Transformer, derived and built by hand.

The package map, bottom to top. A module imports only from its own row or the rows above it:
``tests/import_layers.py`` holds the same order and ``tests/test_imports.py`` enforces it.

- **foundation**: ``_dtypes``, ``_validate``, ``atomic`` (crash-clean files), ``progress``,
  ``rss``, ``source`` (``show_source``), ``gradcheck``, ``parallel`` (the thread pool a kernel
  splits its rows across).
- **the mathematics**: ``kernels/`` (one equation family per file, as the chapters list them)
  → ``fast/`` (the same equations made fast: threads, buffers, float16/bfloat16, causal tiles;
  what the layers call) → ``functional`` (``F``: arguments checked once, then the fast version) →
  ``layers``, ``attention``, ``blocks``, ``modern_layers``, ``lora`` → ``models/`` (the systems).
- **training**: ``optim``, ``muon`` (Muon, and Muon + AdamW as one optimizer), ``schedules``,
  ``train`` (the one loop), ``checkpoint``, ``runlog``, ``lora_file``, ``dpo``.
- **scaling** (``scaling/``): ``recompute`` (gradient checkpointing), ``batch_threads`` (a
  training batch cut across threads), ``precision`` (mixed precision), ``quantize`` (int8),
  ``mpi`` (data parallelism across processes), ``zero`` (ZeRO-1), ``step_memory`` (a step's
  peak memory, predicted). ``recompute`` (a stack of blocks that a model's keyword builds) and
  ``batch_threads`` (a wrapper that ``train`` runs every model through) sit just below
  ``models/`` in the import order. A model has one ``forward`` and one ``backward``: every way of
  running it wraps it from outside.
- **using a model**: ``kv_cache`` (decoding with a key/value cache, through each layer's own
  arithmetic), ``samplers`` (temperature, top-k, top-p, min-p), ``generate`` (greedy, sampling),
  ``speculative`` (speculative decoding), ``beam``, ``bpe`` (the tokenizer).
- **data** (``data/``): every task's data, generated or read locally, seeded.
- **commands** (``runs/``): ``python -m tformer run SYSTEM``, ``generate``, ``quantize``.
- **experiments** (``experiments/``): the commands that write ``book/data/*.json``, and
  ``provenance``, the one recorder of commit, machine, load and command line.
- **bench** (``bench/``): tformer against PyTorch and against the machine's GEMM peak.
"""
