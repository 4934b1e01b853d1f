"""One training loop for every phase of every run (the conversion's two phases, each study run):
accelerate, accumulation, clipping, schedule, NaN guard, atomic checkpoints, exact resume, JSONL
metrics and a progress bar.

The loop is phase-agnostic: a phase supplies the module to train (already holding the trainable
parameters), a loss function of (module, batch) and its batches.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from hallamonic.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from hallamonic.training.packing import PackedBatches
from hallamonic.training.recipe import CheckpointSection, PhaseSection, TrainSection


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient stopped training; the last good checkpoint is untouched."""


@dataclass
class PhaseResult:
    name: str
    steps: int
    tokens: int
    seconds: float
    final_loss: float | None
    resumed_from: int = 0
    seq_len: int = 0  # tokens per sequence: the card shows it without knowing which recipe section ran
    earlier_seconds: float = 0.0  # spent on this phase by the runs before a resume (``seconds`` is this run's)


def native_bfloat16(device_type: str) -> bool:
    """Whether ``device_type`` ("cpu" / "cuda") computes bfloat16 in hardware.

    Why it matters: bfloat16 pays only where it is native. On a CPU with AVX-512 BF16 SmolLM2's
    teacher pass runs 3.2x faster in bfloat16 than in float32; on one without (AMD EPYC, AVX2)
    oneDNN emulates it and the same pass runs 4.4x *slower* (``benchmarks/teacher_dtype.py``)."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private: absent off x86 / in other builds
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def resolve_mixed_precision(mixed_precision: str) -> str:
    """``auto``: bf16 on CUDA, none on CPU; ``native``: bf16 wherever the hardware has it
    (:func:`native_bfloat16`), else none; anything else as given."""
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if mixed_precision == "auto":
        return "bf16" if device_type == "cuda" else "no"
    if mixed_precision == "native":
        return "bf16" if native_bfloat16(device_type) else "no"
    return mixed_precision


def make_accelerator(mixed_precision: str):
    """An accelerate Accelerator with ``mixed_precision`` resolved (:func:`resolve_mixed_precision`).

    accelerate keeps one process-wide state and refuses a second Accelerator with another
    precision; a library caller (a notebook, a test) may well run two conversions with different
    recipes in one process, so a precision change resets that state (the distributed part of it,
    set up by the launcher, is kept)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    mixed_precision = resolve_mixed_precision(mixed_precision)
    current = AcceleratorState._shared_state.get("_mixed_precision")
    if current is not None and str(current) != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)
    return Accelerator(mixed_precision=mixed_precision, cpu=not torch.cuda.is_available())


