"""Training, shared by the conversion (`hallamonic.convert`) and the from-scratch study
(`hallamonic.study`), owned by neither.

- :mod:`~hallamonic.training.trainer` -- the phase loop: accelerate, accumulation, clipping,
  learning-rate schedule, NaN guard, metrics, progress bar, exact resume.
- :mod:`~hallamonic.training.checkpoint` -- atomic, pickle-free step checkpoints.
- :mod:`~hallamonic.training.packing` -- a token stream cut into fixed-length sequences, served as
  deterministic batches (a pure function of seed and step).
- :mod:`~hallamonic.training.recipe` -- the recipe schema machinery and the sections every run
  shares (phase, optimizer / loop, checkpoints).

It may use `hallamonic.modeling` and the foundation modules (`hallamonic.data`, ...), never
`convert`, `study`, `evaluation` or the command line.
"""
