"""The faster versions of the kernels: the ones the layers and models call.

Each file here matches a file of ``tformer/kernels/``. The kernel there is the chapter's equation,
written as the derivation reads; the function here computes the same thing faster: it splits rows
across threads (``tformer.core.parallel``), writes into buffers it is given (``out=``) or adds into
running gradients (``accumulate=``), multiplies float16/bfloat16 with float32 sums, skips the
masked tiles of causal attention, shares keys across query heads. Each is listed beside its
kernel in the appendix "The faster kernels, beside the equations" (and where a chapter teaches
what makes it faster: Performance, Fewer bits), and ``tests/kernels/test_fast_*.py`` (the decode rows:
``tests/decoding/test_decode.py``) hold each equal to its kernel.

Nothing here checks its arguments: input is checked once, where it enters (``tformer.nn.functional``,
the modules, the models, the command line), not in the inner loop of a training step.
"""
