"""Run a study: every architecture at every context, under one protocol, resumably.

Protocol (what makes the comparison fair): for a given context every model sees the same training
sequences in the same order (one seeded permutation), the same number of optimizer steps and
tokens, the same AdamW settings, schedule and clipping, the same initialisation seed, and is
scored on the same test windows. Only the architecture differs.

Layout of the output folder::

    recipe.yaml                     the resolved recipe (a resumed study must match it)
    runs/MODEL/ctx-C/result.json    one finished run: parameters, test bits, time, tokens/s
    runs/MODEL/ctx-C/metrics.jsonl  its training curve; checkpoints/ while it runs
    results.json, results.md        the table, with gaps; bits_vs_context.png, training_curves.png
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from hallamonic.data import DataError
from hallamonic.evaluation.scoring import is_out_of_memory, score_tokens
from hallamonic.study.data import StudyCorpus, load_study_corpus
from hallamonic.study.models import Architecture, build_architectures, count_parameters, harmonic_config, has_mamba_mixers
from hallamonic.study.recipe import ARCHITECTURES, StudyRecipe
from hallamonic.study.report import write_report
from hallamonic.training.checkpoint import latest_checkpoint
from hallamonic.training.packing import PackedBatches
from hallamonic.training.recipe import CheckpointSection, PhaseSection, RecipeError, TrainSection, build_schema
from hallamonic.training.trainer import MetricsLog, TrainingDiverged, run_phase
from hallamonic.training.trainer import make_accelerator as _accelerator


class StudyOutputError(ValueError):
    """The output folder holds another study (or anything) and neither --resume nor --overwrite was given."""


def next_token_loss(model, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over a (B, L) batch, identical for every architecture."""
    logits = model(input_ids=batch, use_cache=False).logits  # (B, L, V)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch[:, 1:].flatten())


