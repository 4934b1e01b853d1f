"""`python -m hallamonic ...`: the same command line as `hallamonic ...`."""

from hallamonic.cli import main

main()
