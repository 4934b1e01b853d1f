"""Tests of the diagonal linear recurrence h_t = a_t * h_{t-1} + b_t (hallamonic.modeling).

Every backend is checked against the plain reference loop, forward and gradients, on the edge
cases that break chunked scans: length 1, lengths that are no multiple of any chunk size, odd
channel counts, decays near 0 and near 1, bf16 inputs, with and without an initial state.

The Triton kernel runs under the Triton interpreter (TRITON_INTERPRET=1, CPU tensors). The
kernels are built on first use, so setting the variable with monkeypatch before the first call is
enough. Interpreted kernels are slow: those shapes stay at L <= 64, D <= 64.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import hallamonic.modeling.hallamonic_scan as scan_mod
from hallamonic.modeling.hallamonic_scan import reference_scan, scan, scan_step

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}  # error relative to the largest reference value


def make_inputs(batch, length, channels, decay, dtype, with_h0, seed=0):
    """a in (0, 1] of the given kind, b ~ N(0, 1), optional h0; leaf tensors requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, length, channels)
    if decay == "near0":
        a = torch.full(shape, 1e-4) * (1 + 0.1 * torch.rand(shape, generator=gen))
    elif decay == "near1":
        a = 0.9999 + 1e-4 * torch.rand(shape, generator=gen)
        a = a.clamp(max=1.0)
    else:
        a = 0.5 + 0.5 * torch.rand(shape, generator=gen)
    b = torch.randn(shape, generator=gen)
    h0 = torch.randn(batch, channels, generator=gen) if with_h0 else None
    leaves = [a.to(dtype).requires_grad_(), b.to(dtype).requires_grad_()]
    if with_h0:
        leaves.append(h0.to(dtype).requires_grad_())
    return leaves


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item()


def check_against_reference(backend, batch, length, channels, decay, dtype, with_h0):
    leaves = make_inputs(batch, length, channels, decay, dtype, with_h0)
    a, b = leaves[:2]
    h0 = leaves[2] if with_h0 else None
    h = scan(a, b, h0, backend=backend)
    h_ref = scan(a, b, h0, backend="reference")
    assert h.dtype == b.dtype and h.shape == b.shape
    tol = TOL[dtype]
    assert rel_err(h, h_ref) < tol, f"forward: {rel_err(h, h_ref)}"
    dh = torch.randn(h.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    grads = torch.autograd.grad(h, leaves, dh)
    grads_ref = torch.autograd.grad(h_ref, leaves, dh)
    for name, g, g_ref in zip(("a", "b", "initial_state"), grads, grads_ref):
        assert g.dtype == g_ref.dtype and g.shape == g_ref.shape
        assert torch.isfinite(g.float()).all()
        assert rel_err(g, g_ref) < tol, f"grad {name}: {rel_err(g, g_ref)}"


SHAPES = [(1, 1, 1), (2, 17, 5), (3, 37, 7), (2, 300, 3)]  # (batch, length, channels)
DECAYS = ["uniform", "near0", "near1"]
DTYPES = [torch.float32, torch.bfloat16]


# --------------------------------------------------------------------------------------------
# Torch backend vs the reference
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_torch_matches_reference(shape, decay, dtype, with_h0):
    check_against_reference("torch", *shape, decay, dtype, with_h0)


def test_torch_long_sequence_several_levels():
    """L = 1000 > 16 * 16: the hierarchical scan recurses twice."""
    check_against_reference("torch", 1, 1000, 4, "near1", torch.float32, True)


# --------------------------------------------------------------------------------------------
# Semantics
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["reference", "torch", "auto"])
def test_output_dtype_follows_b(backend):
    a = torch.rand(2, 5, 3, dtype=torch.bfloat16)
    b = torch.randn(2, 5, 3, dtype=torch.float32)
    assert scan(a, b, backend=backend).dtype == torch.float32
    assert scan(a.float(), b.bfloat16(), backend=backend).dtype == torch.bfloat16


