"""Triton kernels for the selective recurrence of an expanded HarmonicBlock level.

    S_t = a_t[:, None] * S_{t-1} + b_t ⊗ k_t,     y_t = S_t q_t          (per head: S is P x N)

Shapes: b, log_a (B, L, H, P); write k, read q (B, L, H, N); states (B, H, P, N); all contiguous.
Arithmetic is fp32 whatever the input dtype (dots in IEEE fp32, not TF32).

Design: one program per (batch, head, block of VALUE_BLOCK value channels) walks the sequence in
chunks of CHUNK steps and keeps its (BP, N) slice of the state in registers; inside a chunk
everything is a matmul, exactly as the chunked PyTorch twin
(``hallamonic_selective_scan.chunked_selective_scan``):

    cum   = cumsum(log a)  within the chunk, m its middle row, e its last row
    y     = exp(cum - m) * (tril(q k^T) @ (exp(m - cum) * b))  +  exp(cum) * (q @ S^T)
    S    <- exp(e) * S  +  (exp(e - cum) * b)^T @ k

The (L, P, N) state sequence is never written: the forward stores only the state entering each
chunk, (B, H, L/CHUNK, P, N), which is what the backward needs to recompute every chunk. The
backward walks the chunks in reverse with the state gradient dS in registers:

    A2    = tril((dy * exp(cum - m)) @ (b * exp(m - cum))^T)
    dq    = A2 @ k + (dy * exp(cum)) @ S_in
    dk    = A2^T @ q + (b * exp(e - cum)) @ dS
    db    = exp(m - cum) * (tril(q k^T)^T @ (dy * exp(cum - m))) + exp(e - cum) * (k @ dS^T)
    dcum  = dy * y - b * db  (+ sum_n dS * S_out on the last row);  dlog_a = reverse cumsum(dcum)
    dS   <- exp(e) * dS + (dy * exp(cum))^T @ q

Why the value channels are split: each row of S decays on its own (the decay is per value channel),
so rows never interact and a block of rows is an independent problem. One program per (batch, head)
held the whole (P, N) state -- at a conversion's P = N = 64 three such tiles live in the backward
(S_in, S_out, dS), more than a program's registers -- and launched only B x H programs (18 at batch
2 with SmolLM2's 9 heads, for an H200's 132 SMs): the kernel measured 0.35x the PyTorch path there.
Splitting P multiplies the programs by P / BP and divides each program's tiles by it, at the cost of
recomputing the (C, C) scores q k^T per block. dq and dk sum over all rows, so each block writes its
partial sums and the host adds them (one (P / BP, B, L, H, N) buffer each; nothing extra for one block).

Every exponent stays below CHUNK/2 * MAX_DECAY_RATE because callers clamp log a >= -3.

This file ships inside Hugging Face checkpoints as remote code: it imports only torch, the standard
library and (optionally) triton, and does no I/O. Kernels are built on first use (``triton.jit``
reads ``TRITON_INTERPRET`` when it decorates; tests set it after import).
"""

from __future__ import annotations

import torch

# Triton is optional (absent on CPU-only machines); the diagonal scan's module already knows
# whether it imports and whether kernels can run (CUDA, or the interpreter in tests).
from .hallamonic_scan_triton import _HAS_TRITON, _interpreting, triton_available

if _HAS_TRITON:
    import triton
    import triton.language as tl
else:  # pragma: no cover - exercised where triton is not installed
    triton = tl = None

__all__ = ["triton_selective_scan", "triton_available"]

CHUNK = 32  # steps per chunk (tl.dot needs every dimension >= 16)
VALUE_BLOCK = 32  # value channels per program (a power of two >= 16); see "Why the value channels are split"


# The plain functions are wrapped by ``triton.jit`` in :func:`_kernels` on first use, helpers
# (``_add``, ``_load_chunk``, ``_log_decays``) bound as module globals there. Sums and the cumulative
# sum go through the module's own ``_add``, not tl.sum / tl.cumsum / tl.zeros, whose built-in jitted
# helpers the interpreter cannot run when it was switched on after triton was imported (as in tests).
_KERNELS: dict[bool, tuple] = {}
_add = _load_chunk = _log_decays = None

