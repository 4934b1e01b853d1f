"""The selective scan's fast path against its plain-loop reference twin: outputs, final states and
every gradient, on odd shapes, length 1, decays near 0 and near 1, fp32 / bf16, with and without an
initial state; and the one-step update used by generation."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hallamonic.modeling.hallamonic_selective_scan import (
    AUTO_TRITON_MAX_STATE,
    CHUNK,
    MAX_DECAY_RATE,
    auto_backend,
    chunked_selective_scan,
    reference_selective_scan,
    selective_scan,
    selective_step,
)


def inputs(batch, length, heads, channels, state, decay, dtype, initial, seed=0):
    generator = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    if decay == "near-1":
        log_a = -torch.rand(batch, length, heads, channels, generator=generator) * 1e-3
    elif decay == "near-0":
        log_a = -MAX_DECAY_RATE + torch.rand(batch, length, heads, channels, generator=generator) * 0.1
    else:
        log_a = -torch.rand(batch, length, heads, channels, generator=generator) * MAX_DECAY_RATE
    tensors = [rand(batch, length, heads, channels), log_a, rand(batch, length, heads, state), rand(batch, length, heads, state)]
    tensors = [t.to(dtype).requires_grad_() for t in tensors]
    h0 = rand(batch, heads, channels, state).requires_grad_() if initial else None
    return tensors, h0


def run(fn, tensors, h0, seed=1):
    y, final = fn(*tensors, h0)
    generator = torch.Generator().manual_seed(seed)
    weight_y = torch.randn(y.shape, generator=generator)
    weight_s = torch.randn(final.shape, generator=generator)
    loss = (y.float() * weight_y).sum() + (final.float() * weight_s).sum()
    wrt = tensors + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad(loss, wrt)
    return y.float(), final.float(), [g.float() for g in grads]


@pytest.mark.parametrize("length", [1, 7, CHUNK, CHUNK + 1, 3 * CHUNK - 5])
@pytest.mark.parametrize("shape", [(1, 1, 4, 3), (2, 3, 5, 7)], ids=["b1h1", "b2h3"])
@pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
def test_chunked_matches_reference(length, shape, initial):
    batch, heads, channels, state = shape
    tensors, h0 = inputs(batch, length, heads, channels, state, "any", torch.float64, initial)
    ref = run(reference_selective_scan, tensors, h0)
    fast = run(chunked_selective_scan, tensors, h0)
    torch.testing.assert_close(fast[0], ref[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast[1], ref[1], atol=1e-4, rtol=1e-4)
    for got, want in zip(fast[2], ref[2]):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("decay", ["near-0", "near-1"])
def test_extreme_decays(decay):
    tensors, h0 = inputs(2, 2 * CHUNK + 3, 2, 4, 6, decay, torch.float32, True)
    ref = run(reference_selective_scan, tensors, h0)
    fast = run(chunked_selective_scan, tensors, h0)
    for got, want in zip([fast[0], fast[1], *fast[2]], [ref[0], ref[1], *ref[2]]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)


def test_bf16_inputs_accumulate_in_fp32():
    tensors, h0 = inputs(1, 100, 2, 4, 8, "near-1", torch.bfloat16, False)
    y, final = chunked_selective_scan(*tensors, h0)
    assert y.dtype == torch.float32 and final.dtype == torch.float32
    exact_y, exact_final = reference_selective_scan(*[t.double() for t in tensors], None)
    torch.testing.assert_close(y.double(), exact_y.double(), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(final.double(), exact_final.double(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("decay", ["near-0", "any", "near-1"])
def test_the_chunked_scan_stays_fp32_under_bf16_autocast(decay):
    """Mixed-precision training runs the scan under bf16 autocast. With bf16 matmul operands the
    decay's gradient (a difference of nearly equal terms where decays are fast) was 18% off at
    a ~ 0.05; the scan switches autocast off, so every output and gradient is fp32-exact."""
    tensors, h0 = inputs(1, 3 * CHUNK + 5, 2, 16, 16, decay, torch.float32, True)
    exact = run(reference_selective_scan, [t.double() for t in tensors], h0.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, final = chunked_selective_scan(*tensors, h0)
    assert y.dtype == final.dtype == torch.float32
    # the backward outside autocast, as the trainer runs it: each op's backward in its forward's dtype
    mixed = run(lambda *args: (y, final), tensors, h0)
    for got, want in zip([mixed[0], mixed[1], *mixed[2]], [exact[0], exact[1], *exact[2]]):
        error = (got.double() - want).norm() / want.norm()
        assert error < 1e-4, error


def test_steps_continue_a_scan():
    """Prefill with the chunked path, then single steps: the same outputs as one pass."""
    tensors, _ = inputs(2, 45, 3, 4, 5, "any", torch.float32, False)
    with torch.no_grad():
        full, _ = chunked_selective_scan(*tensors)
        y, state = chunked_selective_scan(*[t[:, :30] for t in tensors])
        steps = [y]
        for t in range(30, 45):
            state, y_t = selective_step(*[x[:, t] for x in tensors], state)
            steps.append(y_t.unsqueeze(1))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_auto_picks_the_fused_kernel_only_where_it_measured_faster():
    """H200: the fused kernel beat the chunked path at N = 16 and lost at N = 64; without CUDA or
    Triton "auto" is always the chunked path, and on CPU it gives the chunked path's exact output."""
    assert auto_backend(True, 16, True) == "triton"
    assert auto_backend(True, AUTO_TRITON_MAX_STATE, True) == "triton"
    assert auto_backend(True, 64, True) == "chunked"
    assert auto_backend(False, 16, True) == "chunked"
    assert auto_backend(True, 16, False) == "chunked"
    tensors, h0 = inputs(1, 40, 2, 3, 5, "spread", torch.float32, True)
    auto, chunked = selective_scan(*tensors, h0), chunked_selective_scan(*tensors, h0)
    assert all(torch.equal(a, c) for a, c in zip(auto, chunked))


