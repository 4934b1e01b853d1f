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
the teacher's distribution (KL) where the teacher is inside its positional window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class MixerStack(nn.Module):
    """The student's mixers as one module: phase 1 is one forward and one backward (one DDP unit)."""

    def __init__(self, mixers: list[nn.Module], normalize: bool = True, recompute: bool = False):
        super().__init__()
        self.mixers = nn.ModuleList(mixers)
        self.normalize = normalize
        self.recompute = recompute

    def forward(self, inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> torch.Tensor:
        """Per-layer regression losses, shape (layers,). With ``recompute`` each mixer's
        activations are dropped after its forward and rebuilt in backward: the step holds one
        mixer's activations instead of all of them (SmolLM2, 4 x 512 tokens: ~15 GB otherwise)."""
        losses = []
        for mixer, x, y in zip(self.mixers, inputs, targets):
            x = x.to(mixer.v_proj.weight.dtype)  # a bfloat16 teacher pass (phase1.teacher_dtype) feeds float32 blocks
            if self.recompute:
                prediction, _ = checkpoint(mixer, x, use_reentrant=False)  # (B, L, H)
            else:
                prediction, _ = mixer(x)  # (B, L, H)
            error = (prediction.float() - y.float()).pow(2).mean()
            if self.normalize:  # fraction of the attention output's energy left unexplained
                error = error / y.float().pow(2).mean().clamp_min(1e-8)
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
def attention_transfer_errors(student: nn.Module, teacher: nn.Module, input_ids: torch.Tensor) -> list[float]:
    """Per layer, the block's MSE to the teacher's attention output divided by that output's mean
    square (phase 1's loss, measured): 1.0 is no better than predicting zeros."""
    inputs, targets = capture_attention_io(teacher, input_ids)
    errors = []
    for layer, x, y in zip(student.model.layers, inputs, targets):
        prediction, _ = layer.mixer(x.to(layer.mixer.v_proj.weight.dtype))
        y = y.float()
        errors.append(((prediction.float() - y).pow(2).mean() / y.pow(2).mean().clamp_min(1e-12)).item())
    return errors


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


def phase2_loss(
    teacher: nn.Module | None, kl_weight: float, teacher_window: int | None, chunk_size: int = 0, ce_weight: float = 1.0
):
    """Loss function of phase 2: ce_weight * next-token cross-entropy + kl_weight * KL(teacher || student)
    over the positions the teacher can see within its window. ce_weight 0 distils only: the student
    learns the teacher's whole next-token distribution, not the one observed token."""

    def loss_fn(student: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        labels = batch if ce_weight > 0 else None  # pure distillation skips the cross-entropy pass
        out = student(input_ids=batch, labels=labels, use_cache=False, chunk_size=chunk_size or None)
        loss = ce_weight * out.loss if labels is not None else out.logits.new_zeros(())
        if kl_weight > 0 and teacher is not None:
            n = min(batch.shape[1], teacher_window or batch.shape[1])
            with torch.no_grad():
                teacher_logp = teacher(input_ids=batch[:, :n], use_cache=False).logits.float().log_softmax(-1)
            student_logp = out.logits[:, :n].float().log_softmax(-1)
            vocab = student_logp.shape[-1]
            kl = F.kl_div(
                student_logp.reshape(-1, vocab), teacher_logp.reshape(-1, vocab), log_target=True, reduction="batchmean"
            )
            loss = loss + kl_weight * kl
        return loss

    return loss_fn
