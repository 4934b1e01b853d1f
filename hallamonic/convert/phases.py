"""The two fine-tuning objectives.

Phase 1 (attention transfer): the frozen teacher runs once; for every layer, the student's
HarmonicBlock gets the exact input the teacher's attention got and regresses that attention's
output. Layers train side by side from one teacher pass, so errors cannot compound.

With a teacher pool (``phase1.teacher_pool``) phase 1 trains for many epochs on a fixed set of
sequences and captures each one's attention I/O once, instead of one teacher pass per step.
Measured on SmolLM2: on four layers, 180 steps on a pool of 48 x 512 tokens matched the held-out
transfer error of 140 steps on 287K fresh tokens; in a full conversion a step was only ~15% faster
(10.5 vs 12.4 s) and 140 pooled steps ended slightly worse (0.175 vs 0.157), so it is off by default.

Phase 2 (end-to-end): the student runs alone on next-token prediction, optionally pulled toward
the teacher's distribution (KL) and its residual stream after every layer (hidden alignment)
where the teacher is inside its positional window.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import typing

import torch
import torch.nn.functional as F
from torch import nn


class _PrecomputedGradients(torch.autograd.Function):
    """A loss whose parameter gradients were computed in the forward already: its backward only
    scales them by the incoming gradient, so autograd (and accelerate / DDP hooks) accumulates them
    into ``.grad`` at the usual time, as if the graph had been kept."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor, grads: tuple, *params: torch.Tensor) -> torch.Tensor:
        ctx.grads = grads
        return loss.clone()

    @staticmethod
    def backward(ctx, upstream: torch.Tensor):
        return (None, None, *(None if g is None else g * upstream.to(g.dtype) for g in ctx.grads))


def compiler_available(device: str = "cpu") -> bool:
    """Whether torch.compile can build kernels here: Inductor compiles C++ on CPU (Triton on CUDA)."""
    if device != "cpu":
        return True
    return any(shutil.which(name) for name in filter(None, (os.environ.get("CXX"), "g++", "clang++")))


def phase2_compiled_mixers(model: nn.Module) -> list[nn.Module]:
    """The blocks ``phase2.compile`` compiles: those phase 2 trains, except the first layer's.

    Dynamo keeps one graph per block kind, input shape and gradient pattern. The first layer reads
    the frozen embeddings, an input that needs no gradient, so its block would need a graph of its
    own (~1 min of compiling on 2 cores, cold) for one layer's share of the gain; frozen blocks (on SmolLM2 the
    delta-rule and Hedgehog recall layers) would need graphs of their own for this phase alone."""
    layers = _decoder_layers(model)
    return [layer.mixer for layer in layers[1:] if any(p.requires_grad for p in layer.mixer.parameters())]


def eager_backward_precision():
    """Trace compiled blocks' backward without autocast, as eager autograd runs it.

    torch.compile (2.13) traces a region's backward under the autocast of its forward by default
    (`torch._functorch.config.backward_pass_autocast = "same_as_forward"`, pytorch#153044 / #179804),
    which ignores the block's own fp32 regions (the scans, the decay gates): under bf16 autocast the
    compiled chunked scan's gradients came out 1.7% off in log a and 0.3-0.4% in the rest (eager:
    exact), and on a SmolLM2 conversion its bf16 backward overflowed into NaN at phase 2's first
    step. "off" is eager's semantics (and PyTorch's planned default); a config patch, so it holds
    while the first call traces the graph and nothing outside this package's compiles changes."""
    return torch._functorch.config.patch(backward_pass_autocast="off")


@contextlib.contextmanager
def compiled_in_place(modules: list[nn.Module]):
    """``Module.compile()`` each module for the duration (same parameters, same state_dict names,
    so checkpoints written meanwhile are the eager model's), eager again afterwards; backward
    precision as in eager (:func:`eager_backward_precision`)."""
    for module in modules:
        module.compile(dynamic=False)  # see MixerStack: a new shape gets its own static graph
    try:
        with eager_backward_precision():
            yield
    finally:
        for module in modules:
            module._compiled_call_impl = None  # what Module.compile set: __call__ runs forward again


