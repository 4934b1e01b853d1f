"""The diagonal linear recurrence at the heart of every HarmonicBlock level.

    h_t = a_t * h_{t-1} + b_t        (elementwise over channels, h_{-1} = initial_state)

Three implementations share one entry point, :func:`scan`:

* ``"reference"`` -- a plain loop over time. Slow, obviously correct: the ground truth in tests.
* ``"torch"``     -- a hierarchical chunked scan in PyTorch with a hand-written backward. The
  sequence is cut into chunks of 16 steps; one loop walks the positions inside every chunk at
  once, the chunks' end states are scanned the same way (recursively) to carry states across
  chunks, and one elementwise pass replays the carries. ~16 * log16(L) Python steps, not L.
* ``"triton"``    -- a chunked GPU kernel (``hallamonic_scan_triton.py``), forward and backward.

Why a hand-written backward: autograd through a Python loop over time records L tiny graph nodes
and is ~1000x slower than the data movement. The gradient of a linear recurrence is itself a
reverse linear recurrence,

    g_t  = dh_t + a_{t+1} * g_{t+1}       (g_{L-1} = dh_{L-1})
    db_t = g_t,   da_t = g_t * h_{t-1},   d initial_state = a_0 * g_0,

so the backward pass reuses the forward scan on time-reversed inputs.

All accumulation is fp32 whatever the input dtype: in bf16 a decay of 0.999 rounds to 1.0 and
a state summed over thousands of steps loses every low-order bit. The output follows ``b``'s dtype.

This file is shipped inside every converted checkpoint: it imports only torch, the standard
library and its siblings, and does no I/O.
"""

from __future__ import annotations


import torch

try:  # Triton is optional: absent on CPU-only machines and in CI.
    from .hallamonic_scan_triton import triton_scan, triton_available
except ImportError:  # pragma: no cover - exercised when triton is not installed
    triton_scan = None

    def triton_available() -> bool:
        return False


BACKENDS = ("auto", "reference", "torch", "triton")


