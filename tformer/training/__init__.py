"""Training: optimizers (AdamW, Muon), schedules, the one training loop, checkpoints and logs, and the ways a step runs faster or bigger: the batch cut across threads, mixed precision, MPI data parallelism, ZeRO-1, a step's peak memory predicted.

- ``optim``, ``muon``, ``schedules``, ``train`` (the one loop), ``checkpoint``, ``runlog``,
  ``lora_file`` (adapter files);
- ``batch_threads`` (a batch cut across threads, each part's whole pass on one thread),
  ``precision`` (float16/bfloat16 compute, float32 masters, loss scaling), ``mpi`` (data
  parallelism across processes), ``zero`` (ZeRO-1), ``step_memory`` (a step's peak, predicted).
"""
