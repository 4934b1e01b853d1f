"""The gated delta rule's chunked path against its plain-loop reference twin: outputs, final states
and every gradient, on odd shapes, length 1, decays near 0 and near 1, fp32 / fp64, with and
without an initial state; the one-step update used by generation; and what the rule is for: a key
written twice returns its latest value, not the sum."""

from __future__ import annotations

import pytest
import torch

from hallamonic.modeling.hallamonic_delta_scan import CHUNK, _solve_unit_lower, delta_scan, delta_step
from hallamonic.modeling.hallamonic_selective_scan import MAX_DECAY_RATE


def inputs(batch, length, heads, channels, state, decay, dtype, initial, seed=0):
    generator = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    uniform = lambda *shape: torch.rand(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    if decay == "near-1":
        log_a = -uniform(batch, length, heads) * 1e-3
    elif decay == "near-0":
        log_a = -MAX_DECAY_RATE + uniform(batch, length, heads) * 0.1
    else:
        log_a = -uniform(batch, length, heads) * MAX_DECAY_RATE
    write = torch.nn.functional.normalize(rand(batch, length, heads, state), dim=-1)
    tensors = [rand(batch, length, heads, channels), log_a, write, rand(batch, length, heads, state), uniform(batch, length, heads)]
    tensors = [t.to(dtype).requires_grad_() for t in tensors]
    h0 = rand(batch, heads, channels, state).to(dtype).requires_grad_() if initial else None
    return tensors, h0


def run(backend, tensors, h0, seed=1):
    y, final = delta_scan(*tensors, h0, backend=backend)
    generator = torch.Generator().manual_seed(seed)
    loss = (y * torch.randn(y.shape, generator=generator, dtype=y.dtype)).sum()
    loss = loss + (final * torch.randn(final.shape, generator=generator, dtype=final.dtype)).sum()
    grads = torch.autograd.grad(loss, tensors + ([h0] if h0 is not None else []))
    return y, final, grads


@pytest.mark.parametrize("length", [1, 7, CHUNK, CHUNK + 1, 3 * CHUNK - 5])
@pytest.mark.parametrize("shape", [(1, 1, 4, 3), (2, 3, 5, 8)], ids=["b1h1", "b2h3"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
def test_chunked_matches_reference(length, shape, initial):
    batch, heads, channels, state = shape
    tensors, h0 = inputs(batch, length, heads, channels, state, "any", torch.float64, initial)
    ref, fast = run("reference", tensors, h0), run("chunked", tensors, h0)
    torch.testing.assert_close(fast[0], ref[0], atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(fast[1], ref[1], atol=1e-10, rtol=1e-9)
    for got, want in zip(fast[2], ref[2]):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("decay", ["near-0", "near-1"])
def test_chunked_matches_reference_at_extreme_decays_in_fp32(decay):
    tensors, h0 = inputs(2, 2 * CHUNK + 3, 2, 6, 8, decay, torch.float32, True)
    ref, fast = run("reference", tensors, h0), run("chunked", tensors, h0)
    for got, want in zip([fast[0], fast[1], *fast[2]], [ref[0], ref[1], *ref[2]]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("size", [1, 2, 8, CHUNK])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_unit_lower_solve_matches_its_reference_twin(size, dtype):
    """The chunk's solve (blocked inverse times rhs) against torch.linalg.solve_triangular, forward
    and backward, on the systems the scan builds: beta-weighted Gram matrices of unit keys, here
    strongly aligned (a shared component, as attention keys have), which makes the inverse's entries
    grow. The system's gradient is compared below the diagonal only: a unit-triangular solve does
    not define the diagonal's."""
    generator = torch.Generator().manual_seed(size)
    keys = torch.nn.functional.normalize(torch.randn(2, 3, size, 16, generator=generator, dtype=torch.float64) + 2.0, dim=-1)
    beta = torch.rand(2, 3, size, 1, generator=generator, dtype=torch.float64)
    system = (beta * (keys @ keys.transpose(-1, -2))).tril(-1) + torch.eye(size, dtype=torch.float64)  # (2, 3, C, C)
    rhs = torch.randn(2, 3, size, 24, generator=generator, dtype=torch.float64)  # (2, 3, C, F)
    upstream = torch.randn(2, 3, size, 24, generator=generator, dtype=torch.float64)
    results = []
    for solve in (_solve_unit_lower, lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True)):
        leaves = [system.to(dtype).requires_grad_(), rhs.to(dtype).requires_grad_()]
        out = solve(*leaves)
        grads = torch.autograd.grad((out * upstream.to(dtype)).sum(), leaves, materialize_grads=True)  # C = 1: no system grad
        results.append([out, grads[0].tril(-1), grads[1]])  # the diagonal's gradient is not defined by a unit solve
    tolerance = dict(atol=1e-10, rtol=1e-9) if dtype == torch.float64 else dict(atol=2e-5, rtol=2e-5)
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, **tolerance)


def test_steps_continue_a_scan_exactly():
    tensors, h0 = inputs(2, 20, 3, 4, 5, "any", torch.float64, True)
    values, log_a, write, read, beta = (t.detach() for t in tensors)
    y_full, final = delta_scan(values, log_a, write, read, beta, h0.detach())
    y_head, state = delta_scan(values[:, :12], log_a[:, :12], write[:, :12], read[:, :12], beta[:, :12], h0.detach())
    for t in range(12, 20):
        state, y = delta_step(values[:, t], log_a[:, t], write[:, t], read[:, t], beta[:, t], state)
        torch.testing.assert_close(y, y_full[:, t])
    torch.testing.assert_close(state, final)
    torch.testing.assert_close(y_head, y_full[:, :12])


def test_a_key_written_twice_returns_its_latest_value():
    """With beta = 1 and no decay the state maps each unit key to the last value written under it
    (orthogonal keys do not disturb each other); a decayed sum would return the sum of both."""
    keys = torch.eye(4, dtype=torch.float64)  # (4, N = 4)
    order = [0, 1, 0, 2]  # key 0 written twice
    values = torch.randn(1, 4, 1, 3, dtype=torch.float64)
    write = keys[order].view(1, 4, 1, 4)
    ones, zeros = torch.ones(1, 4, 1, dtype=torch.float64), torch.zeros(1, 4, 1, dtype=torch.float64)
    _, state = delta_scan(values, zeros, write, write, ones, backend="chunked")
    torch.testing.assert_close(state[0, 0] @ keys[0], values[0, 2, 0])  # the second write, not the sum
    torch.testing.assert_close(state[0, 0] @ keys[1], values[0, 1, 0])
    torch.testing.assert_close(state[0, 0] @ keys[3], torch.zeros(3, dtype=torch.float64))


def test_bad_shapes_and_backends_are_refused():
    tensors, _ = inputs(1, 5, 2, 3, 4, "any", torch.float32, False)
    with pytest.raises(ValueError, match="backend"):
        delta_scan(*tensors, backend="triton")
    with pytest.raises(ValueError, match="log_a"):
        delta_scan(tensors[0], tensors[1][..., :1], *tensors[2:])
    with pytest.raises(ValueError, match="initial_state"):
        delta_scan(*tensors, torch.zeros(1, 2, 3, 5))
    with pytest.raises(ValueError, match="power of two"):
        _solve_unit_lower(torch.eye(3), torch.ones(3, 2))