if _HAS_TRITON:

    def _add_py(x, y):
        return x + y

    def _load_chunk_py(b_ptr, la_ptr, k_ptr, q_ptr, c, bi, hi, L, H, P, N, rows, cp, cn, CHUNK: tl.constexpr):
        """Chunk c's rows of b, log a (C, P) and k, q (C, N) in fp32, zero past the end; with the
        row indices and masks the stores of this chunk use."""
        t = c * CHUNK + rows  # (C,) time steps of this chunk
        live = t < L
        base = (bi * L + t) * H + hi  # (C,) rows of the (B, L, H) grid
        mp = live[:, None] & (cp[None, :] < P)
        mn = live[:, None] & (cn[None, :] < N)
        b = tl.load(b_ptr + base[:, None] * P + cp[None, :], mask=mp, other=0.0).to(tl.float32)
        la = tl.load(la_ptr + base[:, None] * P + cp[None, :], mask=mp, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + base[:, None] * N + cn[None, :], mask=mn, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + base[:, None] * N + cn[None, :], mask=mn, other=0.0).to(tl.float32)
        return base, mp, mn, b, la, k, q

    def _log_decays_py(la, rows, CHUNK: tl.constexpr):
        """cum = cumsum(log a) in the chunk (C, P), its middle row m and its last row e (P,)."""
        cum = tl.associative_scan(la, 0, _add)
        middle = tl.reduce(tl.where(rows[:, None] == CHUNK // 2 - 1, cum, 0.0), 0, _add)
        last = tl.reduce(tl.where(rows[:, None] == CHUNK - 1, cum, 0.0), 0, _add)
        return cum, middle, last

    def _forward_py(
        b_ptr, la_ptr, k_ptr, q_ptr, s0_ptr, y_ptr, states_ptr, final_ptr,
        L, H, P, N, NCH,
        HAS_S0: tl.constexpr, CHUNK: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    ):
        pid = tl.program_id(0)  # (batch, head)
        bi = pid // H
        hi = pid % H
        rows = tl.arange(0, CHUNK)
        cp = tl.program_id(1) * BP + tl.arange(0, BP)  # this program's value channels
        cn = tl.arange(0, BN)
        state_offsets = cp[:, None] * N + cn[None, :]  # (P, N) inside one state
        state_mask = (cp[:, None] < P) & (cn[None, :] < N)
        if HAS_S0:
            S = tl.load(s0_ptr + pid * P * N + state_offsets, mask=state_mask, other=0.0).to(tl.float32)
        else:
            S = tl.full((BP, BN), 0.0, tl.float32)
        causal = rows[:, None] >= rows[None, :]
        for c in range(NCH):
            base, mp, mn, b, la, k, q = _load_chunk(b_ptr, la_ptr, k_ptr, q_ptr, c, bi, hi, L, H, P, N, rows, cp, cn, CHUNK)
            tl.store(states_ptr + (pid * NCH + c) * P * N + state_offsets, S, mask=state_mask)
            cum, middle, last = _log_decays(la, rows, CHUNK)  # (C, P), (P,), (P,)
            scores = tl.where(causal, tl.dot(q, tl.trans(k), input_precision="ieee"), 0.0)  # (C, C)
            y = tl.exp(cum - middle[None, :]) * tl.dot(scores, tl.exp(middle[None, :] - cum) * b, input_precision="ieee")
            y += tl.exp(cum) * tl.dot(q, tl.trans(S), input_precision="ieee")  # (C, P)
            tl.store(y_ptr + base[:, None] * P + cp[None, :], y, mask=mp)
            to_end = tl.exp(last[None, :] - cum) * b  # (C, P)
            S = tl.exp(last)[:, None] * S + tl.dot(tl.trans(to_end), k, input_precision="ieee")  # (P, N)
        tl.store(final_ptr + pid * P * N + state_offsets, S, mask=state_mask)

    def _backward_py(
        b_ptr, la_ptr, k_ptr, q_ptr, dy_ptr, states_ptr, dfinal_ptr,
        db_ptr, dla_ptr, dk_ptr, dq_ptr, ds0_ptr,
        PARTIAL, L, H, P, N, NCH,
        HAS_DFINAL: tl.constexpr, CHUNK: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    ):
        pid = tl.program_id(0)  # (batch, head)
        pb = tl.program_id(1)  # block of value channels: dk, dq go to its slice of the partial sums
        bi = pid // H
        hi = pid % H
        rows = tl.arange(0, CHUNK)
        cp = pb * BP + tl.arange(0, BP)
        partial = pb * PARTIAL  # offset of this block's (B, L, H, N) partial dk / dq
        cn = tl.arange(0, BN)
        state_offsets = cp[:, None] * N + cn[None, :]
        state_mask = (cp[:, None] < P) & (cn[None, :] < N)
        if HAS_DFINAL:
            dS = tl.load(dfinal_ptr + pid * P * N + state_offsets, mask=state_mask, other=0.0).to(tl.float32)
        else:
            dS = tl.full((BP, BN), 0.0, tl.float32)
        causal = rows[:, None] >= rows[None, :]
        for step in range(NCH):
            c = NCH - 1 - step
            base, mp, mn, b, la, k, q = _load_chunk(b_ptr, la_ptr, k_ptr, q_ptr, c, bi, hi, L, H, P, N, rows, cp, cn, CHUNK)
            dy = tl.load(dy_ptr + base[:, None] * P + cp[None, :], mask=mp, other=0.0).to(tl.float32)  # (C, P)
            S_in = tl.load(states_ptr + (pid * NCH + c) * P * N + state_offsets, mask=state_mask, other=0.0)
            cum, middle, last = _log_decays(la, rows, CHUNK)
            grow = tl.exp(cum - middle[None, :])  # (C, P)
            shrink = tl.exp(middle[None, :] - cum)  # (C, P)
            to_end = tl.exp(last[None, :] - cum)  # (C, P)
            scores = tl.where(causal, tl.dot(q, tl.trans(k), input_precision="ieee"), 0.0)  # (C, C)
            dy_grow = dy * grow
            b_shrink = b * shrink
            dy_full = dy * tl.exp(cum)
            a2 = tl.where(causal, tl.dot(dy_grow, tl.trans(b_shrink), input_precision="ieee"), 0.0)  # (C, C)
            dq = tl.dot(a2, k, input_precision="ieee") + tl.dot(dy_full, S_in, input_precision="ieee")  # (C, N)
            b_end = b * to_end
            dk = tl.dot(tl.trans(a2), q, input_precision="ieee") + tl.dot(b_end, dS, input_precision="ieee")  # (C, N)
            db = shrink * tl.dot(tl.trans(scores), dy_grow, input_precision="ieee")
            db += to_end * tl.dot(k, tl.trans(dS), input_precision="ieee")  # (C, P)
            y = grow * tl.dot(scores, b_shrink, input_precision="ieee") + tl.exp(cum) * tl.dot(q, tl.trans(S_in), input_precision="ieee")
            S_out = tl.exp(last)[:, None] * S_in + tl.dot(tl.trans(b_end), k, input_precision="ieee")  # (P, N)
            dcum = dy * y - b * db  # (C, P)
            dcum += tl.where(rows[:, None] == CHUNK - 1, tl.reduce(dS * S_out, 1, _add)[None, :], 0.0)
            dla = tl.reduce(dcum, 0, _add)[None, :] - tl.associative_scan(dcum, 0, _add) + dcum  # reverse cumsum
            tl.store(db_ptr + base[:, None] * P + cp[None, :], db, mask=mp)
            tl.store(dla_ptr + base[:, None] * P + cp[None, :], dla, mask=mp)
            tl.store(dk_ptr + partial + base[:, None] * N + cn[None, :], dk, mask=mn)
            tl.store(dq_ptr + partial + base[:, None] * N + cn[None, :], dq, mask=mn)
            dS = tl.exp(last)[:, None] * dS + tl.dot(tl.trans(dy_full), q, input_precision="ieee")  # (P, N)
        tl.store(ds0_ptr + pid * P * N + state_offsets, dS, mask=state_mask)


def _kernels():
    """The jitted kernels for the current mode (compiled, or interpreted under TRITON_INTERPRET=1)."""
    global _add, _load_chunk, _log_decays
    mode = _interpreting()
    if mode not in _KERNELS:
        # helpers are bound first: the interpreter snapshots the module's globals
        _add, _load_chunk, _log_decays = triton.jit(_add_py), triton.jit(_load_chunk_py), triton.jit(_log_decays_py)
        sizes = ["PARTIAL", "L", "H", "P", "N", "NCH"]
        _KERNELS[mode] = (
            (_add, _load_chunk, _log_decays),
            triton.jit(_forward_py, do_not_specialize=sizes),
            triton.jit(_backward_py, do_not_specialize=sizes),
        )
    _add, _load_chunk, _log_decays = _KERNELS[mode][0]
    return _KERNELS[mode][1:]


def _blocks(P: int, N: int, value_block: int) -> tuple[int, int, int]:
    """Tile sizes (BP, BN) and the number of value-channel blocks."""
    BP = min(max(16, triton.next_power_of_2(P)), value_block)
    return BP, max(16, triton.next_power_of_2(N)), -(-P // BP)


class _TritonSelectiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, b, log_a, write, read, initial_state, value_block):
        b, log_a, write, read = (t.contiguous() for t in (b, log_a, write, read))
        batch, length, heads, channels = b.shape
        state_size = write.shape[-1]
        chunks = -(-length // CHUNK)
        forward_kernel, _ = _kernels()
        y = torch.empty(batch, length, heads, channels, device=b.device, dtype=torch.float32)
        states = torch.empty(batch, heads, chunks, channels, state_size, device=b.device, dtype=torch.float32)
        final = torch.empty(batch, heads, channels, state_size, device=b.device, dtype=torch.float32)
        s0 = initial_state.float().contiguous() if initial_state is not None else final  # unused without HAS_S0
        BP, BN, blocks = _blocks(channels, state_size, value_block)
        forward_kernel[(batch * heads, blocks)](
            b, log_a, write, read, s0, y, states, final, length, heads, channels, state_size, chunks,
            HAS_S0=initial_state is not None, CHUNK=CHUNK, BP=BP, BN=BN,
        )
        ctx.save_for_backward(b, log_a, write, read, states)
        ctx.dtypes = (b.dtype, log_a.dtype, write.dtype, read.dtype)
        ctx.initial_state = None if initial_state is None else initial_state.dtype
        ctx.value_block = value_block
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        b, log_a, write, read, states = ctx.saved_tensors
        batch, length, heads, channels = b.shape
        state_size = write.shape[-1]
        chunks = states.shape[2]
        _, backward_kernel = _kernels()
        dy = dy.float().contiguous() if dy is not None else torch.zeros_like(b, dtype=torch.float32)
        db = torch.empty(b.shape, device=b.device, dtype=torch.float32)
        dla = torch.empty_like(db)
        ds0 = torch.empty(batch, heads, channels, state_size, device=b.device, dtype=torch.float32)
        BP, BN, blocks = _blocks(channels, state_size, ctx.value_block)
        dk = torch.empty(blocks, *write.shape, device=b.device, dtype=torch.float32)  # per block's partial sums
        dq = torch.empty_like(dk)
        backward_kernel[(batch * heads, blocks)](
            b, log_a, write, read, dy, states, dfinal.float().contiguous() if dfinal is not None else ds0,
            db, dla, dk, dq, ds0, dk[0].numel(), length, heads, channels, state_size, chunks,
            HAS_DFINAL=dfinal is not None, CHUNK=CHUNK, BP=BP, BN=BN,
        )
        dk, dq = (d[0] if blocks == 1 else d.sum(0) for d in (dk, dq))  # (B, L, H, N)
        b_dtype, la_dtype, k_dtype, q_dtype = ctx.dtypes
        grad_s0 = ds0.to(ctx.initial_state) if ctx.initial_state is not None else None
        return db.to(b_dtype), dla.to(la_dtype), dk.to(k_dtype), dq.to(q_dtype), grad_s0, None


def triton_selective_scan(b, log_a, write, read, initial_state=None, value_block: int = VALUE_BLOCK):
    """(y, final state) of the selective recurrence, both fp32; differentiable in every input.
    Inputs are validated by :func:`hallamonic_selective_scan.selective_scan`. ``value_block``: value
    channels per program (a power of two >= 16; benchmarks compare settings)."""
    if not triton_available():
        raise RuntimeError("triton_selective_scan needs triton with CUDA, or TRITON_INTERPRET=1")
    if value_block < 16 or value_block & (value_block - 1):
        raise ValueError(f"triton_selective_scan: value_block must be a power of two >= 16, got {value_block}")
    return _TritonSelectiveScan.apply(b, log_a, write, read, initial_state, value_block)