class MixerStack(nn.Module):
    """The student's mixers as one module: phase 1 is one forward and one backward (one DDP unit).

    Every layer's loss depends on its own mixer only (each gets the teacher's input), so while
    gradients are on, each mixer's gradients are taken right after its forward and its activations
    freed before the next layer runs: one mixer's activations are live at a time, without the
    recompute that activation checkpointing pays. On SmolLM2 (30 mixers, 4 x 512 tokens) keeping
    all of them took 17-22 GB, close to this 24 GB machine's limit, where its page faults made
    steps up to 2x slower (`hallamonic bench convert`)."""

    def __init__(self, mixers: list[nn.Module], normalize: bool = True, compile: bool = False):
        super().__init__()
        self.mixers = nn.ModuleList(mixers)
        self.normalize = normalize
        # torch.compile'd callers of the same modules (same parameters), used for this stack's
        # forwards only, so the model itself, its export and later evaluations stay eager. Why:
        # fusing a block's elementwise work made a SmolLM2 block's forward+backward ~1.9x faster on
        # the 2-core CPU; dynamo keeps one graph per block kind (decayed sum, delta rule, Hedgehog)
        # and input shape, shared by every layer and every phase that uses that shape.
        # dynamic=False: the blocks' forward is one code object for dynamo, so without it the second
        # shape it sees (phase 2's 1 x 1,024 after phase 1's 4 x 512) is recompiled with symbolic
        # sizes, and those kernels ran a SmolLM2 block's forward+backward 3-4x slower than static ones.
        self.calls = [torch.compile(mixer, dynamic=False) for mixer in mixers] if compile else list(mixers)

    def forward(self, inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> torch.Tensor:
        """Per-layer regression losses, shape (layers,); their backward delivers the gradients
        computed here (identical to one backward through all layers: tested)."""
        losses = []
        for mixer, call, x, y in zip(self.mixers, self.calls, inputs, targets):
            x = x.to(mixer.v_proj.weight.dtype)  # a bfloat16 teacher pass (phase1.teacher_dtype) feeds float32 blocks
            with eager_backward_precision():  # read where a compiled call traces (its first); eager ones ignore it
                prediction, _ = call(x)  # (B, L, H)
            error = (prediction.float() - y.float()).pow(2).mean()
            if self.normalize:  # fraction of the attention output's energy left unexplained
                error = error / y.float().pow(2).mean().clamp_min(1e-8)
            params = [p for p in mixer.parameters() if p.requires_grad]
            if error.requires_grad and params:
                with torch.autocast(x.device.type, enabled=False):  # backward in each op's forward dtype
                    grads = torch.autograd.grad(error, params, allow_unused=True)  # frees this mixer's graph
                error = _PrecomputedGradients.apply(error.detach(), grads, *params)
            losses.append(error)
        return torch.stack(losses)


@torch.no_grad()
def capture_attention_io(teacher: nn.Module, input_ids: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run the teacher once; return every layer's attention input (post-norm) and output."""
    inputs: list[torch.Tensor | None] = [None] * len(teacher.model.layers)
    outputs: list[torch.Tensor | None] = [None] * len(teacher.model.layers)
    handles = []
    for index, layer in enumerate(teacher.model.layers):

        def hook(module, args, kwargs, output, index=index):
            inputs[index] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            outputs[index] = output[0] if isinstance(output, tuple) else output

        handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    try:
        teacher.model(input_ids=input_ids, use_cache=False)  # the decoder only: no LM-head logits needed
    finally:
        for handle in handles:
            handle.remove()
    return inputs, outputs  # type: ignore[return-value]


@torch.no_grad()
def attention_transfer_errors(
    student: nn.Module, teacher: nn.Module, input_ids: torch.Tensor, layers: typing.Sequence[int] | None = None
) -> list[float]:
    """Per layer (every one, or ``layers``), the block's MSE to the teacher's attention output
    divided by that output's mean square (phase 1's loss, measured): 1.0 is no better than zeros."""
    inputs, targets = capture_attention_io(teacher, input_ids)
    errors = []
    for index in range(len(inputs)) if layers is None else layers:
        mixer, y = student.model.layers[index].mixer, targets[index].float()
        prediction, _ = mixer(inputs[index].to(mixer.v_proj.weight.dtype))
        errors.append(((prediction.float() - y).pow(2).mean() / y.pow(2).mean().clamp_min(1e-12)).item())
    return errors


class BlockAsAttention(nn.Module):
    """A student's HarmonicBlock behind the teacher attention's call signature (output, no
    attention weights), so the teacher can run with blocks in some of its layers. The block starts
    each sequence from a zero state, as the converted model does, and runs in its own dtype inside
    a teacher of another (a bfloat16 teacher pass around float32 blocks)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, None]:
        y, _ = self.block(hidden_states.to(self.block.v_proj.weight.dtype))  # (B, L, H)
        return y.to(hidden_states.dtype), None


@contextlib.contextmanager
def blocks_in(teacher: nn.Module, student: nn.Module, layers: typing.Iterable[int]):
    """Within the block: ``teacher`` with its attention in ``layers`` replaced by the student's
    blocks, restored on exit. The student's norms, MLPs and embeddings are the teacher's own
    (frozen, no LoRA), so with every layer swapped this is the converted model, and with all but a
    few it is the converted model with the teacher's attention restored there."""
    attentions = {i: teacher.model.layers[i].self_attn for i in layers}
    try:
        for i in attentions:
            teacher.model.layers[i].self_attn = BlockAsAttention(student.model.layers[i].mixer)
        yield teacher
    finally:
        for i, attention in attentions.items():
            teacher.model.layers[i].self_attn = attention


class TeacherPool:
    """The teacher's attention I/O per training sequence, captured on first sight and then reused.

    Keyed by the sequence's tokens, so it needs no cooperation from the batch order; holds
    ``2 x layers x seq_len x hidden`` values per sequence in the teacher's dtype (only ``layers``'
    when given).
    """

    def __init__(self, teacher: nn.Module, layers: list[int] | None = None):
        self.teacher = teacher
        self.layers = layers
        self.rows: dict[bytes, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    def __call__(self, batch: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        keys = [row.numpy().tobytes() for row in batch.cpu()]
        missing = [key for key in dict.fromkeys(keys) if key not in self.rows]
        if missing:
            inputs, outputs = capture_attention_io(self.teacher, batch[[keys.index(key) for key in missing]])
            if self.layers is not None:
                inputs, outputs = [inputs[i] for i in self.layers], [outputs[i] for i in self.layers]
            for j, key in enumerate(missing):
                self.rows[key] = ([x[j] for x in inputs], [y[j] for y in outputs])
        layers = len(self.rows[keys[0]][0])
        stack = lambda part, layer: torch.stack([self.rows[key][part][layer] for key in keys])  # noqa: E731 - (B, L, H)
        return [stack(0, layer) for layer in range(layers)], [stack(1, layer) for layer in range(layers)]


def phase1_loss(teacher: nn.Module, pool: bool = False, layers: list[int] | None = None):
    """Loss function of phase 1 for the trainer: mean normalised MSE over layers. With ``pool`` the
    teacher's attention I/O of each sequence is captured once (:class:`TeacherPool`); ``layers``
    (pool only) restricts it to those layers, for a stack of their mixers alone."""
    if layers is not None and not pool:
        raise ValueError("phase1_loss: `layers` needs `pool`")
    capture = TeacherPool(teacher, layers) if pool else (lambda batch: capture_attention_io(teacher, batch))

    def loss_fn(stack: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        inputs, targets = capture(batch)
        return stack(inputs, targets).mean()

    return loss_fn


class LayerOutputs:
    """Forward hooks that keep every decoder layer's output (the residual stream after the layer),
    as a context manager: ``with LayerOutputs(model.model.layers) as states: model(...)``, then
    ``states.tensors()`` is one (B, L, H) tensor per layer (a chunked forward's pieces joined)."""

    def __init__(self, layers: typing.Iterable[nn.Module]):
        self.layers = list(layers)
        self.pieces: list[list[torch.Tensor]] = [[] for _ in self.layers]
        self.handles: list = []

    def __enter__(self) -> "LayerOutputs":
        for index, layer in enumerate(self.layers):

            def hook(module, args, output, index=index):
                self.pieces[index].append(output[0] if isinstance(output, tuple) else output)

            self.handles.append(layer.register_forward_hook(hook))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def tensors(self) -> list[torch.Tensor]:
        return [parts[0] if len(parts) == 1 else torch.cat(parts, dim=1) for parts in self.pieces]


def hidden_alignment(student_states: list[torch.Tensor], teacher_states: list[torch.Tensor]) -> torch.Tensor:
    """Mean over layers and tokens of ||h_student - h_teacher||^2 / ||h_teacher||^2 per token.

    Per token, not over the whole tensor: a Llama's residual stream carries a few tokens (the first
    one above all) with norms ~100x the rest, which would otherwise be the whole objective."""
    errors = []
    for s, t in zip(student_states, teacher_states, strict=True):
        s, t = s.float(), t.float()  # (B, n, H)
        errors.append(((s - t).pow(2).sum(-1) / t.pow(2).sum(-1).clamp_min(1e-6)).mean())
    return torch.stack(errors).mean()


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a causal LM, through a peft wrapper if there is one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(base.model.layers)


def phase2_loss(
    teacher: nn.Module | None,
    kl_weight: float,
    teacher_window: int | None,
    chunk_size: int = 0,
    ce_weight: float = 1.0,
    hidden_weight: float = 0.0,
):
    """Loss function of phase 2: ce_weight * next-token cross-entropy + kl_weight * KL(teacher ||
    student) + hidden_weight * :func:`hidden_alignment` to the teacher's residual stream after every
    layer, the last two over the positions the teacher can see within its window. ce_weight 0
    distils only: the student learns the teacher's whole next-token distribution, not the one
    observed token. The hidden term keeps every layer's output near the teacher's, so the blocks
    the attention transfer fitted on the teacher's stream keep receiving inputs like the ones they
    were fitted on. Measured on SmolLM2 it does that (0.096 -> 0.070 at weight 10) without bringing
    LAMBADA back: evals/results/smollm2-135m-phase2-sweep."""

    def loss_fn(student: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        labels = batch if ce_weight > 0 else None  # pure distillation skips the cross-entropy pass
        with LayerOutputs(_decoder_layers(student) if hidden_weight > 0 else []) as student_states:
            out = student(input_ids=batch, labels=labels, use_cache=False, chunk_size=chunk_size or None)
        loss = ce_weight * out.loss if labels is not None else out.logits.new_zeros(())
        if teacher is None or (kl_weight <= 0 and hidden_weight <= 0):
            return loss
        n = min(batch.shape[1], teacher_window or batch.shape[1])
        with torch.no_grad(), LayerOutputs(_decoder_layers(teacher) if hidden_weight > 0 else []) as teacher_states:
            if kl_weight > 0:
                teacher_logp = teacher(input_ids=batch[:, :n], use_cache=False).logits.float().log_softmax(-1)
            else:  # the hidden term alone needs no LM head
                teacher.model(input_ids=batch[:, :n], use_cache=False)
        if kl_weight > 0:
            student_logp = out.logits[:, :n].float().log_softmax(-1)
            vocab = student_logp.shape[-1]
            kl = F.kl_div(
                student_logp.reshape(-1, vocab), teacher_logp.reshape(-1, vocab), log_target=True, reduction="batchmean"
            )
            loss = loss + kl_weight * kl
        if hidden_weight > 0:
            ours = [h[:, :n] for h in student_states.tensors()]  # (B, n, H) per layer
            loss = loss + hidden_weight * hidden_alignment(ours, teacher_states.tensors())
        return loss

    return loss_fn
