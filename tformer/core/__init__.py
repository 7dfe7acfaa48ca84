"""Foundation: number formats, argument checks, crash-clean files, the thread pool every kernel splits its rows across, progress, memory, source listings, gradient checks, and where and how a number was measured.

- ``dtypes``: float16/bfloat16 and the formats a kernel takes; ``validate``: argument checks with
  errors that name the argument, expected and actual;
- ``parallel``: the thread pool (``set_num_threads``); ``atomic``: files written crash-clean;
- ``progress``: the progress bar; ``rss``: a process's memory; ``source``: ``show_source``;
- ``gradcheck``: finite differences with a random upstream gradient;
- ``provenance``: the one recorder of commit, machine, load and command line, with ``cpu`` (what
  the CPU is) and ``timing`` (interleaved rounds, the one timer).
"""
