"""The selective recurrence of an expanded HarmonicBlock level (``state_size`` N > 1).

Per head, the level keeps a (P, N) matrix state: P value channels (the head's slice of the value
stream), each with N numbers. The current token chooses what to write and what to read:

    S_t = a_t[:, None] * S_{t-1} + b_t ⊗ k_t        (a_t, b_t: (P,) decays and inputs; k_t: (N,))
    y_t = S_t q_t                                    (q_t: (N,) read vector; y_t: (P,))

The decay stays per value channel (the level's timescales, broadcast over N). With constant a this
is a causal linear attention y_t = Σ_s a^(t-s) (q_t·k_s) b_s, which is why a converted block can
start from the teacher's own queries and keys.

Implementations, one entry point :func:`selective_scan`:

* ``"reference"`` -- the plain loop above. Slow, obviously correct: the ground truth in tests.
* ``"chunked"``   -- matmuls inside chunks of ``CHUNK`` steps; the (P, N) state is carried between
  chunks by a loop over chunks (L / CHUNK steps). The (L, P, N) state sequence is never formed:
  only one state per chunk, (B, H, L/CHUNK, P, N). Autograd gives the
  backward; wrap the caller in activation checkpointing to keep training memory at the inputs.
* ``"triton"``    -- the same chunked algorithm fused into one GPU kernel per direction
  (``hallamonic_selective_scan_triton.py``): the state stays in registers, only the state entering
  each chunk is written, and the backward recomputes each chunk from it. "auto" picks it on CUDA
  for N <= AUTO_TRITON_MAX_STATE (see :func:`auto_backend`).

Numerics: everything accumulates in fp32. Inside a chunk the decay from s to t is
exp(cum_t - cum_s), split as exp(cum_t - m) * exp(m - cum_s) around the chunk's middle m so that the
intra-chunk part is two matmuls; each factor stays below exp(CHUNK/2 * MAX_DECAY_RATE) (e^48),
far inside fp32's range, because callers clamp log a >= -MAX_DECAY_RATE. The decays to the chunk's
end and from the sequence start reuse them with per-chunk factors exp(total - m) <= 1 and
exp(m) >= e^-48, so each level costs two full-size exponentials. Autocast is switched off inside
(mixed-precision training would round the matmuls' operands to bf16): the gradient of log a is a
difference of nearly equal terms where decays are fast, and with bf16 operands it came out 18% off
at a ~ 0.05 (2% for decays spread over the range) against ~1e-5 in fp32; y, the state and the other
gradients were off ~0.4%.

This file is shipped inside every converted checkpoint: it imports only torch, the standard library
and its siblings, and does no I/O.
"""

from __future__ import annotations

import torch

try:  # Triton is optional: absent on CPU-only machines and in CI.
    from .hallamonic_selective_scan_triton import triton_available, triton_selective_scan
except ImportError:  # pragma: no cover - exercised when triton is not installed
    triton_selective_scan = None

    def triton_available() -> bool:
        return False


CHUNK = 32  # steps per chunk of the chunked path
MAX_DECAY_RATE = 3.0  # callers clamp log a >= -3 (a >= 0.05): keeps the chunk factors finite
BACKENDS = ("auto", "reference", "chunked", "triton")
# "auto" picks the fused kernel on CUDA up to this state size. Measured on an H200, 2026-12-04
# (`python -m hallamonic.bench.selective`, evals/results/study-enwik8-28m-h200): outputs and every
# gradient within 1.3e-6 of the chunked path; forward + backward 5.4x faster at (1, 100, 2, 36, 16)
# and 2.9x at (1, 65536, 8, 64, 16), but 0.35x at (2, 4096, 9, 64, 64) (N = 64, a conversion's head_dim).
# That kernel ran one program per (batch, head); it now splits the value channels (VALUE_BLOCK), which
# should lift N = 64 most, but is unmeasured on a GPU: raise this only after the bench says so.
AUTO_TRITON_MAX_STATE = 32