# --------------------------------------------------------------------------------------------
# Input checking
# --------------------------------------------------------------------------------------------
def _check_inputs(a: torch.Tensor, b: torch.Tensor, initial_state: torch.Tensor | None) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"scan: `{name}` must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(
                f"scan: `{name}` must have shape (batch, length, channels), got {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise ValueError(f"scan: `{name}` must be a floating-point tensor, got {t.dtype}")
    if a.shape != b.shape:
        raise ValueError(f"scan: `a` and `b` must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] == 0:
        raise ValueError("scan: the sequence is empty (length 0); there is nothing to scan")
    if a.device != b.device:
        raise ValueError(f"scan: `a` is on {a.device} but `b` is on {b.device}")
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or not initial_state.is_floating_point():
            raise ValueError("scan: `initial_state` must be a floating-point tensor or None")
        expected = (a.shape[0], a.shape[2])
        if tuple(initial_state.shape) != expected:
            raise ValueError(
                f"scan: `initial_state` must have shape (batch, channels) = {expected}, "
                f"got {tuple(initial_state.shape)}"
            )
        if initial_state.device != a.device:
            raise ValueError(f"scan: `initial_state` is on {initial_state.device} but `a` is on {a.device}")


# --------------------------------------------------------------------------------------------
# Reference: the plain loop (ground truth; autograd flows through it, slowly)
# --------------------------------------------------------------------------------------------
def reference_scan(a: torch.Tensor, b: torch.Tensor, initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """h_t = a_t * h_{t-1} + b_t, one step at a time, in fp32."""
    batch, length, channels = a.shape
    h = (
        initial_state.float()
        if initial_state is not None
        else torch.zeros(batch, channels, dtype=torch.float32, device=a.device)
    )
    states = []
    for t in range(length):
        h = a[:, t].float() * h + b[:, t].float()  # (B, D)
        states.append(h)
    return torch.stack(states, dim=1).to(b.dtype)  # (B, L, D)


def scan_step(a_t: torch.Tensor, b_t: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One recurrent step for generation: h = a_t * h + b_t, in fp32. Shapes (batch, channels)."""
    return a_t.float() * state.float() + b_t.float()


# --------------------------------------------------------------------------------------------
# Torch: two-level chunked scan with an explicit reverse-scan backward
# --------------------------------------------------------------------------------------------
CHUNK = 16  # steps per chunk at every level of the hierarchical torch scan


def _chunked_scan_fp32(
    a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None, chunk: int = CHUNK
) -> torch.Tensor:
    """Forward scan on fp32 (B, L, D) tensors; returns all states (B, L, D) in fp32. No autograd.

    Hierarchical: scan every chunk of ``chunk`` steps locally (one Python step per position,
    vectorised over all chunks), scan the chunks' end states recursively to get the state entering
    each chunk, then replay those carries into the chunks. Python steps: ~chunk * log_chunk(L).
    """
    batch, length, channels = a.shape
    if length <= chunk:  # base case: a short plain loop
        h = torch.empty_like(b)
        state = h0
        for t in range(length):
            state = b[:, t] if state is None else torch.addcmul(b[:, t], a[:, t], state)
            h[:, t] = state
        return h

    n_chunks = -(-length // chunk)
    pad = n_chunks * chunk - length
    if pad:
        # Padding with a=1, b=0 leaves every state of the real steps unchanged.
        a = torch.cat([a, a.new_ones(batch, pad, channels)], dim=1)
        b = torch.cat([b, b.new_zeros(batch, pad, channels)], dim=1)
    a = a.reshape(batch, n_chunks, chunk, channels)
    b = b.reshape(batch, n_chunks, chunk, channels)

    # 1) Local scans from a zero state, and the running product of decays inside each chunk.
    h = torch.empty_like(b)  # (B, N, C, D)
    h[:, :, 0] = b[:, :, 0]
    for t in range(1, chunk):
        torch.addcmul(b[:, :, t], a[:, :, t], h[:, :, t - 1], out=h[:, :, t])
    a_prod = torch.cumprod(a, dim=2)  # (B, N, C, D): prod_{s<=t in chunk} a_s

    # 2) State at the end of every chunk = a scan over chunks (recursively), then shift by one
    #    to get the state entering every chunk.
    ends = _chunked_scan_fp32(a_prod[:, :, -1], h[:, :, -1], h0, chunk)  # (B, N, D)
    first = h0 if h0 is not None else ends.new_zeros(batch, channels)
    carry = torch.cat([first.unsqueeze(1), ends[:, :-1]], dim=1)  # (B, N, D)

    # 3) Replay: h += (product of decays so far) * carry.
    h.addcmul_(a_prod, carry.unsqueeze(2))
    return h.view(batch, n_chunks * chunk, channels)[:, :length]


def _reverse_scan_grads(
    a: torch.Tensor, h: torch.Tensor, h0: torch.Tensor | None, grad_h: torch.Tensor, scan_fn
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of the scan from its outputs, via one reverse scan (all fp32 (B, L, D)).

    g_t = dh_t + a_{t+1} g_{t+1};  db = g;  da_t = g_t * h_{t-1};  dh0 = a_0 * g_0.
    """
    a_next = torch.cat([a[:, 1:], a.new_zeros(a.shape[0], 1, a.shape[2])], dim=1)  # a_{t+1}, 0 at the end
    g = scan_fn(a_next.flip(1), grad_h.flip(1), None).flip(1)  # (B, L, D)
    if h0 is None:
        h_prev = torch.cat([h.new_zeros(h.shape[0], 1, h.shape[2]), h[:, :-1]], dim=1)
    else:
        h_prev = torch.cat([h0.unsqueeze(1), h[:, :-1]], dim=1)
    grad_a = g * h_prev
    grad_h0 = a[:, 0] * g[:, 0] if h0 is not None else None
    return grad_a, g, grad_h0


class _TorchScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, initial_state):
        a32, b32 = a.float(), b.float()
        h0 = initial_state.float() if initial_state is not None else None
        h = _chunked_scan_fp32(a32, b32, h0)
        ctx.save_for_backward(a32, h, h0)
        ctx.dtypes = (a.dtype, b.dtype, initial_state.dtype if initial_state is not None else None)
        return h.to(b.dtype)

    @staticmethod
    def backward(ctx, grad_h):
        a32, h, h0 = ctx.saved_tensors
        a_dtype, b_dtype, h0_dtype = ctx.dtypes
        grad_a, grad_b, grad_h0 = _reverse_scan_grads(a32, h, h0, grad_h.float(), _chunked_scan_fp32)
        return (
            grad_a.to(a_dtype),
            grad_b.to(b_dtype),
            grad_h0.to(h0_dtype) if grad_h0 is not None else None,
        )


def torch_scan(a: torch.Tensor, b: torch.Tensor, initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """Chunked PyTorch scan (any device), differentiable with an explicit reverse scan."""
    return _TorchScan.apply(a, b, initial_state)


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------
def scan(
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """All states of h_t = a_t * h_{t-1} + b_t.

    Args:
        a: decays in (0, 1], shape (batch, length, channels).
        b: inputs, same shape as ``a``.
        initial_state: (batch, channels) state before t=0, or None for zeros.
        backend: "auto" (Triton for CUDA tensors when Triton is installed, else "torch"),
            "reference", "torch" or "triton".

    Returns:
        h of shape (batch, length, channels) in ``b``'s dtype; the final state is ``h[:, -1]``.
    """
    _check_inputs(a, b, initial_state)
    if backend not in BACKENDS:
        raise ValueError(f"scan: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "triton" if (a.is_cuda and triton_available()) else "torch"
    if backend == "reference":
        return reference_scan(a, b, initial_state)
    if backend == "torch":
        return torch_scan(a, b, initial_state)
    if not triton_available():
        raise ValueError("scan: backend='triton' needs the `triton` package (pip install 'hallamonic[triton]')")
    return triton_scan(a, b, initial_state)