def split_windows(corpus: StudyCorpus, split: str, context: int, tokens: int) -> torch.Tensor:
    """The first ``tokens // context`` non-overlapping windows of a split ("test" or "valid"), (N, context)."""
    ids = getattr(corpus, split)
    count = min(max(tokens // context, 1), len(ids) // context)
    if count == 0:
        raise DataError(f"the {split} split has {len(ids)} tokens, fewer than one window of {context}")
    return torch.from_numpy(ids[: count * context].astype("int64")).view(count, context)


@torch.no_grad()
def mean_bits(model, windows: torch.Tensor, batch_tokens: int, accelerator) -> float:
    """Mean bits per token over every next-token prediction inside the windows."""
    model.eval()
    per_batch = max(batch_tokens // windows.shape[1], 1)
    total, count = 0.0, 0
    for lo in range(0, windows.shape[0], per_batch):
        with accelerator.autocast():
            nll, _ = score_tokens(model, windows[lo : lo + per_batch].to(accelerator.device))  # (b, L-1)
        total += nll.double().sum().item()
        count += nll.numel()
    model.train()
    return total / count / math.log(2)


def score_model(model, corpus: StudyCorpus, context: int, recipe: StudyRecipe, accelerator) -> dict:
    """Test bits (the study's number) and validation bits (for design decisions) on fixed windows."""
    test = split_windows(corpus, "test", context, recipe.eval.tokens)
    scores = {"bits": mean_bits(model, test, recipe.train.batch_tokens, accelerator), "test_windows": int(test.shape[0])}
    if len(corpus.valid) >= context:
        valid = split_windows(corpus, "valid", context, recipe.eval.tokens)
        scores["valid_bits"] = mean_bits(model, valid, recipe.train.batch_tokens, accelerator)
    return scores


def _prepare_output(recipe: StudyRecipe, out: Path, resume: bool, overwrite: bool) -> StudyRecipe:
    """Create or check the output folder; return the recipe the report covers.

    A resumed study may run a subset of models or contexts (e.g. one per GPU session): the saved
    recipe keeps the union, so the report shows every finished run. Any other difference is refused.
    """
    saved = out / "recipe.yaml"
    covered = recipe
    if out.exists() and any(out.iterdir()):
        if overwrite:
            shutil.rmtree(out)
        elif not resume:
            raise StudyOutputError(f"{out} exists and is not empty; pass --resume to continue it or --overwrite to replace it")
        elif not saved.is_file():
            raise StudyOutputError(f"{out} is not a study folder (no recipe.yaml); choose another --output-dir")
        else:
            try:  # through the schema: keys added since (at their defaults) do not count as changes
                before = build_schema(StudyRecipe, yaml.safe_load(saved.read_text()))
            except RecipeError as err:
                raise StudyOutputError(f"{saved} cannot be read as a study recipe ({err}); use another --output-dir") from None
            was, now = before.to_dict(), recipe.to_dict()
            changed = [k for k in now if k not in ("models", "contexts", "memory", "description") and was[k] != now[k]]
            if changed:
                raise StudyOutputError(
                    f"{out} was started with a different recipe (sections {changed} differ); its runs would not be "
                    "comparable. Use another --output-dir or --overwrite"
                )
            models = [m for m in ARCHITECTURES if m in before.models or m in recipe.models]
            contexts = sorted(set(before.contexts) | set(recipe.contexts))
            covered = dataclasses.replace(recipe, models=models, contexts=contexts)
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(yaml.safe_dump(covered.to_dict(), sort_keys=False))
    return covered


def _run_dir(out: Path, name: str, context: int) -> Path:
    return out / "runs" / name / f"ctx-{context}"


def train_one(
    recipe: StudyRecipe, arch: Architecture, context: int, corpus: StudyCorpus, out: Path, resume: bool
) -> dict:
    """Train ``arch`` at ``context`` from scratch, score the test windows, write result.json."""
    run_dir = _run_dir(out, arch.name, context)
    run_dir.mkdir(parents=True, exist_ok=True)
    resuming = resume and latest_checkpoint(run_dir / "checkpoints") is not None
    if not resuming and (run_dir / "metrics.jsonl").exists():
        (run_dir / "metrics.jsonl").unlink()  # a run without a checkpoint starts over
    t = recipe.train
    accelerator = _accelerator(t.mixed_precision)
    model = arch.build(recipe.seed).to(accelerator.device)
    batches = PackedBatches(corpus.train, context, seed=recipe.seed, source=f"the training split of {corpus.source}")
    micro_tokens = t.micro_batch_tokens or t.batch_tokens  # the same tokens per optimizer step either way
    section = PhaseSection(
        steps=recipe.steps, seq_len=context, batch_size=micro_tokens // context, lr=t.lr,
        warmup_steps=t.warmup_steps, schedule=t.schedule, min_lr_ratio=t.min_lr_ratio,
    )
    train = TrainSection(
        grad_accum=t.batch_tokens // micro_tokens, max_grad_norm=t.max_grad_norm, weight_decay=t.weight_decay, mixed_precision=t.mixed_precision,
        on_nan=t.on_nan, log_every=t.log_every,
    )
    began = time.perf_counter()
    result = run_phase(
        name=f"{arch.name} @ {context}", accelerator=accelerator, module=model,
        trainable=dict(model.named_parameters()), loss_fn=next_token_loss, batches=batches, section=section,
        train=train, checkpointing=CheckpointSection(every=t.checkpoint_every, keep=1),
        checkpoint_root=run_dir / "checkpoints", log=MetricsLog(run_dir / "metrics.jsonl"), resume=resuming,
    )
    model = accelerator.unwrap_model(model)
    train_seconds = time.perf_counter() - began
    trained_tokens = result.tokens * (1 - result.resumed_from / result.steps)  # this process's share
    record = {
        "model": arch.name, "context": context, "params": arch.params, "unit": corpus.unit,
        **score_model(model, corpus, context, recipe, accelerator),
        "steps": result.steps, "tokens": result.tokens, "final_train_loss": result.final_loss,
        "train_seconds": train_seconds, "resumed_from_step": result.resumed_from,
        "train_tokens_per_s": trained_tokens / result.seconds if result.seconds > 0 else None,
        "device": str(accelerator.device), "implementation": implementation(arch),
    }
    if t.save_weights:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, run_dir / "model.safetensors")
        arch.config.to_json_file(run_dir / "config.json")
    _write_result(run_dir, record)  # the run counts as done only once this file is complete
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    accelerator.free_memory()
    return record


def _write_result(run_dir: Path, record: dict) -> None:
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(run_dir / "result.json")


def _record_failure(out: Path, arch: Architecture, context: int, corpus: StudyCorpus, status: str, error: str) -> None:
    """A run that does not fit in memory or diverges is a result too: bits None and its status.

    The study goes on with the next run; `--resume` does not retry it (delete its result.json to retry it).
    """
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    run_dir = _run_dir(out, arch.name, context)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    _write_result(run_dir, {"model": arch.name, "context": context, "params": arch.params, "bits": None,
                            "unit": corpus.unit, "status": status, "error": error[:300]})


def implementation(arch: Architecture) -> str:
    """Which code path trains the model: Mamba's differ by orders of magnitude in memory and speed."""
    if arch.config.model_type != "mamba" and not has_mamba_mixers(arch.config):
        return "hallamonic scan" if arch.config.model_type == "hallamonic" else "torch sdpa attention"
    from transformers.utils.import_utils import is_mambapy_available

    try:
        import mamba_ssm  # noqa: F401

        return "mamba_ssm CUDA kernels (when on CUDA)"
    except ImportError:
        return "transformers PyTorch path, mambapy parallel scan" if is_mambapy_available() else (
            "transformers PyTorch path, sequential loop (install mambapy)"
        )


def _backfill_validation(recipe: StudyRecipe, arch: Architecture, context: int, corpus: StudyCorpus, out: Path) -> None:
    """Runs finished before validation scoring existed get it from their saved weights."""
    run_dir = _run_dir(out, arch.name, context)
    record = json.loads((run_dir / "result.json").read_text())
    if record.get("bits") is None or "valid_bits" in record or not (run_dir / "model.safetensors").is_file():
        return
    if len(corpus.valid) < context:
        return
    from safetensors.torch import load_file

    accelerator = _accelerator(recipe.train.mixed_precision)
    model = arch.build(recipe.seed)
    model.load_state_dict(load_file(run_dir / "model.safetensors"))
    valid = split_windows(corpus, "valid", context, recipe.eval.tokens)
    record["valid_bits"] = mean_bits(model.to(accelerator.device), valid, recipe.train.batch_tokens, accelerator)
    _write_result(run_dir, record)


def run_study(recipe: StudyRecipe, out: Path, *, resume: bool = False, overwrite: bool = False, echo=print) -> dict:
    """Train and score every (model, context) of the recipe not finished yet; write the report."""
    corpus = load_study_corpus(recipe.data)
    for context in recipe.contexts:  # fail before any training if a context cannot be scored
        split_windows(corpus, "test", context, recipe.eval.tokens)
        if len(corpus.train) < context:
            raise DataError(f"the training split has {len(corpus.train)} tokens, fewer than one context of {context}")
    longest = max(recipe.contexts)
    archs_at = {  # per context: Harmonic's timescale bands may follow it (`timescale_bands: context`)
        context: build_architectures(recipe.model, corpus.vocab_size, recipe.models, longest, context=context)
        for context in recipe.contexts
    }
    archs = archs_at[longest]
    covered = _prepare_output(recipe, out, resume, overwrite)
    target = count_parameters(harmonic_config(recipe.model, corpus.vocab_size, longest))
    echo(f"{corpus.source}: {len(corpus.train):,} train / {len(corpus.valid):,} valid / {len(corpus.test):,} test tokens ({corpus.unit})")
    for name, arch in archs.items():
        echo(f"  {name:24s} {arch.params:>12,} parameters ({100 * (arch.params / target - 1):+.1f}% vs harmonic)  [{implementation(arch)}]")
    echo(f"every run: {recipe.steps} steps x {recipe.train.batch_tokens:,} tokens = {recipe.steps * recipe.train.batch_tokens:,} tokens")
    for context in recipe.contexts:
        archs = archs_at[context]
        for name in recipe.models:
            done = _run_dir(out, name, context) / "result.json"
            if done.is_file():
                _backfill_validation(recipe, archs[name], context, corpus, out)
                earlier = json.loads(done.read_text())
                echo(f"[{name} @ {context}] done earlier: {earlier.get('status') or format(earlier['bits'], '.4f')}")
                continue
            try:
                record = train_one(recipe, archs[name], context, corpus, out, resume)
            except TrainingDiverged as err:
                _record_failure(out, archs[name], context, corpus, "diverged", str(err))
                echo(f"[{name} @ {context}] diverged: recorded, the study goes on ({err})")
                continue
            except (RuntimeError, torch.OutOfMemoryError) as err:
                if not is_out_of_memory(err):
                    raise
                _record_failure(out, archs[name], context, corpus, "out of memory", str(err))
                echo(f"[{name} @ {context}] out of memory: recorded, the study goes on")
                continue
            echo(f"[{name} @ {context}] test {record['bits']:.4f} {corpus.unit} in {record['train_seconds'] / 60:.1f} min")
    return write_report(out, covered)