def auto_backend(is_cuda: bool, state_size: int, triton_ok: bool) -> str:
    """The backend "auto" runs: the fused kernel where it measured faster, else the chunked path."""
    return "triton" if (is_cuda and triton_ok and state_size <= AUTO_TRITON_MAX_STATE) else "chunked"


def _check_inputs(b, log_a, write, read, initial_state) -> None:
    if b.dim() != 4 or log_a.shape != b.shape:
        raise ValueError(
            f"selective_scan: `b` and `log_a` must both be (batch, length, heads, channels), got "
            f"{tuple(b.shape)} and {tuple(log_a.shape)}"
        )
    if write.dim() != 4 or write.shape != read.shape or write.shape[:3] != b.shape[:3]:
        raise ValueError(
            f"selective_scan: `write` and `read` must both be (batch, length, heads, state) matching `b`'s first "
            f"three dims {tuple(b.shape[:3])}, got {tuple(write.shape)} and {tuple(read.shape)}"
        )
    if b.shape[1] == 0:
        raise ValueError("selective_scan: the sequence is empty (length 0)")
    if initial_state is not None:
        expected = (b.shape[0], b.shape[2], b.shape[3], write.shape[3])
        if tuple(initial_state.shape) != expected:
            raise ValueError(
                f"selective_scan: `initial_state` must be (batch, heads, channels, state) = {expected}, "
                f"got {tuple(initial_state.shape)}"
            )


# --------------------------------------------------------------------------------------------
# Reference twin: the plain loop
# --------------------------------------------------------------------------------------------
def reference_selective_scan(b, log_a, write, read, initial_state=None):
    """(y, final state) by one step at a time in fp32; shapes as in :func:`selective_scan`."""
    batch, length, heads, channels = b.shape
    state = (
        initial_state.float()
        if initial_state is not None
        else b.new_zeros(batch, heads, channels, write.shape[-1], dtype=torch.float32)
    )
    outputs = []
    for t in range(length):
        state, y = selective_step(b[:, t], log_a[:, t], write[:, t], read[:, t], state)
        outputs.append(y)
    return torch.stack(outputs, dim=1), state  # (B, L, H, P) fp32, (B, H, P, N) fp32


def selective_step(b_t, log_a_t, write_t, read_t, state):
    """One token (generation): b_t, log_a_t (B, H, P); write_t, read_t (B, H, N); state (B, H, P, N)."""
    state = log_a_t.float().exp().unsqueeze(-1) * state.float() + b_t.float().unsqueeze(-1) * write_t.float().unsqueeze(-2)
    y = torch.einsum("bhpn,bhn->bhp", state, read_t.float())  # (B, H, P)
    return state, y