def test_bad_inputs_are_clear_errors():
    tensors, _ = inputs(1, 5, 2, 3, 4, "any", torch.float32, False)
    with pytest.raises(ValueError, match="initial_state"):
        selective_scan(*tensors, torch.zeros(1, 2, 3, 5))
    with pytest.raises(ValueError, match="write"):
        selective_scan(tensors[0], tensors[1], tensors[2][..., :2], tensors[3])
    with pytest.raises(ValueError, match="backend"):
        selective_scan(*tensors, backend="cuda")


_HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not _HAS_TRITON, reason="triton is not installed (pip install 'hallamonic[triton]')")


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize(
    "shape, length, decay, initial, value_block",
    [
        ((1, 1, 16, 16), 1, "any", False, 32),  # length 1
        ((2, 2, 12, 16), 40, "any", True, 32),  # odd channels, a partial last chunk
        ((1, 1, 36, 16), 70, "near-0", True, 32),  # two value blocks, the second partial
        ((1, 3, 8, 20), 33, "near-1", False, 32),  # state size not a power of two
        ((2, 2, 40, 24), 45, "any", True, 16),  # three value blocks: dk / dq summed over blocks
        ((1, 2, 64, 64), 35, "any", True, 64),  # one block holds a conversion's whole (64, 64) state
    ],
)
def test_triton_matches_reference(monkeypatch, shape, length, decay, initial, value_block):
    """The fused kernel (interpreted on CPU) against the plain loop: outputs, final state, all gradients,
    with the value channels in one block or split over several programs."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from hallamonic.modeling.hallamonic_selective_scan_triton import triton_selective_scan

    batch, heads, channels, state = shape
    tensors, h0 = inputs(batch, length, heads, channels, state, decay, torch.float32, initial)
    ref = run(reference_selective_scan, tensors, h0)
    fused = run(lambda *args: triton_selective_scan(*args, value_block=value_block), tensors, h0)
    for got, want in zip([fused[0], fused[1], *fused[2]], [ref[0], ref[1], *ref[2]]):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.triton
@needs_triton
def test_triton_value_block_must_be_a_power_of_two(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from hallamonic.modeling.hallamonic_selective_scan_triton import triton_selective_scan

    tensors, _ = inputs(1, 4, 1, 16, 16, "any", torch.float32, False)
    with pytest.raises(ValueError, match="power of two"):
        triton_selective_scan(*tensors, value_block=24)


@pytest.mark.triton
@needs_triton
def test_triton_takes_bf16_and_chains(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    tensors, _ = inputs(1, 50, 2, 16, 16, "near-1", torch.bfloat16, False)
    with torch.no_grad():
        whole, final = selective_scan(*tensors, backend="triton")
        first, state = selective_scan(*[t[:, :20] for t in tensors], backend="triton")
        second, end = selective_scan(*[t[:, 20:] for t in tensors], state, backend="triton")
        exact, _ = reference_selective_scan(*[t.double() for t in tensors])
    assert whole.dtype == torch.float32
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(end, final, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(whole, exact.float(), atol=1e-3, rtol=1e-3)
