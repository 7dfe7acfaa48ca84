"""Benchmarks: tformer against PyTorch and against the machine's GEMM peak (the Performance chapter).

``python -m tformer bench`` (``make bench``) writes ``book/data/bench_<CPU vendor>.json``; the
modules here are its pieces, importable by the chapter and the tests:

- ``flops``: the FLOP count of a training step; ``op_profile``: a per-op profile of a step;
- ``training``: one TinyGPT training step timed in tformer and in PyTorch, peak memory included;
- ``gemm_shapes``: the step's linear products in NumPy's BLAS and in PyTorch's, one thread each;
- ``generation``: greedy decoding with and without the KV cache, tokens per second;
- ``torch_gpt``: the PyTorch twin of TinyGPT (imports torch: import it only where torch is wanted);
- ``run``: the driver; ``modern_block``: the modern block's pieces, timed.

Nothing here imports torch at import time except ``torch_gpt``: ``import tformer.bench.flops``
works without PyTorch. Why the benchmarks live inside the package: ``benchmarks/README.md``.
"""