def learning_rate(step: int, section: PhaseSection) -> float:
    """Linear warm-up, then cosine / linear decay to ``min_lr_ratio * lr`` (or constant)."""
    if section.warmup_steps and step < section.warmup_steps:
        return section.lr * (step + 1) / section.warmup_steps
    if section.schedule == "constant":
        return section.lr
    span = max(section.steps - section.warmup_steps, 1)
    progress = min((step - section.warmup_steps) / span, 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if section.schedule == "cosine" else 1 - progress
    return section.lr * (section.min_lr_ratio + (1 - section.min_lr_ratio) * shape)


class MetricsLog:
    """Append-only JSONL metrics (main process only)."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = path
        self.enabled = enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record) -> None:
        if self.enabled:
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")


def finite_gradients(trainable: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    """Per parameter, whether its gradient is free of NaN / inf (a 0-dim bool tensor, no sync).
    Taken before clipping: a non-finite norm makes clipping write NaN into every gradient."""
    return {key: torch.isfinite(p.grad).all() for key, p in trainable.items() if p.grad is not None}


def non_finite_gradients(finite: dict[str, torch.Tensor], shown: int = 4) -> str:
    """Which parameters' gradients held NaN / inf, for the divergence message. A NaN that enters a
    deep model's backward at one layer reaches every parameter below it, so with many the first
    and last in model order are named: the last is nearest where it entered."""
    bad = [key for key, ok in finite.items() if not ok]
    if not bad:
        return ""
    names = ", ".join(bad) if len(bad) <= shown else f"{bad[0]} ... {bad[-1]}"
    return f" (non-finite gradients in {len(bad)} of {len(finite)} parameters: {names})"


def run_phase(
    *,
    name: str,
    accelerator,
    module: nn.Module,
    trainable: dict[str, nn.Parameter],
    loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    batches: PackedBatches,
    section: PhaseSection,
    train: TrainSection,
    checkpointing: CheckpointSection,
    checkpoint_root: Path,
    log: MetricsLog,
    resume: bool,
) -> PhaseResult:
    """Train ``trainable`` (student parameters, by name) for ``section.steps`` optimizer steps."""
    params = list(trainable.values())
    optimizer = torch.optim.AdamW(params, lr=section.lr, betas=(0.9, 0.95), weight_decay=train.weight_decay)
    start, earlier, loss_value = 0, 0.0, None
    latest = latest_checkpoint(checkpoint_root) if resume else None
    if latest is not None:
        weights, info = load_checkpoint(latest, optimizer)
        with torch.no_grad():
            for key, value in weights.items():
                trainable[key].copy_(value)
        start, earlier, loss_value = info["step"], info.get("seconds", 0.0), info.get("loss")
        accelerator.print(f"[{name}] resuming from {latest} (step {start}/{section.steps})")
    tokens_per_step = section.batch_size * train.grad_accum * accelerator.num_processes * section.seq_len
    if start >= section.steps:
        return PhaseResult(
            name, section.steps, section.steps * tokens_per_step, 0.0, loss_value,
            resumed_from=start, seq_len=section.seq_len, earlier_seconds=earlier,
        )

    module, optimizer = accelerator.prepare(module, optimizer)
    module.train()
    bar = tqdm(
        total=section.steps, initial=start, desc=name, unit="step", disable=not accelerator.is_main_process, dynamic_ncols=True
    )
    began = time.perf_counter()
    for step in range(start, section.steps):
        step_began = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, section)
        total = torch.zeros((), device=accelerator.device)
        for micro in range(train.grad_accum):
            batch = batches.batch(
                step, micro, section.batch_size, train.grad_accum, accelerator.process_index, accelerator.num_processes
            ).to(accelerator.device)
            sync = micro == train.grad_accum - 1
            with contextlib.nullcontext() if sync else accelerator.no_sync(module):
                with accelerator.autocast():
                    loss = loss_fn(module, batch)
                # Backward outside autocast (PyTorch's advice): each op's backward then runs in its
                # forward's dtype, so parts kept fp32 on purpose (gates, scan) stay fp32 backward too.
                accelerator.backward(loss / train.grad_accum)
            total += loss.detach().float() / train.grad_accum
        mean_loss = accelerator.reduce(total, reduction="mean")
        finite = finite_gradients(trainable)
        if train.max_grad_norm > 0:
            grad_norm = accelerator.clip_grad_norm_(params, train.max_grad_norm)
        else:
            grad_norm = torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        grad_norm = torch.as_tensor(grad_norm, dtype=torch.float32)
        if not (torch.isfinite(mean_loss) and torch.isfinite(grad_norm)):
            where = f"[{name}] step {step + 1}: loss {mean_loss.item()} / gradient norm {grad_norm.item()} is not finite"
            where += non_finite_gradients(finite)
            good = latest_checkpoint(checkpoint_root)
            if train.on_nan == "stop":
                bar.close()
                raise TrainingDiverged(
                    f"{where}; training stopped (train.on_nan=stop). Last good checkpoint: {good or 'none yet'}"
                )
            optimizer.zero_grad(set_to_none=True)
            accelerator.print(f"{where}; step skipped (train.on_nan=skip)")
            log.write(phase=name, step=step + 1, skipped=True, loss=None)
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        loss_value = mean_loss.item()
        elapsed = time.perf_counter() - step_began
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tokens_per_step / elapsed:,.0f}")
        if (step + 1) % max(train.log_every, 1) == 0 or step == start or step + 1 == section.steps:
            log.write(
                phase=name, step=step + 1, loss=loss_value, lr=learning_rate(step, section),
                grad_norm=grad_norm.item(), tokens=(step + 1) * tokens_per_step,
                tokens_per_s=tokens_per_step / elapsed, time=time.time(),
            )
        last = step + 1 == section.steps
        if last or (checkpointing.every and (step + 1) % checkpointing.every == 0):
            if accelerator.is_main_process:
                save_checkpoint(
                    checkpoint_root, step + 1, {k: v.detach() for k, v in trainable.items()},
                    getattr(optimizer, "optimizer", optimizer),
                    {"phase": name, "loss": loss_value, "complete": last, "seconds": earlier + time.perf_counter() - began},
                    keep=checkpointing.keep,
                )
            accelerator.wait_for_everyone()
    bar.close()
    seconds = time.perf_counter() - began
    return PhaseResult(
        name, section.steps, section.steps * tokens_per_step, seconds, loss_value,
        resumed_from=start, seq_len=section.seq_len, earlier_seconds=earlier,
    )
