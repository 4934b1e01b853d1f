"""Triton kernels for the diagonal linear recurrence h_t = a_t * h_{t-1} + b_t.

Shapes: a, b, h are (batch, length, channels) = (B, L, D), contiguous; channels are the fast axis.
All arithmetic is fp32 whatever the input dtype; h is written in ``b``'s dtype.

Design: one pass over memory, chunked along the length with a *decoupled look-back*.

The scan is memory-bound (two reads and one write per element, a handful of flops), so the only
thing that matters is moving each byte once, with enough parallelism to keep HBM busy. A plain
loop over time per (batch, channel tile) moves each byte once but has B*D/BLOCK_D programs only:
64 for (1, 65536, 2048), half an H200. The classic fix, "local scans, carry across chunks,
replay", reads a and b twice (5 tensors of traffic instead of 3: at most 60% of copy bandwidth).

Here every program owns one work item, a tile of CHUNK steps x BLOCK_D channels of one batch row,
and keeps it in registers from load to store:

1. take a ticket from a global counter (so every program a ticket depends on has already started:
   no deadlock, whatever order the hardware schedules programs in, and in the interpreter too);
2. load the tile of (a, b) and scan it locally along time with ``tl.associative_scan``, composing
   the affine maps h -> a*h + b; the last row is the tile's aggregate map (A, H);
3. publish the aggregate, then *look back* over the previous chunks of the same (batch, channel
   tile): compose their aggregates until one chunk's inclusive end state is published. Programs
   do not wait for their predecessor to *finish*, only to publish its aggregate, so the chain of
   waits stays short. A per-tile flag (1: aggregate, 2: inclusive state) is written with release
   ordering after the values, and read with acquire ordering before them;
4. publish this chunk's inclusive end state, and write h = H_local + A_cum * carry.

The backward pass is the same kernel run in reverse time (g_t = dh_t + a_{t+1} g_{t+1}) with the
gradients fused in: db = g, da_t = g_t * h_{t-1}, d initial_state = a_0 * g_0. Traffic: forward
reads a, b and writes h (3 tensors); backward reads a, dh, h and writes da, db (5 tensors).

The backward reads the saved output h in ``b``'s dtype: for bf16 outputs da_t = g_t * h_{t-1} is
computed from the bf16-rounded states (relative error ~2^-8, the precision of the output itself),
which avoids an extra fp32 copy of h in memory.

This file ships inside Hugging Face checkpoints as remote code: it imports only torch, the
standard library and (optionally) triton, and does no I/O. Without triton it still imports, and
:func:`triton_available` returns False.

Kernels are built on first use, not at import: ``triton.jit`` reads ``TRITON_INTERPRET`` when it
decorates, and tests set that variable after the package has been imported.
"""

from __future__ import annotations

import os

import torch

try:  # optional dependency: absent on CPU-only machines
    import triton
    import triton.language as tl

    _HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised where triton is not installed
    triton = None
    tl = None
    _HAS_TRITON = False

__all__ = ["triton_scan", "triton_available"]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_available() -> bool:
    """True when the Triton kernels can run: triton imports and CUDA is present, or the Triton
    interpreter is switched on (``TRITON_INTERPRET=1``, CPU tensors; for tests)."""
    if not _HAS_TRITON:
        return False
    return _interpreting() or torch.cuda.is_available()


# --------------------------------------------------------------------------------------------
# Kernels (built lazily, once per interpreter mode)
# --------------------------------------------------------------------------------------------
# The plain Python functions are defined here (only when triton imported: their annotations
# need ``tl``) and wrapped by ``triton.jit`` in :func:`_kernels` on first use. Triton resolves
# the helpers ``_compose`` and ``_add`` through this module's globals, so they are (re)bound
# there at that time.
_KERNELS: dict[bool, tuple] = {}

