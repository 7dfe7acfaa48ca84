"""Making the model fit, and run faster, without changing its mathematics (the book's "Scaling up").

- ``recompute``: gradient checkpointing (keep a segment's input, recompute it in the backward pass);
- ``batch_threads``: a training batch cut across threads, each part's whole pass on one thread;
- ``precision``: mixed precision (float16/bfloat16 compute, float32 masters, loss scaling);
- ``quantize``: int8 weights (and activations) for inference;
- ``mpi``: data parallelism across processes (MPI ranks), ``zero``: ZeRO-1's sharded optimizer;
- ``step_memory``: the peak memory of a training step, predicted before it runs.
"""
