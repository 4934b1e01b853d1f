"""Phase objectives: the teacher pool reuses the teacher's attention I/O exactly; phase 2 weighs
cross-entropy, KL and hidden-state alignment as the recipe says."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hallamonic.convert.phases as phases
from hallamonic.convert.phases import (
    LayerOutputs,
    MixerStack,
    TeacherPool,
    attention_transfer_errors,
    blocks_in,
    capture_attention_io,
    hidden_alignment,
    phase1_loss,
    phase2_loss,
)
from hallamonic.convert.pipeline import convert
from hallamonic.convert.recipe import HarmonicSection, load_recipe
from hallamonic.convert.surgery import build_student
from hallamonic.tiny import build_tiny_llama


def _teacher_passes(teacher) -> list[int]:
    rows: list[int] = []
    teacher.model.register_forward_hook(lambda module, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    return rows


def test_pool_returns_the_teachers_io_and_runs_it_once_per_sequence():
    torch.manual_seed(0)
    teacher = build_tiny_llama(300).eval()
    a, b, c = torch.randint(0, 300, (3, 1, 24))
    pool = TeacherPool(teacher)
    passes = _teacher_passes(teacher)
    for batch in (torch.cat([a, b]), torch.cat([b, a, b]), torch.cat([c, a])):
        got_in, got_out = pool(batch)
        want_in, want_out = capture_attention_io(teacher, batch)
        for got, want in zip(got_in + got_out, want_in + want_out):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # per batch, the pool's pass (if any) then the reference pass: [a, b] -> 2 rows, 2;
    # [b, a, b] -> no pool pass, 3; [c, a] -> only c, 2
    assert passes == [2, 2, 3, 1, 2]


def test_pooled_loss_equals_the_fresh_teacher_loss():
    torch.manual_seed(0)
    teacher = build_tiny_llama(300).eval()
    student = build_student(teacher, HarmonicSection(state_size=None))
    stack = MixerStack([layer.mixer for layer in student.model.layers])
    batch = torch.randint(0, 300, (2, 32))
    pooled = phase1_loss(teacher, pool=True)
    assert pooled(stack, batch).item() > 0
    torch.testing.assert_close(pooled(stack, batch), phase1_loss(teacher)(stack, batch))


def test_conversion_with_a_pool_trains_on_its_sequences_only(tmp_path, monkeypatch):
    pools = []

    class Recorded(TeacherPool):
        def __init__(self, teacher, layers=None):
            super().__init__(teacher, layers)
            pools.append(self)

    monkeypatch.setattr(phases, "TeacherPool", Recorded)
    recipe = load_recipe("tiny", ["phase1.steps=4", "phase1.teacher_pool=3", "phase2.steps=0", "checkpoint.every=0",
                                  "eval.max_windows=0"])
    report = convert(recipe, tmp_path / "out")
    assert len(pools) == 1 and len(pools[0].rows) == 3  # 4 steps x 4 sequences drawn from a pool of 3
    transfer = report["attention_transfer"]["normalised_mse"]
    assert sum(transfer["phase1"]) < sum(transfer["calibrated"])


@pytest.mark.parametrize("accumulate", [1, 2])
def test_layerwise_gradients_equal_one_backward_through_every_mixer(accumulate):
    """The stack takes each mixer's gradients in its forward; the result must be what one backward
    through all mixers gives, scaled by the upstream gradient and summed over micro-batches."""
    torch.manual_seed(0)
    teacher = build_tiny_llama(300).eval()
    student = build_student(teacher, HarmonicSection(state_size=None))
    mixers = [layer.mixer for layer in student.model.layers]
    stack = MixerStack(mixers)
    params = [p for p in stack.parameters() if p.requires_grad]
    batches = [capture_attention_io(teacher, torch.randint(0, 300, (2, 40))) for _ in range(accumulate)]

    stack.zero_grad()
    for inputs, targets in batches:
        (stack(inputs, targets).mean() / accumulate).backward()
    layerwise = [p.grad.clone() for p in params]

    stack.zero_grad()
    for inputs, targets in batches:  # the reference: the same losses, one graph through every mixer
        losses = []
        for mixer, x, y in zip(mixers, inputs, targets):
            prediction, _ = mixer(x)
            losses.append((prediction - y).pow(2).mean() / y.pow(2).mean())
        (torch.stack(losses).mean() / accumulate).backward()
    assert len(params) > 10
    for a, p in zip(layerwise, params):
        torch.testing.assert_close(a, p.grad)
    with torch.no_grad():  # evaluation: plain losses, no gradients taken
        assert not stack(*batches[0]).requires_grad


@pytest.mark.skipif(not phases.compiler_available(), reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_stack_gives_the_eager_losses_and_gradients():
    """phase1.compile: the stack runs torch.compile'd callers of the same blocks; losses and
    gradients must be the eager ones (to fp32 fusion error), and the blocks themselves stay eager."""
    torch.manual_seed(0)
    teacher = build_tiny_llama(300).eval()
    student = build_student(teacher, HarmonicSection(state_size=None))
    mixers = [layer.mixer for layer in student.model.layers]
    params = [p for m in mixers for p in m.parameters() if p.requires_grad]
    inputs, targets = capture_attention_io(teacher, torch.randint(0, 300, (2, 40)))
    results = []
    for compile in (False, True):
        stack = MixerStack(mixers, compile=compile)
        stack.zero_grad()
        losses = stack(inputs, targets)
        losses.mean().backward()
        results.append((losses.detach(), [p.grad.clone() for p in params]))
    (eager_losses, eager_grads), (compiled_losses, compiled_grads) = results
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-4, atol=1e-6)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
    assert all(type(call).__name__ == "OptimizedModule" for call in MixerStack(mixers, compile=True).calls)
    assert all(m._compiled_call_impl is None for m in mixers)  # compiled beside the model, not in place (Module.compile)


@pytest.mark.parametrize("key", ["phase1.compile", "phase2.compile"])
def test_compile_without_a_compiler_is_a_clear_error(tmp_path, monkeypatch, key):
    import hallamonic.convert.pipeline as pipeline

    monkeypatch.setattr(pipeline, "compiler_available", lambda device: False)
    recipe = load_recipe("tiny", ["phase1.steps=1", "phase2.steps=1", f"{key}=true", "checkpoint.every=0", "eval.max_windows=0"])
    with pytest.raises(ValueError, match=rf"{key}: true. needs a C\+\+ compiler.*set {key}=false"):
        convert(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before anything is written


@pytest.mark.parametrize("key", ["phase1.compile", "phase2.compile"])
def test_compile_asks_for_no_compiler_when_its_phases_do_not_train(tmp_path, monkeypatch, key):
    import hallamonic.convert.pipeline as pipeline

    monkeypatch.setattr(pipeline, "compiler_available", lambda device: False)
    no_steps = {"phase1.compile": ["phase1.steps=0", "phase1.focus_steps=0", "phase2.refit_steps=0", "phase2.steps=1"],
                "phase2.compile": ["phase1.steps=1", "phase2.steps=0"]}[key]  # fmt: skip
    recipe = load_recipe("tiny", [*no_steps, f"{key}=true", "checkpoint.every=0", "eval.max_windows=0"])
    convert(recipe, tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").exists()


def _phase2_student():
    torch.manual_seed(0)
    teacher = build_tiny_llama(300, num_layers=3).eval()
    student = build_student(teacher, HarmonicSection(state_size=None))
    student.model.layers[2].mixer.requires_grad_(False)  # a frozen layer (phase2.frozen_layers)
    return student


def test_phase2_compiles_the_blocks_it_trains_after_the_first():
    student = _phase2_student()
    layers = student.model.layers
    assert phases.phase2_compiled_mixers(student) == [layers[1].mixer]  # not layer 0 (no input gradient), not frozen 2


@pytest.mark.skipif(not phases.compiler_available(), reason="torch.compile on CPU needs a C++ compiler")
def test_phase2_compiled_blocks_give_the_eager_loss_and_gradients_and_turn_eager_again():
    """phase2.compile: the trained blocks are compiled in place for the phase; the next-token loss
    and every gradient must be the eager ones, the state_dict's names unchanged, and afterwards the
    blocks are plain eager modules again (export and evaluation run eager)."""
    student = _phase2_student()
    ids = torch.randint(0, 300, (2, 40))
    params = [p for p in student.parameters() if p.requires_grad]
    names = list(student.state_dict())

    def loss_and_grads():
        student.zero_grad()
        loss = student(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in params]

    eager_loss, eager_grads = loss_and_grads()
    compiled = phases.phase2_compiled_mixers(student)
    with phases.compiled_in_place(compiled):
        assert all(m._compiled_call_impl is not None for m in compiled)
        assert list(student.state_dict()) == names
        compiled_loss, compiled_grads = loss_and_grads()
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
    assert all(m._compiled_call_impl is None for m in student.model.layers.modules())


class _Scan(torch.nn.Module):
    """The chunked selective scan as a module, so compiled_in_place can compile it."""

    def forward(self, b, log_a, write, read):
        from hallamonic.modeling.hallamonic_selective_scan import chunked_selective_scan

        return chunked_selective_scan(b, log_a, write, read)[0]


def _scan_grads(call, inputs, upstream, autocast: bool):
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = call(*leaves)
    y.backward(upstream)
    return [t.grad for t in leaves]


@pytest.mark.skipif(not phases.compiler_available(), reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_blocks_keep_their_fp32_backward_under_bf16_autocast():
    """The scan runs in fp32 inside autocast, and eager autograd runs its backward in fp32 too.
    torch.compile's default traces the backward under the forward's autocast instead (bf16 matmuls:
    the gradient of log a 1.7% off, NaN on a SmolLM2 conversion): compiled blocks must give the
    eager fp32 gradients, in place (phase 2) and in the attention-transfer stack (phase 1)."""
    torch.manual_seed(0)
    shape, state = (1, 256, 2, 16), (1, 256, 2, 16)
    inputs = [torch.randn(shape), -3 * torch.rand(shape), torch.randn(state), torch.randn(state)]
    upstream = torch.randn(shape)
    want = _scan_grads(_Scan(), inputs, upstream, autocast=False)
    scan = _Scan()
    with phases.compiled_in_place([scan]):
        got = _scan_grads(scan, inputs, upstream, autocast=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)

    teacher = build_tiny_llama(300).eval()
    student = build_student(teacher, HarmonicSection(state_size=None))
    mixers = [layer.mixer for layer in student.model.layers]
    gates = [p for m in mixers for name, p in m.named_parameters() if name.startswith("gates.")]
    io = capture_attention_io(teacher, torch.randint(0, 300, (2, 64)))
    results = []
    for compile in (False, True):
        student.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses = MixerStack(mixers, compile=compile)(*io)
        losses.sum().backward()
        results.append([p.grad.clone() for p in gates])
    for got, want in zip(*reversed(results)):  # the gates and scans are fp32: bf16 elsewhere fuses alike
        torch.testing.assert_close(got, want, rtol=2e-3, atol=1e-6)


def test_compiler_available_finds_one_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert not phases.compiler_available("cpu") and phases.compiler_available("cuda")
    fake = tmp_path / "g++"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert phases.compiler_available("cpu")


def test_phase2_loss_weighs_cross_entropy_and_kl_to_the_teacher():
    torch.manual_seed(0)
    teacher = build_tiny_llama(300).eval()
    student = build_student(teacher, HarmonicSection(state_size=None))
    batch = torch.randint(0, 300, (2, 24))
    window = 16  # the teacher's window: KL covers the first 16 positions only
    with torch.no_grad():
        logp = student(input_ids=batch).logits.log_softmax(-1)  # (2, 24, vocab)
        teacher_logp = teacher(input_ids=batch[:, :window]).logits.log_softmax(-1)  # (2, 16, vocab)
        ce = F.cross_entropy(logp[:, :-1].reshape(-1, 300), batch[:, 1:].reshape(-1))
        kl = (teacher_logp.exp() * (teacher_logp - logp[:, :window])).sum(-1).mean()  # KL(teacher || student), mean per position
        ce_only = phase2_loss(teacher, kl_weight=0.0, teacher_window=window)(student, batch)
        kl_only = phase2_loss(teacher, kl_weight=2.0, teacher_window=window, ce_weight=0.0)(student, batch)
        both = phase2_loss(teacher, kl_weight=0.5, teacher_window=window, ce_weight=3.0)(student, batch)
    assert kl > 1e-3  # the terms differ, so a swapped weight would show
    torch.testing.assert_close(ce_only, ce)
    torch.testing.assert_close(kl_only, 2.0 * kl)
    torch.testing.assert_close(both, 3.0 * ce + 0.5 * kl)


def test_hidden_alignment_is_normalised_per_token():
    """A 10% error on every token scores 0.01 whatever the tokens' norms: a token 1000x larger than
    the rest (a Llama's first token) weighs no more than any other."""
    torch.manual_seed(0)
    teacher = torch.randn(2, 8, 16)
    teacher[:, 0] *= 1000.0
    direction = torch.randn(2, 8, 16)
    direction = direction / direction.norm(dim=-1, keepdim=True) * teacher.norm(dim=-1, keepdim=True)
    student = teacher + 0.1 * direction  # per token, ||error|| = 0.1 ||teacher||
    torch.testing.assert_close(hidden_alignment([student, teacher], [teacher, teacher]), torch.tensor(0.005))
    student[:, 3] = teacher[:, 3]  # one exact token out of 8: the mean drops by 1/8 of 0.01
    torch.testing.assert_close(hidden_alignment([student], [teacher]), torch.tensor(0.01 * 7 / 8))


def test_layer_outputs_are_the_decoder_layers_residual_stream():
    torch.manual_seed(0)
    teacher = build_tiny_llama(300).eval()
    student = build_student(teacher, HarmonicSection(state_size=None))
    ids = torch.randint(0, 300, (2, 24))
    for model in (teacher, student):
        model(input_ids=ids[:, :2], output_hidden_states=True)  # transformers installs its own capture hooks once
        hooks_before = len(model.model.layers[0]._forward_hooks)
        with torch.no_grad(), LayerOutputs(model.model.layers) as states:
            reference = model(input_ids=ids, output_hidden_states=True).hidden_states  # embeddings, layers...
        got = states.tensors()
        assert len(got) == len(model.model.layers)
        torch.testing.assert_close(got[0], reference[1])  # the first layer's output, before any final norm
        assert len(model.model.layers[0]._forward_hooks) == hooks_before  # ours are gone afterwards
    with torch.no_grad(), LayerOutputs(student.model.layers) as chunked:
        student(input_ids=ids, chunk_size=10)  # pieces of 10 + 10 + 4 tokens, joined
    with torch.no_grad(), LayerOutputs(student.model.layers) as whole:
        student(input_ids=ids)
    for a, b in zip(chunked.tensors(), whole.tensors()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_phase2_loss_adds_the_hidden_alignment_inside_the_teachers_window():
    torch.manual_seed(0)
    teacher = build_tiny_llama(300).eval()
    student = build_student(teacher, HarmonicSection(state_size=None))
    batch = torch.randint(0, 300, (2, 24))
    window = 16
    with torch.no_grad():
        ours = student(input_ids=batch, output_hidden_states=True).hidden_states[1:-1]  # layers but the last
        theirs = teacher(input_ids=batch[:, :window], output_hidden_states=True).hidden_states[1:-1]
        ce_only = phase2_loss(teacher, kl_weight=0.0, teacher_window=window)(student, batch)
        with LayerOutputs([student.model.layers[-1]]) as s_last, LayerOutputs([teacher.model.layers[-1]]) as t_last:
            both = phase2_loss(teacher, kl_weight=0.0, teacher_window=window, hidden_weight=3.0)(student, batch)
    ours = [h[:, :window] for h in ours] + [s_last.tensors()[0][:, :window]]
    theirs = list(theirs) + t_last.tensors()
    expected = hidden_alignment(ours, theirs)
    assert expected > 1e-3
    torch.testing.assert_close(both, ce_only + 3.0 * expected)
    # the term trains the mixers: its gradient reaches them with cross-entropy switched off
    loss = phase2_loss(teacher, kl_weight=0.0, teacher_window=window, ce_weight=0.0, hidden_weight=1.0)(student, batch)
    loss.backward()
    assert student.model.layers[0].mixer.v_proj.weight.grad.abs().sum() > 0


def test_a_bfloat16_teacher_pass_feeds_float32_blocks():
    """`phase1.teacher_dtype: bfloat16`: the blocks stay float32 and take the bfloat16 capture; the
    loss it gives is the float32 capture's to within bfloat16's rounding."""
    torch.manual_seed(0)
    teacher = build_tiny_llama(300).eval()
    student = build_student(teacher, HarmonicSection(state_size=None))
    stack = MixerStack([layer.mixer for layer in student.model.layers])
    ids = torch.randint(0, 300, (2, 40))
    reference = stack(*capture_attention_io(teacher, ids))
    inputs, targets = capture_attention_io(teacher.to(torch.bfloat16), ids)
    assert inputs[0].dtype == torch.bfloat16
    loss = stack(inputs, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference, rtol=0.05, atol=0.0)
    assert not torch.equal(loss, reference)


def test_blocks_in_every_layer_is_the_converted_model_and_the_teacher_comes_back():
    """`blocks_in`: the teacher with the student's blocks in every layer gives the converted
    model's logits (its norms, MLPs and embeddings are the teacher's); with the teacher's attention
    kept in the next layer, that layer's captured input is the converted stream, not the teacher's;
    on exit the teacher is itself again; a bfloat16 teacher runs float32 blocks."""
    torch.manual_seed(0)
    teacher = build_tiny_llama(300).eval()
    student = build_student(teacher, HarmonicSection(state_size=None)).eval()
    ids = torch.randint(0, 300, (2, 24))
    with torch.no_grad():
        alone, converted = teacher(input_ids=ids).logits, student(input_ids=ids).logits
        with blocks_in(teacher, student, range(2)) as hybrid:
            torch.testing.assert_close(hybrid(input_ids=ids).logits, converted, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(teacher(input_ids=ids).logits, alone, rtol=0, atol=0)
        with blocks_in(teacher, student, [0]) as hybrid:
            inputs, _ = capture_attention_io(hybrid, ids)
            errors = attention_transfer_errors(student, hybrid, ids, layers=[1])
        seen = []
        hook = student.model.layers[1].mixer.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
        student(input_ids=ids)
        hook.remove()
    torch.testing.assert_close(inputs[1], seen[0], rtol=1e-4, atol=1e-5)  # the converted stream into layer 1
    with torch.no_grad():
        theirs, _ = capture_attention_io(teacher, ids)
    assert not torch.allclose(inputs[1], theirs[1])  # ...not the teacher's own
    assert len(errors) == 1 and errors[0] > 0
    bf16 = teacher.to(torch.bfloat16)
    with torch.no_grad(), blocks_in(bf16, student, range(2)) as hybrid:
        torch.testing.assert_close(hybrid(input_ids=ids).logits.float(), converted, rtol=0.05, atol=0.05)
    assert student.model.layers[0].mixer.v_proj.weight.dtype == torch.float32