# --------------------------------------------------------------------------------------------
# Chunked: matmuls inside chunks, one carried state per chunk
# --------------------------------------------------------------------------------------------
def _to_chunks(x: torch.Tensor, chunks: int) -> torch.Tensor:
    """(B, chunks*C, H, F) -> (B, H, chunks, C, F), fp32."""
    batch, length, heads, features = x.shape
    return x.float().view(batch, chunks, length // chunks, heads, features).permute(0, 3, 1, 2, 4)


def chunked_selective_scan(b, log_a, write, read, initial_state=None, chunk: int = CHUNK):
    """(y, final state) with matmuls inside chunks; differentiable by autograd. Always fp32, also
    under autocast (see Numerics above)."""
    with torch.autocast(b.device.type, enabled=False):
        return _chunked_selective_scan(b, log_a, write, read, initial_state, chunk)


def _chunked_selective_scan(b, log_a, write, read, initial_state, chunk):
    batch, length, heads, channels = b.shape
    chunks = -(-length // chunk)
    pad = chunks * chunk - length
    if pad:  # a = 1, b = 0, k = q = 0 past the end: the real steps' states and outputs are unchanged
        b, log_a, write, read = (torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) for t in (b, log_a, write, read))
    b_c, log_a_c = _to_chunks(b, chunks), _to_chunks(log_a, chunks)  # (B, H, n, C, P)
    k_c, q_c = _to_chunks(write, chunks), _to_chunks(read, chunks)  # (B, H, n, C, N)

    cum = log_a_c.cumsum(dim=3)  # (B, H, n, C, P): log of the decay from the chunk start to t
    middle = cum[:, :, :, chunk // 2 - 1 : chunk // 2]  # (B, H, n, 1, P)
    total = cum[:, :, :, -1]  # (B, H, n, P): log decay across the whole chunk

    # Every decay below is one of two full-size exponentials times a per-chunk factor:
    # exp(cum_t - cum_s) = grow_t * shrunk_s, exp(total - cum_s) = exp(total - m) * shrunk_s,
    # exp(cum_t) = grow_t * exp(m).
    grow = (cum - middle).exp()  # (B, H, n, C, P): exp(cum_t - m)
    shrunk_b = (middle - cum).exp() * b_c  # (B, H, n, C, P): exp(m - cum_s) b_s

    # Within the chunk: y_t = sum_{s<=t} (q_t . k_s) exp(cum_t - cum_s) b_s.
    scores = torch.tril(q_c @ k_c.transpose(-1, -2))  # (B, H, n, C, C)
    inside = scores @ shrunk_b  # (B, H, n, C, P), times grow_t below

    # What each chunk adds to the state, and the state entering every chunk: a loop over chunks
    # (L / CHUNK steps; autograd sums the decay's gradient over N itself, so the per-(P) decay is
    # never broadcast to (P, N) and no flipped copies are made for a reverse scan).
    to_end = (total.unsqueeze(3) - middle).exp() * shrunk_b  # (B, H, n, C, P): decayed to the chunk's end
    added = to_end.transpose(-1, -2) @ k_c  # (B, H, n, P, N)
    decay = total.exp().unsqueeze(-1)  # (B, H, n, P, 1)
    state = initial_state.float() if initial_state is not None else None  # (B, H, P, N)
    states = []  # the state entering every chunk
    for added_c, decay_c in zip(added.unbind(2), decay.unbind(2)):  # unbind: one stacked gradient, not n
        states.append(state if state is not None else torch.zeros_like(added_c))
        state = added_c if state is None else torch.addcmul(added_c, decay_c, state)
    before = torch.stack(states, dim=2)  # (B, H, n, P, N)

    # Across chunks: y_t = grow_t * (inside_t + exp(m) * (S_before q_t)).
    y = grow * (inside + middle.exp() * (q_c @ before.transpose(-1, -2)))  # (B, H, n, C, P)
    y = y.permute(0, 2, 3, 1, 4).reshape(batch, chunks * chunk, heads, channels)[:, :length]
    return y, state  # (B, L, H, P), (B, H, P, N)


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------
def selective_scan(
    b: torch.Tensor,
    log_a: torch.Tensor,
    write: torch.Tensor,
    read: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs and final state of S_t = a_t S_{t-1} + b_t ⊗ k_t, y_t = S_t q_t, per head.

    Args:
        b: (batch, length, heads, channels) inputs (a level's (1 - a) * u).
        log_a: same shape, log decays in [-MAX_DECAY_RATE, 0].
        write: (batch, length, heads, state) write vectors k_t.
        read: same shape, read vectors q_t.
        initial_state: (batch, heads, channels, state) or None for zeros.
        backend: "auto" (:func:`auto_backend`: Triton on CUDA for small N, else chunked), "reference",
            "chunked" or "triton".

    Returns:
        y (batch, length, heads, channels) in fp32, and the final state (batch, heads, channels, state) fp32.
    """
    _check_inputs(b, log_a, write, read, initial_state)
    if backend not in BACKENDS:
        raise ValueError(f"selective_scan: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = auto_backend(b.is_cuda, write.shape[-1], b.is_cuda and triton_available())
    if backend == "reference":
        return reference_selective_scan(b, log_a, write, read, initial_state)
    if backend == "chunked":
        return chunked_selective_scan(b, log_a, write, read, initial_state)
    if not triton_available():
        raise ValueError("selective_scan: backend='triton' needs the `triton` package with CUDA (or TRITON_INTERPRET=1)")
    return triton_selective_scan(b, log_a, write, read, initial_state)