if _HAS_TRITON:

    def _compose_py(a1, b1, a2, b2):
        # (a1, b1) first, then (a2, b2):  h -> a2 * (a1 * h + b1) + b2
        return a1 * a2, a2 * b1 + b2

    def _add_py(x, y):
        return x + y

    def _scan_kernel_py(
        a_ptr,  # (B, L, D) decays, any float dtype
        x_ptr,  # (B, L, D) inputs: b (forward) or dh (backward)
        h0_ptr,  # (B, D) initial state (forward, HAS_H0) / saved output h (backward)
        out_ptr,  # (B, L, D) h (forward) / db = g (backward)
        da_ptr,  # (B, L, D) da (backward only)
        dh0_ptr,  # (B, D) fp32 d initial_state (backward, HAS_H0)
        hsaved_ptr,  # (B, L, D) saved output h (backward only)
        agg_a_ptr,  # (NC, B, D) fp32: chunk aggregates (decay product)
        agg_h_ptr,  # (NC, B, D) fp32: chunk aggregates (state from zero)
        incl_ptr,  # (NC, B, D) fp32: inclusive end state of every chunk
        flag_ptr,  # (NC, B, NDT) int32: 0 nothing, 1 aggregate published, 2 inclusive published
        ticket_ptr,  # (1,) int32 work counter
        B,
        L,
        D,
        NC,
        NDT,
        HAS_H0: tl.constexpr,
        REVERSE: tl.constexpr,
        CHUNK: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # ---- 1) which work item: chunk-major, so earlier chunks are handed out first ----------
        ticket = tl.atomic_add(ticket_ptr, 1)
        c = ticket // (B * NDT)  # chunk index in scan order (from the end when REVERSE)
        rem = ticket % (B * NDT)
        bi = rem // NDT
        dt = rem % NDT

        rows = tl.arange(0, CHUNK)  # (CHUNK,)
        cols = dt * BLOCK_D + tl.arange(0, BLOCK_D)  # (BLOCK_D,)
        col_ok = cols < D
        step = c * CHUNK + rows  # position in scan order
        if REVERSE:
            t = L - 1 - step  # time index (decreasing along the tile)
        else:
            t = step
        row_ok = (step < L)[:, None] & col_ok[None, :]  # (CHUNK, BLOCK_D)
        base = bi.to(tl.int64) * L * D
        offs = base + t.to(tl.int64)[:, None] * D + cols[None, :]  # (CHUNK, BLOCK_D)

        # ---- 2) local scan of the tile ------------------------------------------------------
        if REVERSE:
            # g_t = dh_t + a_{t+1} g_{t+1}: the decay applied at step t is a_{t+1} (0 past the end).
            a_ok = row_ok & (t + 1 < L)[:, None]
            av = tl.load(a_ptr + offs + D, mask=a_ok, other=0.0).to(tl.float32)
            av = tl.where(row_ok, av, 1.0)  # padding rows: identity map
        else:
            av = tl.load(a_ptr + offs, mask=row_ok, other=1.0).to(tl.float32)
        xv = tl.load(x_ptr + offs, mask=row_ok, other=0.0).to(tl.float32)
        a_cum, h_loc = tl.associative_scan((av, xv), 0, _compose)  # (CHUNK, BLOCK_D) each
        # the tile's aggregate map = its last row (tl.reduce with our own combine functions, not
        # tl.sum: triton's library functions are jitted when triton is imported, so they would
        # not run in the interpreter switched on later, in tests)
        is_last = (rows == CHUNK - 1)[:, None]
        agg_a = tl.reduce(tl.where(is_last, a_cum, 0.0), 0, _add)  # (BLOCK_D,)
        agg_h = tl.reduce(tl.where(is_last, h_loc, 0.0), 0, _add)

        # ---- 3) carry into this chunk: decoupled look-back ----------------------------------
        # Publishing = plain stores of the values, a CTA barrier (every thread's stores done), then
        # one release-ordered flag write; reading = an acquire-ordered flag read (one thread,
        # broadcast to the CTA), then volatile loads of the values (bypassing the incoherent L1).
        # Every thread decides from the same flag, so replicated lanes always agree. (A flag-free
        # variant that marks unpublished values with a NaN sentinel was ~10% faster but raced on
        # the H200: lanes held by two threads could read two different values.)
        vec = (c * B + bi).to(tl.int64) * D + cols  # (BLOCK_D,) into the (NC, B, D) buffers
        flag_here = flag_ptr + (c * B + bi) * NDT + dt
        if c == 0:
            if HAS_H0:
                carry = tl.load(h0_ptr + bi.to(tl.int64) * D + cols, mask=col_ok, other=0.0).to(tl.float32)
            else:
                carry = tl.full((BLOCK_D,), 0.0, dtype=tl.float32)
        else:
            tl.store(agg_a_ptr + vec, agg_a, mask=col_ok)
            tl.store(agg_h_ptr + vec, agg_h, mask=col_ok)
            tl.debug_barrier()  # every thread's stores are done before the flag is raised
            tl.atomic_xchg(flag_here, 1, sem="release")
            # acc = composition of the aggregates of chunks j+1 .. c-1 (identity to start)
            acc_a = tl.full((BLOCK_D,), 1.0, dtype=tl.float32)
            acc_h = tl.full((BLOCK_D,), 0.0, dtype=tl.float32)
            carry = tl.full((BLOCK_D,), 0.0, dtype=tl.float32)
            j = c - 1
            done = 0
            while done == 0:
                jvec = (j * B + bi).to(tl.int64) * D + cols
                f = tl.atomic_add(flag_ptr + (j * B + bi) * NDT + dt, 0, sem="acquire")
                if f == 2:  # chunk j's end state is known: apply the maps of the chunks in between
                    inc = tl.load(incl_ptr + jvec, mask=col_ok, other=0.0, volatile=True)
                    carry = acc_a * inc + acc_h
                    done = 1
                elif f == 1:  # only chunk j's own map is known: compose it and look further back
                    pa = tl.load(agg_a_ptr + jvec, mask=col_ok, other=1.0, volatile=True)
                    ph = tl.load(agg_h_ptr + jvec, mask=col_ok, other=0.0, volatile=True)
                    acc_h = acc_a * ph + acc_h
                    acc_a = acc_a * pa
                    j -= 1
                # else: chunk j has published nothing yet; poll again
        # publish this chunk's end state for the chunks after it
        tl.store(incl_ptr + vec, agg_a * carry + agg_h, mask=col_ok)
        tl.debug_barrier()
        tl.atomic_xchg(flag_here, 2, sem="release")

        # ---- 4) replay the carry and write ------------------------------------------------
        h = h_loc + a_cum * carry[None, :]  # (CHUNK, BLOCK_D) fp32
        tl.store(out_ptr + offs, h.to(out_ptr.dtype.element_ty), mask=row_ok)
        if REVERSE:
            # da_t = g_t * h_{t-1}, with h_{-1} = initial state (or 0)
            prev_ok = row_ok & (t >= 1)[:, None]
            h_prev = tl.load(hsaved_ptr + offs - D, mask=prev_ok, other=0.0).to(tl.float32)
            is_t0 = (t == 0)[:, None] & row_ok
            if HAS_H0:
                h0v = tl.load(h0_ptr + bi.to(tl.int64) * D + cols, mask=col_ok, other=0.0).to(tl.float32)
                h_prev = tl.where(is_t0, h0v[None, :], h_prev)
            tl.store(da_ptr + offs, (h * h_prev).to(da_ptr.dtype.element_ty), mask=row_ok)
            if HAS_H0:
                if c == NC - 1:  # the chunk holding t = 0: d initial_state = a_0 * g_0
                    a0 = tl.load(a_ptr + bi.to(tl.int64) * L * D + cols, mask=col_ok, other=0.0).to(tl.float32)
                    g0 = tl.reduce(tl.where(is_t0, h, 0.0), 0, _add)
                    tl.store(dh0_ptr + bi.to(tl.int64) * D + cols, a0 * g0, mask=col_ok)


def _kernels():
    """The jitted kernel for the current mode (compiled, or interpreted under TRITON_INTERPRET=1)."""
    global _compose, _add
    mode = _interpreting()
    if mode not in _KERNELS:
        # helpers are bound first: the interpreter snapshots the module's globals
        _compose, _add = triton.jit(_compose_py), triton.jit(_add_py)
        # no specialisation on the integer sizes: one compile per dtype/flag combination
        kernel = triton.jit(_scan_kernel_py, do_not_specialize=["B", "L", "D", "NC", "NDT"])
        _KERNELS[mode] = (_compose, _add, kernel)
    _compose, _add = _KERNELS[mode][:2]
    return _KERNELS[mode][2:]


# --------------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------------
def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _config(length: int, channels: int) -> tuple[int, int, int]:
    """(CHUNK, BLOCK_D, num_warps), chosen from the shape (no autotune: it fails in the interpreter
    and would re-benchmark at every new length).

    BLOCK_D * element size >= 64-128 bytes keeps loads coalesced along channels; CHUNK sets how many
    steps one program keeps in registers (CHUNK * BLOCK_D elements of a and b), and the number of
    chunks the look-back walks through.
    """
    if _interpreting():  # small tiles, so tiny test shapes still span several chunks and tiles
        return min(16, max(2, _next_pow2(length))), min(16, max(2, _next_pow2(channels))), 1
    # One tile shape for every size: 64 x 64 at 4 warps (~190 registers per thread, no spills;
    # 128 x 64 spills). This is the configuration checked for correctness on an H200
    # (benchmarks/gpu_results). In that run's sweep 32 x 128 x 4 warps was ~10% faster at
    # (8, 4096, 2048) and the same at (1, 65536, 2048); switch after checking it on a GPU.
    return 64, 64, 4


_OVERRIDE: dict[str, int] = {}  # benchmarks may set CHUNK / BLOCK_D / num_warps here


def _launch(a, x, h0, out, da, dh0, hsaved, reverse: bool):
    (kernel,) = _kernels()
    batch, length, channels = x.shape
    chunk, block_d, warps = _config(length, channels)
    chunk = _OVERRIDE.get("CHUNK", chunk)
    block_d = _OVERRIDE.get("BLOCK_D", block_d)
    warps = _OVERRIDE.get("num_warps", warps)
    n_chunks = triton.cdiv(length, chunk)
    n_dtiles = triton.cdiv(channels, block_d)
    dev = x.device
    agg_a = torch.empty(n_chunks, batch, channels, dtype=torch.float32, device=dev)
    agg_h = torch.empty_like(agg_a)
    incl = torch.empty_like(agg_a)
    flags = torch.zeros(n_chunks * batch * n_dtiles + 1, dtype=torch.int32, device=dev)
    ticket = flags[-1:]  # the last int32 is the work counter (one memset for both)
    dummy = out
    kernel[(n_chunks * batch * n_dtiles,)](
        a,
        x,
        h0 if h0 is not None else dummy,
        out,
        da if da is not None else dummy,
        dh0 if dh0 is not None else dummy,
        hsaved if hsaved is not None else dummy,
        agg_a,
        agg_h,
        incl,
        flags,
        ticket,
        batch,
        length,
        channels,
        n_chunks,
        n_dtiles,
        HAS_H0=h0 is not None,
        REVERSE=reverse,
        CHUNK=chunk,
        BLOCK_D=block_d,
        num_warps=warps,
    )


class _TritonScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, initial_state):
        a = a.contiguous()
        b = b.contiguous()
        h0 = initial_state.contiguous() if initial_state is not None else None
        h = torch.empty_like(b)  # (B, L, D) in b's dtype
        _launch(a, b, h0, h, None, None, None, reverse=False)
        ctx.save_for_backward(a, h, h0)
        ctx.b_dtype = b.dtype
        return h

    @staticmethod
    def backward(ctx, grad_h):
        a, h, h0 = ctx.saved_tensors
        grad_h = grad_h.contiguous()
        grad_a = torch.empty_like(a)
        grad_b = torch.empty(a.shape, dtype=ctx.b_dtype, device=a.device)
        grad_h0 = torch.zeros(h0.shape, dtype=torch.float32, device=a.device) if h0 is not None else None
        _launch(a, grad_h, h0, grad_b, grad_a, grad_h0, h, reverse=True)
        return grad_a, grad_b, (grad_h0.to(h0.dtype) if grad_h0 is not None else None)


def triton_scan(a: torch.Tensor, b: torch.Tensor, initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """All states of h_t = a_t * h_{t-1} + b_t, shape (B, L, D) in ``b``'s dtype; differentiable
    w.r.t. a, b and initial_state. Inputs are validated by :func:`hallamonic_scan.scan`."""
    if not triton_available():
        raise RuntimeError("triton_scan needs triton with CUDA, or TRITON_INTERPRET=1")
    return _TritonScan.apply(a, b, initial_state)
