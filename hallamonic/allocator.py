"""Keep freed tensor memory inside the process (glibc malloc on Linux).

By default glibc serves every allocation above a threshold (at most 32 MB, adjusted at run time) with
a fresh ``mmap``, gives it back with ``munmap`` when freed, and trims the heap top back to the kernel.
A training step on CPU allocates and frees hundreds of megabytes of activations, logits and
gradients, so every step pays the kernel again for mapping and zero-filling that memory (here, in a
Firecracker VM, it showed as system time close to the user time). Measured on the 2-core machine,
`hallamonic bench convert smollm2-135m --steps 4`: a phase-2 step 9.42 / 9.58 / 7.97 s with glibc's
defaults, 5.34 / 6.67 / 5.70 s with the settings below (`benchmarks/results/malloc`). But a whole
fresh conversion with them (`evals/results/smollm2-135m-hallamonic-malloc`) took 73.6 min against
66.0 without: phase 2 no faster than before, phase 1, the focus and the refit 7-19% slower, 13.9 GB
kept resident. Not shown to pay on the job that matters, so it is opt-in: ``HALLAMONIC_MALLOC=keep``.

PyTorch's CPU allocator has no cache of its own (it calls ``posix_memalign`` / ``free``), so glibc's
tunables are the knob that reaches it. They are read once, when the process starts, so with
``HALLAMONIC_MALLOC=keep`` the ``hallamonic`` command re-executes itself with them set
(:func:`exec_with_malloc_settings`); without it, glibc's defaults. (``mallopt`` from inside a running process,
tried first, recovered about half of the gain: it cannot set the trim threshold above 2 GiB.)
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

MALLOC_SETTINGS = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 32),  # allocations below 4 GiB come from (and return to) the heap
    "MALLOC_TRIM_THRESHOLD_": str(1 << 36),  # never hand the heap top back to the kernel
    "MALLOC_TOP_PAD_": str(1 << 30),  # grow the heap 1 GiB at a time
}


def missing_malloc_settings(environ: Mapping[str, str], libc: str | None = None) -> dict[str, str]:
    """The settings ``environ`` lacks when ``HALLAMONIC_MALLOC=keep`` asks for them: empty without
    it, when they are all there, or when glibc is not the C library. Settings the user gave win."""
    libc = platform.libc_ver()[0] if libc is None else libc
    if environ.get("HALLAMONIC_MALLOC", "").lower() != "keep" or libc != "glibc":
        return {}
    if any(name in environ for name in MALLOC_SETTINGS):  # the user tuned malloc: leave it be
        return {}
    return dict(MALLOC_SETTINGS)


def exec_with_malloc_settings(argv: list[str]) -> None:
    """Replace this process by ``argv`` (e.g. ``[sys.executable, "-m", "hallamonic", *args]``) with
    the settings in its environment, unless they are there already (then return: the caller goes on
    in this process, so the re-executed command does not loop)."""
    missing = missing_malloc_settings(os.environ)
    if not missing:
        return
    os.environ.update(missing)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
