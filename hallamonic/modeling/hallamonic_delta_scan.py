"""The gated delta rule: an expanded HarmonicBlock level that overwrites instead of adding.

With ``update_rule="delta"`` every level of an expanded block (``state_size`` N > 1, identity
features) keeps the same per-head (P, N) matrix state as the selective recurrence, but a write
replaces what the state returned for the write vector instead of adding to it (DeltaNet; with a
decay, Gated DeltaNet):

    S_t = a_t S_{t-1} + beta_t (u_t - a_t S_{t-1} k_t) k_t^T     (k_t unit-norm, beta_t in (0, 1))
    y_t = S_t q_t

u_t: (P,) the level's input, k_t / q_t: (N,) write / read vectors, beta_t the head's write
strength, a_t ONE decay per head. A decayed sum keeps every token's value k-weighted in the state,
so a key written twice returns the sum of both values and a query matches the whole history
blurred together; the delta rule stores the new value under k_t exactly (beta = 1), which is what
associative recall needs. Measured on SmolLM2's recall layers 20-24 (fresh blocks, 180 steps,
evals/results/smollm2-135m-layer-swap): LAMBADA 0.163 with this rule vs 0.120 with the sum.

Implementations, one entry point :func:`delta_scan` plus :func:`delta_step` for generation:

* ``"reference"`` -- the plain loop above. Slow, obviously correct: the ground truth in tests.
* ``"chunked"``   -- the WY form: inside a chunk of C tokens the corrected writes
  e_s = beta_s (u_s - a_s S_{s-1} k_s) solve one unit lower-triangular C x C system,
  (I + A) E = diag(beta) U - diag(beta gamma) K M_0 with A_ts = beta_t (gamma_t / gamma_s) k_t.k_s
  (s < t) and gamma the decay from the chunk's start (inverted by blocked forward substitution);
  then Y = diag(gamma) Q M_0 + (Q K^T o D) E and the state moves on as
  M = gamma_C M_0 + (K o gamma_C / gamma)^T E. Only one state per chunk exists; autograd gives the
  backward (the inverse's too).

The decay is one number per head because the chunk's system A mixes all of a head's value channels
through k_t.k_s: a decay per value channel would need one C x C system per channel. Callers clamp
log a >= -MAX_DECAY_RATE; within a chunk decays are formed as exp(G_t - G_s) of cumulative logs,
masked above the diagonal before exponentiating, so nothing overflows, and decays past fp32's range
underflow to exactly 0 (correct: that history is gone). Everything runs in fp32 with autocast off.

This file is shipped inside every converted checkpoint: it imports only torch and the standard
library, and does no I/O.
"""

from __future__ import annotations

import torch

CHUNK = 32  # tokens per chunk of the chunked path (fwd+bwd at (4, 512, 9 heads, 64, 64): 0.16 s vs 0.55 s with 64)
BACKENDS = ("auto", "reference", "chunked")


def _check_inputs(values, log_a, write, read, beta, initial_state) -> None:
    if values.dim() != 4:
        raise ValueError(f"delta_scan: `values` must be (batch, length, heads, channels), got {tuple(values.shape)}")
    if log_a.shape != values.shape[:3] or beta.shape != values.shape[:3]:
        raise ValueError(
            f"delta_scan: `log_a` and `beta` must both be (batch, length, heads) = {tuple(values.shape[:3])}, "
            f"got {tuple(log_a.shape)} and {tuple(beta.shape)}"
        )
    if write.dim() != 4 or write.shape != read.shape or write.shape[:3] != values.shape[:3]:
        raise ValueError(
            f"delta_scan: `write` and `read` must both be (batch, length, heads, state) matching `values`' first "
            f"three dims {tuple(values.shape[:3])}, got {tuple(write.shape)} and {tuple(read.shape)}"
        )
    if values.shape[1] == 0:
        raise ValueError("delta_scan: the sequence is empty (length 0)")
    if initial_state is not None:
        expected = (values.shape[0], values.shape[2], values.shape[3], write.shape[3])
        if tuple(initial_state.shape) != expected:
            raise ValueError(
                f"delta_scan: `initial_state` must be (batch, heads, channels, state) = {expected}, "
                f"got {tuple(initial_state.shape)}"
            )


