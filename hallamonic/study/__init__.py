"""From-scratch architecture study: Harmonic vs Transformer vs Mamba under one equal-budget protocol.

`hallamonic study RECIPE` trains every architecture of the recipe at every context length on the
same tokens in the same order with the same optimizer and schedule, scores the same test windows,
and writes a results table, results.json, gaps and plots. `--memory` measures one training step's
peak memory against sequence length (the memory wall).
"""
