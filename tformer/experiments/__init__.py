"""The book's experiments: each command here writes a ``book/data/*.json`` result that a chapter reads.

Every result records where it came from through ``tformer.core.provenance.record`` (the project's
commit, the machine, the load average, the command line); ``fresh`` runs a measurement in a fresh
process. The commands are registered in
``tformer/__main__.py`` (``python -m tformer fewer-bits``, ``ablate``, ``online-softmax``,
``memory``, ``many-processes``, ``shakespeare``, ``bpe-compare``, ``lora``).
"""