def delta_step(values, log_a, write, read, beta, state):
    """One token: values (B, H, P), log_a / beta (B, H), write (unit rows) / read (B, H, N), state
    (B, H, P, N) fp32 -> (new state, y (B, H, P))."""
    dtype = state.dtype
    decayed = state * log_a.to(dtype).exp()[..., None, None]  # (B, H, P, N)
    write = write.to(dtype)
    miss = values.to(dtype) - torch.einsum("bhpn,bhn->bhp", decayed, write)  # what k does not yet return: (B, H, P)
    new = decayed + (beta.to(dtype)[..., None] * miss)[..., None] * write[:, :, None, :]
    return new, torch.einsum("bhpn,bhn->bhp", new, read.to(dtype))


def _reference(values, log_a, write, read, beta, initial_state):
    batch, length, heads, channels = values.shape
    state = initial_state if initial_state is not None else values.new_zeros(batch, heads, channels, write.shape[-1])
    outputs = []
    for t in range(length):
        state, y = delta_step(values[:, t], log_a[:, t], write[:, t], read[:, t], beta[:, t], state)
        outputs.append(y)
    return torch.stack(outputs, 1), state  # (B, L, H, P), (B, H, P, N)


def _invert_unit_lower(system: torch.Tensor) -> torch.Tensor:
    """The inverse of a unit lower-triangular (..., C, C) system, C a power of two.

    Blocked forward substitution, as flash-linear-attention inverts its chunk systems: the inverse of
    [[L11, 0], [L21, L22]] is [[T11, 0], [-T22 L21 T11, T22]] with T = the blocks' inverses, so
    starting from 1 x 1 blocks (ones: the diagonal is unit) log2(C) doublings build it from batched
    matmuls. Why not torch.linalg.solve_triangular: Inductor (torch 2.13, CPU) compiling that solve
    inside a whole SmolLM2 delta-rule block, backward traced without autocast, gave non-finite
    gradients (real attention inputs and a random SmolLM2-shaped block alike; eager, aot_eager and
    the scan compiled alone were finite); a graph break around the solve fixed that but split the
    block's graph. These are ordinary ops that compile like the rest of the block, with eager's
    gradients; in eager they cost what the solve does, and compiled they were no slower than the
    graph break (benchmarks/results/compile-backward-precision/)."""
    size = system.shape[-1]
    if size & (size - 1):
        raise ValueError(f"_invert_unit_lower: the system's size must be a power of two, got {size}")
    lead = system.shape[:-2]
    inverse = system.new_ones(*lead, size, 1, 1)  # (..., C, 1, 1): the inverses of the 1 x 1 diagonal blocks
    block = 1
    while block < size:
        pairs = size // (2 * block)
        diagonal = system.reshape(*lead, pairs, 2 * block, pairs, 2 * block).diagonal(dim1=-4, dim2=-2)  # (..., 2b, 2b, pairs)
        lower_left = diagonal.movedim(-1, -3)[..., block:, :block]  # L21 of each 2b x 2b diagonal block: (..., pairs, b, b)
        upper, lower = inverse[..., 0::2, :, :], inverse[..., 1::2, :, :]  # T11, T22: (..., pairs, b, b)
        corner = -(lower @ lower_left @ upper)  # (..., pairs, b, b)
        inverse = torch.cat(
            [torch.cat([upper, torch.zeros_like(upper)], -1), torch.cat([corner, lower], -1)], -2
        )  # (..., pairs, 2b, 2b)
        block *= 2
    return inverse.reshape(*lead, size, size)


