"""Benchmarks of the pieces: ``hallamonic bench ...`` (library functions plus thin CLI wrappers)."""