def test_scan_step_is_one_reference_step():
    a, b, h0 = torch.rand(3, 1, 6), torch.randn(3, 1, 6), torch.randn(3, 6)
    step = scan_step(a[:, 0], b[:, 0], h0)
    assert step.dtype == torch.float32
    torch.testing.assert_close(step, reference_scan(a, b, h0)[:, 0])


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_chaining_two_scans_equals_one(backend):
    a, b, h0 = 0.5 + 0.5 * torch.rand(2, 40, 5), torch.randn(2, 40, 5), torch.randn(2, 5)
    whole = scan(a, b, h0, backend=backend)
    first = scan(a[:, :23], b[:, :23], h0, backend=backend)
    second = scan(a[:, 23:], b[:, 23:], first[:, -1], backend=backend)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, rtol=1e-5, atol=1e-5)


def test_auto_picks_torch_on_cpu(monkeypatch):
    calls = []
    real = scan_mod.torch_scan
    monkeypatch.setattr(scan_mod, "torch_scan", lambda *args: calls.append(1) or real(*args))
    monkeypatch.setattr(scan_mod, "triton_scan", None)  # would fail if it were called
    a, b = torch.rand(1, 8, 4), torch.randn(1, 8, 4)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # even with the interpreter on: CPU -> torch
    scan(a, b)
    assert calls == [1]


def _bad_inputs():
    a, b = torch.rand(2, 5, 3), torch.randn(2, 5, 3)
    return [
        ("mismatched shapes", (a, torch.randn(2, 6, 3)), {}),
        ("wrong rank", (a[0], b[0]), {}),
        ("zero length", (a[:, :0], b[:, :0]), {}),
        ("integer dtype", (torch.ones(2, 5, 3, dtype=torch.int64), b), {}),
        ("integer b", (a, torch.ones(2, 5, 3, dtype=torch.int32)), {}),
        ("unknown backend", (a, b), {"backend": "cuda-magic"}),
        ("initial_state wrong shape", (a, b, torch.zeros(2, 4)), {}),
        ("initial_state wrong rank", (a, b, torch.zeros(2, 1, 3)), {}),
        ("not a tensor", (a.tolist(), b), {}),
    ]


@pytest.mark.parametrize("args,kwargs", [c[1:] for c in _bad_inputs()], ids=[c[0] for c in _bad_inputs()])
def test_bad_input_raises_value_error(args, kwargs):
    with pytest.raises(ValueError):
        scan(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# Triton backend, interpreted on CPU
# --------------------------------------------------------------------------------------------
_HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture
def interpret(monkeypatch):
    """Run Triton kernels in the interpreter on CPU tensors (read when the kernels are built)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert scan_mod.triton_available()


TRITON_SHAPES = [(1, 1, 1), (2, 17, 5), (3, 37, 7), (1, 64, 64)]


@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", TRITON_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.usefixtures("interpret")
@pytest.mark.triton
@pytest.mark.skipif(not _HAS_TRITON, reason="triton is not installed (pip install 'hallamonic[triton]')")
def test_triton_matches_reference(shape, dtype, with_h0):
    check_against_reference("triton", *shape, "uniform", dtype, with_h0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("decay", ["near0", "near1"])
@pytest.mark.usefixtures("interpret")
@pytest.mark.triton
@pytest.mark.skipif(not _HAS_TRITON, reason="triton is not installed (pip install 'hallamonic[triton]')")
def test_triton_extreme_decays(decay, dtype):
    check_against_reference("triton", 2, 37, 9, decay, dtype, True)


@pytest.mark.usefixtures("interpret")
@pytest.mark.triton
@pytest.mark.skipif(not _HAS_TRITON, reason="triton is not installed (pip install 'hallamonic[triton]')")
def test_triton_chaining_and_dtype():
    a, b, h0 = 0.5 + 0.5 * torch.rand(2, 40, 5), torch.randn(2, 40, 5), torch.randn(2, 5)
    whole = scan(a, b, h0, backend="triton")
    first = scan(a[:, :23], b[:, :23], h0, backend="triton")
    second = scan(a[:, 23:], b[:, 23:], first[:, -1], backend="triton")
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, rtol=1e-5, atol=1e-5)
    assert scan(a, b.bfloat16(), backend="triton").dtype == torch.bfloat16
    # non-contiguous inputs are accepted
    at, bt = a.transpose(0, 1).contiguous().transpose(0, 1), b.transpose(0, 1).contiguous().transpose(0, 1)
    torch.testing.assert_close(scan(at, bt, h0, backend="triton"), whole, rtol=1e-5, atol=1e-5)