def _solve_unit_lower(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """X with system X = rhs, system unit lower-triangular: (..., C, C), (..., C, F) -> (..., C, F).
    Its reference twin is torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    (tests compare them forward and backward)."""
    return _invert_unit_lower(system) @ rhs


def _chunked(values, log_a, write, read, beta, initial_state, chunk: int = CHUNK):
    batch, length, heads, channels = values.shape
    size = write.shape[-1]
    pad = (-length) % chunk
    if pad:  # padded tail: no decay (log a = 0), no write (beta = 0); its outputs are dropped
        values, write, read = (torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) for t in (values, write, read))
        log_a, beta = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (log_a, beta))
    chunks = values.shape[1] // chunk

    def split(t):  # (B, L, H, F) -> (B, n, H, C, F)
        return t.reshape(batch, chunks, chunk, heads, -1).transpose(2, 3)

    u, k, q = split(values), split(write), split(read)  # (B, n, H, C, P|N)
    cum = split(log_a.unsqueeze(-1)).squeeze(-1).cumsum(-1)  # (B, n, H, C) log decay from the chunk's start
    b = split(beta.unsqueeze(-1)).squeeze(-1)  # (B, n, H, C)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=values.device).tril()
    strictly = causal & ~torch.eye(chunk, dtype=torch.bool, device=values.device)
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()  # (B, n, H, C, C) gamma_t/gamma_s
    corrections = (b.unsqueeze(-1) * decay * (k @ k.transpose(-1, -2))).masked_fill(~strictly, 0.0)  # A: (B, n, H, C, C)
    system = corrections + torch.eye(chunk, dtype=values.dtype, device=values.device)
    rhs = torch.cat([b.unsqueeze(-1) * u, (b * cum.exp()).unsqueeze(-1) * k], dim=-1)  # (B, n, H, C, P + N)
    solved = _solve_unit_lower(system, rhs)  # (B, n, H, C, P + N)
    writes, state_part = solved[..., :channels], solved[..., channels:]  # E = writes - state_part @ M0
    scores = (q @ k.transpose(-1, -2)) * decay  # (B, n, H, C, C) causal: decay is 0 above the diagonal
    read_state = cum.exp().unsqueeze(-1) * q  # (B, n, H, C, N) reads of the state entering the chunk
    total = cum[..., -1:]  # (B, n, H, 1) log decay over the whole chunk
    to_end = (total - cum).exp().unsqueeze(-1) * k  # (B, n, H, C, N)
    state = (  # M = S^T: (B, H, N, P)
        initial_state.transpose(-1, -2) if initial_state is not None else values.new_zeros(batch, heads, size, channels)
    )
    outputs = []
    # unbind, not [:, c]: each slice's backward would write a zero-filled full-size gradient (measured:
    # 70% of a step); unbind's backward is one stack.
    per_chunk = zip(*(t.unbind(1) for t in (writes, state_part, read_state, scores, total.exp(), to_end)))
    for writes_c, state_part_c, read_state_c, scores_c, total_c, to_end_c in per_chunk:
        corrected = writes_c - state_part_c @ state  # E: (B, H, C, P)
        outputs.append(read_state_c @ state + scores_c @ corrected)  # (B, H, C, P)
        state = total_c.unsqueeze(-1) * state + to_end_c.transpose(-1, -2) @ corrected
    y = torch.stack(outputs, 1).transpose(2, 3).reshape(batch, chunks * chunk, heads, channels)[:, :length]
    return y, state.transpose(-1, -2)  # (B, L, H, P), (B, H, P, N)


def delta_scan(values, log_a, write, read, beta, initial_state=None, backend: str = "auto"):
    """The gated delta rule over a sequence.

    Args:
        values: (B, L, H, P) the level's inputs u_t.
        log_a: (B, L, H) log decay per head, <= 0 (clamp >= -MAX_DECAY_RATE; 0 at padding).
        write: (B, L, H, N) unit-norm write vectors k_t. read: (B, L, H, N) read vectors q_t.
        beta: (B, L, H) write strengths in [0, 1] (0 at padding).
        initial_state: (B, H, P, N) fp32 or None (zeros).
    Returns:
        y (B, L, H, P) and the final state (B, H, P, N), both fp32.
    """
    if backend not in BACKENDS:
        raise ValueError(f"delta_scan: unknown backend {backend!r}; choose one of {BACKENDS}")
    _check_inputs(values, log_a, write, read, beta, initial_state)
    with torch.autocast(values.device.type, enabled=False):
        dtype = torch.float64 if values.dtype == torch.float64 else torch.float32  # fp64 stays (tests)
        args = [t.to(dtype) for t in (values, log_a, write, read, beta)]
        state = initial_state.to(dtype) if initial_state is not None else None
        if backend == "reference":
            return _reference(*args, state)
        return _chunked(*args, state)
