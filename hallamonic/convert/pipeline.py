"""`hallamonic convert`: surgery -> phase 1 (+ focus) -> phase 2 (+ refit) -> export, resumable at every step.

Layout of an output folder (it is itself a loadable Hugging Face checkpoint):

    config.json, model.safetensors, *_hallamonic.py, hallamonic_scan*.py, tokenizer files,
    generation_config.json, README.md (model card)
    training/recipe.yaml           the resolved recipe
    training/metrics.jsonl         one line per logged step
    training/loss.png              loss curves of both phases
    training/tokens.npy            the token stream of phase 1 and its focus (reused by --resume)
    training/tokens-phase2.npy     phase 2's and the refit's, when `phase2_data` names its own source
    training/tokens*.json          what each stream was made from (--resume tokenizes again if that changed)
    training/checkpoints/phaseN/   atomic step checkpoints (trainable weights + optimizer)
    training/report.json           parameter counts, tokens, wall time, held-out results
"""

from __future__ import annotations

import copy
import functools
import json
import platform
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from hallamonic.convert.copy_cache import attach_copy_cache, fit_copy_cache, unigram_log_prior, word_continuation_table
from hallamonic.convert.data import is_heldout, iter_documents, tokenize_stream
from hallamonic.convert.export import export, plot_losses
from hallamonic.convert.phases import (
    MixerStack, attention_transfer_errors, blocks_in, compiled_in_place, compiler_available, phase1_loss, phase2_compiled_mixers,
    phase2_loss,
)
from hallamonic.convert.recipe import Recipe, recipe_to_yaml
from hallamonic.convert.surgery import build_student, calibrate_blocks, parameter_counts
from hallamonic.data import DataError
from hallamonic.tiny import load_builtin_teacher
from hallamonic.training.checkpoint import latest_checkpoint, load_checkpoint
from hallamonic.training.packing import PackedBatches
from hallamonic.training.trainer import MetricsLog, PhaseResult, make_accelerator, native_bfloat16, run_phase

if TYPE_CHECKING:
    import numpy as np
    from accelerate import Accelerator

PHASES = ("surgery", "phase1", "phase2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class OutputDirError(ValueError):
    """The output folder exists and neither --overwrite nor --resume was given."""


def check_output_dir(path: Path, *, overwrite: bool, resume: bool) -> None:
    """Refuse to touch an existing, non-empty output folder unless told to resume or overwrite."""
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"output path {path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()) and not (overwrite or resume):
        raise OutputDirError(f"output folder {path} already exists and is not empty; pass --resume to continue it or --overwrite to replace it")


def prepare_output_dir(path: Path, *, overwrite: bool, resume: bool) -> None:
    check_output_dir(path, overwrite=overwrite, resume=resume)
    if overwrite and path.is_dir():
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)


def parse_phases(text: str | None) -> tuple[str, ...]:
    if not text:
        return PHASES
    phases = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        raise ValueError(f"--phases: unknown phase(s) {unknown or text!r}; choose from {', '.join(PHASES)}")
    return phases


def load_base_model(spec: str, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for a hub id, a folder, a .gguf file, or ``builtin:tiny-llama``."""
    if spec.startswith("builtin:"):
        return load_builtin_teacher(spec, dtype)
    from hallamonic.loading import load_causal_lm

    return load_causal_lm(spec, dtype=dtype)


def _tokens_needed(recipe: Recipe, world: int, stream: str = "all") -> int:
    """Tokens a training stream must hold: ``"transfer"`` (phase 1 and its focus), ``"phase2"``
    (phase 2, its refit and the copy cache's fit when that reads phase-2 text) or ``"all"`` (both, when
    they read the same source). The copy cache's unseen fit text is its own stream, read past ``"transfer"``."""
    p1, p2 = recipe.phase1, recipe.phase2

    def read_by(phase) -> int:  # tokens its steps read across every process
        return phase.steps * phase.batch_size * recipe.train.grad_accum * world * phase.seq_len

    phase1 = min(read_by(p1), _pool_tokens(recipe)) if _pool_tokens(recipe) else read_by(p1)  # a pool is cycled over
    needs = {
        "transfer": [phase1, p1.focus_pool * p1.seq_len * (p1.focus_steps > 0)],
        "phase2": [read_by(p2), p2.refit_pool * p1.seq_len * (p2.refit_steps > 0),
                   recipe.copy_cache.fit_windows * recipe.copy_cache.fit_length
                   * (bool(recipe.copy_cache.orders) and recipe.copy_cache.fit_text == "phase2")],
    }
    wanted = needs["transfer"] + needs["phase2"] if stream == "all" else needs[stream]
    longest = max(p1.seq_len, p2.seq_len)
    return max(max(wanted), longest) + longest


def _pool_tokens(recipe: Recipe) -> int:
    """Tokens in phase 1's teacher pool (0: no pool, a fresh teacher pass per step)."""
    return recipe.phase1.teacher_pool * recipe.phase1.seq_len


def _phase1_tokens(recipe: Recipe, tokens):
    """Phase 1's training stream: with a teacher pool, only its first ``teacher_pool`` sequences."""
    return tokens[: _pool_tokens(recipe)] if _pool_tokens(recipe) else tokens


STREAM_CACHES = {"transfer": "tokens.npy", "phase2": "tokens-phase2.npy", "copy_cache": "tokens-copy-cache.npy"}  # under training/, each with a .json sidecar


def _stream_source(section, seed: int, tokenizer) -> dict:
    """What a cached token stream was made from: the data section, the seed (held-out split), the
    tokenizer, and a local file's size (an edited file is another source)."""
    source = {"data": asdict(section), "seed": seed,
              "tokenizer": [type(tokenizer).__name__, len(tokenizer), tokenizer.eos_token_id]}
    if section.path and Path(section.path).is_file():
        source["file_bytes"] = Path(section.path).stat().st_size
    return json.loads(json.dumps(source))  # as it reads back from the sidecar (tuples -> lists)


def _load_streams(recipe: Recipe, tokenizer, out: Path, world: int, resume: bool, notify=print) -> tuple[dict, dict]:
    """The training token streams, ``{"transfer": ..., "phase2": ...}`` (one array under both names
    unless ``phase2_data`` names its own source), and the sidecars of those tokenized in this run.

    --resume reads an interrupted run's cached copy when its sidecar names the same source and it
    holds the tokens the recipe now needs (or all its source has); otherwise it tokenizes again and
    says why: a resumed run with more steps, or another text, would otherwise cycle over a stale
    prefix or train on text the recipe no longer names. A cache without a sidecar (written before
    sidecars, or copied by hand) is read as before when it is long enough."""
    import numpy as np

    fresh: dict[str, dict] = {}

    def load(stream: str, section, needed: int, skip: int = 0):
        cache = out / "training" / STREAM_CACHES[stream]
        source = _stream_source(section, recipe.seed, tokenizer) | ({"after_tokens": skip} if skip else {})
        if resume and cache.is_file():
            tokens = np.load(cache, allow_pickle=False)
            sidecar = cache.with_suffix(".json")
            saved = json.loads(sidecar.read_text()) if sidecar.is_file() else None
            if saved is not None and saved["source"] != source:
                notify(f"{cache.name}: the recipe's text source changed since the cache was made; tokenizing again "
                       "(phases already finished trained on the old text)")
            elif len(tokens) >= needed or (saved is not None and saved["exhausted"]):
                return tokens
            else:
                notify(f"{cache.name}: holds {len(tokens):,} tokens, the recipe now needs {needed:,}; tokenizing again")
        tokens = tokenize_stream(tokenizer, section, seed=recipe.seed, max_tokens=skip + needed)[skip:]
        fresh[stream] = {"source": source, "tokens": len(tokens), "exhausted": len(tokens) < needed}
        return tokens

    if recipe.phase2_source() is recipe.data:
        tokens = load("transfer", recipe.data, _tokens_needed(recipe, world))
        streams = {"transfer": tokens, "phase2": tokens}
    else:
        streams = {
            "transfer": load("transfer", recipe.data, _tokens_needed(recipe, world, "transfer")),
            "phase2": load("phase2", recipe.phase2_data, _tokens_needed(recipe, world, "phase2")),
        }
    cache = recipe.copy_cache
    if cache.orders and cache.fit_text == "unseen":  # `data` right after the transfer stream: no phase reads it
        streams["copy_cache"] = load("copy_cache", recipe.data, cache.fit_windows * cache.fit_length, skip=len(streams["transfer"]))
    return streams, fresh


def _save_streams(streams: dict, fresh: dict, out: Path) -> None:
    """Cache each stream tokenized in this run (int32 .npy and its .json sidecar, each written then
    renamed) so --resume needs no re-tokenizing."""
    import numpy as np

    for stream, sidecar in fresh.items():
        cache = out / "training" / STREAM_CACHES[stream]
        tmp = cache.with_suffix(".tmp.npy")
        np.save(tmp, streams[stream])
        tmp.replace(cache)
        tmp = cache.with_suffix(".tmp.json")
        tmp.write_text(json.dumps(sidecar, indent=1))
        tmp.replace(cache.with_suffix(".json"))


def _heldout_texts(recipe: Recipe, max_chars: int) -> list[str]:
    texts, total = [], 0
    for index, document in enumerate(iter_documents(recipe.data)):
        if is_heldout(index, recipe.seed, recipe.data.heldout_fraction):
            texts.append(document)
            total += len(document)
            if total >= max_chars:
                break
    return texts


def _phase_checkpoints(out: Path, phase: str) -> Path:
    return out / "training" / "checkpoints" / phase


def _restore_finished_phase(student, out: Path, phase: str) -> bool:
    """Load a phase's final weights into the student if that phase completed earlier."""
    latest = latest_checkpoint(_phase_checkpoints(out, phase))
    if latest is None:
        return False
    weights, info = load_checkpoint(latest)
    if not info.get("complete"):
        return False
    params = dict(student.named_parameters())
    with torch.no_grad():
        for key, value in weights.items():
            params[key].copy_(value)
    return True


def convert(
    recipe: Recipe,
    output_dir: str | Path,
    *,
    phases: tuple[str, ...] = PHASES,
    resume: bool = False,
    overwrite: bool = False,
    load_teacher=None,
) -> dict:
    """Run a conversion end to end and write a loadable checkpoint to ``output_dir``.

    ``load_teacher(spec, dtype)`` -> (model, tokenizer) can replace the default loader (tests).
    Returns the report that is also written to ``training/report.json``.
    """
    out = Path(output_dir)
    accelerator = make_accelerator(recipe.train.mixed_precision)
    began = time.perf_counter()
    # Everything that can fail on bad input (folder policy, model, data) runs before the output
    # folder is touched, so a typo never leaves a half-made folder behind.
    check_output_dir(out, overwrite=overwrite, resume=resume)
    transfers = recipe.phase1.steps > 0 or recipe.phase1.focus_steps > 0 or recipe.phase2.refit_steps > 0  # what phase1.compile serves
    for key, wanted in (("phase1.compile", recipe.phase1.compile and transfers), ("phase2.compile", recipe.phase2.compile and recipe.phase2.steps > 0)):
        if wanted and not compiler_available(accelerator.device.type):
            raise ValueError(f"recipe key `{key}: true` needs a C++ compiler for torch.compile on CPU (g++ or clang++, "
                             f"or $CXX): install one (e.g. apt install g++) or set {key}=false")
    emulated = emulated_bfloat16_keys(recipe, accelerator.device.type)
    if emulated:
        accelerator.print(
            f"warning: {', '.join(emulated)} ask(s) for bfloat16, which this {accelerator.device.type.upper()} does not compute "
            "in hardware (a CPU needs AVX-512 BF16 or AMX): emulated, SmolLM2's teacher pass ran 4.4x slower than in float32 "
            "(benchmarks/teacher_dtype.py). Set train.mixed_precision / phaseN.teacher_dtype to `native` (bfloat16 only "
            "where it is native) and base.dtype to float32"
        )
    teacher, tokenizer = (load_teacher or load_base_model)(recipe.base.model, dtype=DTYPES[recipe.base.dtype])
    teacher.eval().requires_grad_(False)
    layer_lists = (  # (key, layers, in use): checked only when used (a non-Llama base has no model.layers)
        ("phase1.focus_layers", recipe.phase1.focus_layers, recipe.phase1.focus_steps > 0),
        ("phase2.frozen_layers", recipe.phase2.frozen_layers, bool(recipe.phase2.frozen_layers)),
        ("phase2.refit_layers", recipe.phase2.refit_layers, recipe.phase2.refit_steps > 0),
        ("harmonic.hedgehog_layers", recipe.harmonic.hedgehog_layers, bool(recipe.harmonic.hedgehog_layers)),
        ("harmonic.taylor_layers", recipe.harmonic.taylor_layers, bool(recipe.harmonic.taylor_layers)),
        ("harmonic.delta_layers", recipe.harmonic.delta_layers, bool(recipe.harmonic.delta_layers)),
        ("harmonic.recall_layers", recipe.harmonic.recall_layers, bool(recipe.harmonic.recall_layers)),
    )
    for key, layers, used in layer_lists:
        if used:
            check_layers(key, layers, len(teacher.model.layers))
    teacher.to(accelerator.device)
    streams, fresh_streams = _load_streams(recipe, tokenizer, out, accelerator.num_processes, resume, notify=accelerator.print)
    tokens = streams["transfer"]
    for stream, key, seq_len in (("transfer", "data", recipe.phase1.seq_len if recipe.phase1.steps else 0),
                                 ("phase2", "phase2_data", recipe.phase2.seq_len if recipe.phase2.steps else 0)):
        if len(streams[stream]) < max(seq_len, 1):
            source = "the training data" if streams["phase2"] is tokens else f"the `{key}` text"
            raise DataError(
                f"{source} has {len(streams[stream])} tokens, fewer than one sequence of {seq_len}; "
                "add data or lower the phases' seq_len"
            )

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        prepare_output_dir(out, overwrite=overwrite, resume=resume)
        (out / "training").mkdir(parents=True, exist_ok=True)
        (out / "training" / "recipe.yaml").write_text(recipe_to_yaml(recipe))
        _save_streams(streams, fresh_streams, out)
    accelerator.wait_for_everyone()
    student = build_student(teacher, recipe.harmonic, seed=recipe.seed, base_spec=recipe.base.model).to(accelerator.device)
    probe, probe_source = _transfer_probe(recipe, tokens, tokenizer, notify=accelerator.print)
    probe = probe.to(accelerator.device)
    transfer: dict[str, list[float]] = {}

    def measure_transfer(stage: str) -> None:
        transfer[stage] = attention_transfer_errors(student, teacher, probe)
        mean = sum(transfer[stage]) / len(transfer[stage])
        accelerator.print(f"attention transfer after {stage}: mean normalised MSE {mean:.3f} ({probe_source})")

    measure_transfer("surgery")
    if recipe.harmonic.calibrate_norms:
        sample = PackedBatches(tokens, recipe.phase1.seq_len, seed=recipe.seed).sequences[:2].to(accelerator.device)
        calibrate_blocks(student, teacher, sample)
        measure_transfer("calibrated")
    counts = parameter_counts(teacher, student)
    accelerator.print(
        f"teacher {counts['teacher']:,} parameters -> student {counts['student']:,} "
        f"({counts['student_trainable']:,} trainable in the HarmonicBlocks)"
    )
    log = MetricsLog(out / "training" / "metrics.jsonl", enabled=accelerator.is_main_process)
    run = ConversionRun(recipe, student, tokens, accelerator, out, log, resume, phase2_tokens=streams["phase2"])
    results: list[PhaseResult] = []

    phase1_done = False
    focus = recipe.phase1.focus_steps > 0
    transfers = "phase1" in phases and (recipe.phase1.steps > 0 or focus)  # phase 1 or its focus will run
    teacher_in = functools.cache(lambda dtype: teacher_in_dtype(teacher, dtype))  # one copy per dtype, shared by the phases
    transfer_teacher = teacher_in(recipe.phase1.teacher_dtype) if transfers else teacher
    if "phase1" in phases and recipe.phase1.steps > 0:
        results.append(run_phase1(run, transfer_teacher))
        phase1_done = True
    elif "phase2" in phases:
        phase1_done = _restore_finished_phase(student, out, "phase1")
    if phase1_done:
        measure_transfer("phase1")
    if focus and "phase1" in phases:
        results.append(run_phase1_focus(run, transfer_teacher))
        measure_transfer("phase1-focus")
    elif focus and "phase2" in phases and _restore_finished_phase(student, out, "phase1-focus"):
        measure_transfer("phase1-focus")

    if "phase2" in phases and recipe.phase2.steps > 0:
        phase2_teacher = teacher_in(recipe.phase2.teacher_dtype) if recipe.phase2.distils else teacher
        results.append(run_phase2(run, phase2_teacher))
        measure_transfer("phase2")
    refit = None
    if "phase2" in phases and recipe.phase2.refit_steps > 0:
        refit_teacher = teacher_in(recipe.phase1.teacher_dtype)
        result, refit = run_phase2_refit(run, refit_teacher, probe)
        results.append(result)
        accelerator.print(f"refit of layers {refit['layers']} on the converted model's inputs: normalised MSE {refit['before']} -> {refit['after']}")
        measure_transfer("phase2-refit")
    copy_cache = None
    if "phase2" in phases and recipe.copy_cache.orders:
        vocab = student.config.vocab_size
        continues_word = word_continuation_table(tokenizer, vocab) if recipe.copy_cache.continuation else None
        trained_on = {id(s): s for s in (streams["transfer"], streams["phase2"])}.values()  # one stream when both phases read `data`
        log_prior = unigram_log_prior(list(trained_on), vocab) if recipe.copy_cache.prior else None
        attach_copy_cache(
            student, recipe.copy_cache.orders, recipe.copy_cache.buckets, recipe.copy_cache.seen, continues_word, log_prior,
            recipe.copy_cache.rate, recipe.copy_cache.count_cap,
        )
        student.eval()
        windows, fit_text = _copy_cache_windows(recipe, streams, notify=accelerator.print)
        copy_cache = fit_copy_cache(student, windows, steps=recipe.copy_cache.fit_steps, lr=recipe.copy_cache.fit_lr,
                                    progress=accelerator.is_main_process) | {"fit_text": fit_text}
        accelerator.print(
            f"copy cache (orders {copy_cache['orders']}): NLL on the fit text ({fit_text}) {copy_cache['nll_before']} -> "
            f"{copy_cache['nll_after']} nats/token on {copy_cache['fit_tokens']:,} tokens"
        )

    report = {
        "recipe": recipe.name,
        "base_model": recipe.base.model,
        "parameters": counts,
        "phases": [asdict(r) for r in results],
        "wall_seconds": time.perf_counter() - began,
        "hardware": _hardware(accelerator),
        "precision": {  # as resolved on this machine (`native` / `auto` read the hardware)
            "mixed_precision": str(accelerator.mixed_precision),
            "phase1_teacher": str(next(transfer_teacher.parameters()).dtype).removeprefix("torch."),
            "native_bfloat16": native_bfloat16(accelerator.device.type),
        },
        "processes": accelerator.num_processes,
        "attention_transfer": {"sample": probe_source, "normalised_mse": transfer},
    }
    if refit is not None:
        report["refit"] = {"sample": probe_source, **refit}
    if copy_cache is not None:
        report["copy_cache"] = copy_cache
    if accelerator.is_main_process:
        student.eval()
        report["heldout"] = _evaluate_for_card(recipe, teacher, student, tokenizer)
        report["continuations"] = _greedy_continuations(recipe, teacher, student, tokenizer)
        export(student, tokenizer, teacher, out, recipe, report)
        plot_losses(out / "training" / "metrics.jsonl", out / "training" / "loss.png")
    accelerator.wait_for_everyone()
    return report


def _copy_cache_windows(recipe: Recipe, streams: dict, notify=print) -> tuple[torch.Tensor, str]:
    """(W, L) windows for the copy cache's fit, drawn by the recipe's seed, and which text they are:
    ``"unseen"``, the text no phase read (``copy_cache.fit_text: unseen``), or ``"phase2"``.

    Why unseen text: phase 2 and its refit have just trained on the phase-2 text, and a model predicts
    a document it has seen better than a new one, so a gate fitted there learns that copying is worth
    less than it is on new text (evals/results/smollm2-135m-induction-cache/fit_text_probe.py). A source
    with too little text past the transfer stream falls back to the phase-2 text, said through notify."""
    cache = recipe.copy_cache
    stream, used, source = streams["phase2"], "phase2", "the phase-2 text"
    if cache.fit_text == "unseen":
        if len(streams["copy_cache"]) >= cache.fit_length:
            stream, used, source = streams["copy_cache"], "unseen", "the unseen text"
        else:
            notify(f"note: copy_cache.fit_text unseen: `data` holds {len(streams['copy_cache']):,} tokens past what phase 1 "
                   f"reads, fewer than one window of {cache.fit_length}; the copy cache is fitted on the phase-2 text instead")
    length = min(cache.fit_length, len(stream))
    sequences = PackedBatches(stream, length, seed=recipe.seed, source=source).sequences
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(recipe.seed))
    return sequences[order[: recipe.copy_cache.fit_windows]], used


def teacher_in_dtype(teacher: nn.Module, dtype: str | None) -> nn.Module:
    """The teacher whose attention I/O phase 1 and the focus regress (or whose logits and hidden
    states phase 2 distils): ``teacher`` itself, or a copy in ``phaseN.teacher_dtype`` (``native``:
    bfloat16 where the hardware computes it, else the teacher as loaded). Why: on a CPU with
    AVX-512 BF16 its pass is ~3x faster (SmolLM2, 4 x 512 tokens: ~1.3 s vs ~4.3 s, a third of a
    phase-1 step), and the attention outputs it gives differ from float32's by a normalised MSE of
    ~5e-4, far below what the blocks reach (~0.15); on one without, 4.4x slower:
    ``benchmarks/teacher_dtype.py``."""
    if dtype == "native":
        dtype = "bfloat16" if native_bfloat16(next(teacher.parameters()).device.type) else None
    if dtype is None or DTYPES[dtype] == next(teacher.parameters()).dtype:
        return teacher
    return copy.deepcopy(teacher).to(DTYPES[dtype])


def emulated_bfloat16_keys(recipe: Recipe, device_type: str) -> list[str]:
    """The recipe keys that ask for bfloat16 by name on a device that only emulates it (slower
    than float32 there: :func:`teacher_in_dtype`); empty where bfloat16 is native."""
    if native_bfloat16(device_type):
        return []
    asked = (
        ("base.dtype", recipe.base.dtype == "bfloat16"),
        ("train.mixed_precision", recipe.train.mixed_precision == "bf16"),
        ("phase1.teacher_dtype", recipe.phase1.teacher_dtype == "bfloat16"),
        ("phase2.teacher_dtype", recipe.phase2.teacher_dtype == "bfloat16"),
    )
    return [key for key, bfloat16 in asked if bfloat16]


@dataclass
class ConversionRun:
    """What every phase of one conversion shares; each phase runner takes it and its teacher."""

    recipe: Recipe
    student: nn.Module
    tokens: np.ndarray  # the training token stream of phase 1 and its focus, int32
    accelerator: Accelerator
    out: Path
    log: MetricsLog
    resume: bool
    phase2_tokens: np.ndarray | None = None  # phase 2's and the refit's, when `phase2_data` names its own source

    @property
    def phase2_stream(self) -> np.ndarray:
        return self.tokens if self.phase2_tokens is None else self.phase2_tokens

    def train(self, name: str, section, module: nn.Module, trainable: dict, loss_fn, stream, seed: int) -> PhaseResult:
        """``run_phase`` with this conversion's training settings, checkpoints and log."""
        return run_phase(
            name=name, accelerator=self.accelerator, module=module, trainable=trainable, loss_fn=loss_fn,
            batches=PackedBatches(stream, section.seq_len, seed=seed),
            section=section, train=self.recipe.train, checkpointing=self.recipe.checkpoint,
            checkpoint_root=_phase_checkpoints(self.out, name), log=self.log, resume=self.resume,
        )


def _attention_transfer(run: ConversionRun, name: str, section, layers, teacher, *, stream, pool: bool) -> PhaseResult:
    """Train the blocks of ``layers`` alone on their teacher attention I/O (phase 1's loss) for
    ``section.steps`` steps over ``stream``; ``pool`` captures each sequence's teacher I/O once."""
    student = run.student
    stack = MixerStack([student.model.layers[i].mixer for i in layers], normalize=section.normalize, compile=section.compile)
    prefixes = tuple(f"model.layers.{i}.mixer." for i in layers)
    trainable = {n: p for n, p in student.named_parameters() if p.requires_grad and n.startswith(prefixes)}
    every = len(layers) == len(student.model.layers)
    loss_fn = phase1_loss(teacher, pool=pool, layers=None if every else layers)
    return run.train(name, section, stack, trainable, loss_fn, stream, seed=run.recipe.seed)


def run_phase1(run: ConversionRun, teacher) -> PhaseResult:
    """Phase 1: every HarmonicBlock trained alone on its layer's teacher attention I/O."""
    p1 = run.recipe.phase1
    every = range(len(run.student.model.layers))
    stream = _phase1_tokens(run.recipe, run.tokens)
    return _attention_transfer(run, "phase1", p1, every, teacher, stream=stream, pool=p1.teacher_pool > 0)


def check_layers(key: str, layers: list[int], count: int) -> None:
    outside = [i for i in layers if i >= count]
    if outside:
        raise ValueError(f"recipe key `{key}`: the model has layers 0-{count - 1}, got {outside}")


def run_phase1_focus(run: ConversionRun, teacher) -> PhaseResult:
    """More attention transfer for the blocks of ``phase1.focus_layers`` alone, after phase 1.

    Why: on SmolLM2 the converted model's recall is lost in a few layers (20-24) whose blocks are
    still far from their attention when phase 1 ends, and more steps there bring LAMBADA back
    (``evals/results/smollm2-135m-layer-swap/``); training only those blocks on a small pool whose
    teacher I/O is captured once makes such a step ~1/8 the cost of a phase-1 step.

    With ``focus_inputs: converted`` the blocks regress what the teacher's attention makes of the
    inputs the converted model gives their layers (the refit's setting, before phase 2 instead of
    after it), so phase 2 adapts the other layers to blocks fitted where they will run.
    """
    p1 = run.recipe.phase1
    section = replace(p1, steps=p1.focus_steps, lr=p1.focus_lr, warmup_steps=max(p1.focus_steps // 10, 1))
    layers = list(p1.focus_layers)
    pool = run.tokens[: p1.focus_pool * p1.seq_len]
    on_converted = p1.focus_inputs == "converted"
    with blocks_in(teacher, run.student, _other_layers(run.student, layers) if on_converted else []) as source:
        return _attention_transfer(run, "phase1-focus", section, layers, source, stream=pool, pool=True)


def _other_layers(student: nn.Module, layers: list[int]) -> list[int]:
    return [i for i in range(len(student.model.layers)) if i not in layers]


def run_phase2(run: ConversionRun, teacher) -> PhaseResult:
    """Phase 2: the whole student end to end (next-token + KL and hidden alignment to the teacher), MLPs and
    embeddings frozen unless LoRA adapters are asked for (merged back afterwards), and the mixers
    of ``phase2.frozen_layers`` too: on SmolLM2, end-to-end training of the recall layers' blocks
    lowers LAMBADA accuracy that the attention transfer had built
    (``evals/results/smollm2-135m-layer-swap/phase_states.py``)."""
    section, student = run.recipe.phase2, run.student
    model = student
    if section.lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=section.lora_rank, lora_alpha=section.lora_alpha, target_modules=["gate_proj", "up_proj", "down_proj"])
        model = get_peft_model(student, lora)
        for name, param in model.named_parameters():  # peft freezes everything else: re-open the mixers
            if ".mixer." in name:
                param.requires_grad_(True)
    if section.gradient_checkpointing:
        student.gradient_checkpointing_enable()
    frozen = tuple(f"model.layers.{i}.mixer." for i in section.frozen_layers)
    held = [p for name, p in model.named_parameters() if p.requires_grad and any(prefix in name for prefix in frozen)]
    for param in held:  # (peft prefixes the names: match inside them)
        param.requires_grad_(False)
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    window = getattr(teacher.config, "max_position_embeddings", None)
    loss_fn = phase2_loss(
        teacher, kl_weight=section.kl_weight, teacher_window=window, chunk_size=section.chunk_size,
        ce_weight=section.ce_weight, hidden_weight=section.hidden_weight,
    )
    compiled = phase2_compiled_mixers(student) if section.compile else []
    with compiled_in_place(compiled):
        result = run.train("phase2", section, model, trainable, loss_fn, run.phase2_stream, seed=run.recipe.seed + 1)
    for param in held:  # trainable again for what comes after (the refit)
        param.requires_grad_(True)
    if section.gradient_checkpointing:
        student.gradient_checkpointing_disable()
    if section.lora_rank > 0:
        model.merge_and_unload()  # LoRA deltas folded into the MLP weights
    return result


def run_phase2_refit(run: ConversionRun, teacher, probe: torch.Tensor) -> tuple[PhaseResult, dict]:
    """More attention transfer for the blocks of ``phase2.refit_layers`` after phase 2, on the
    inputs the converted model itself gives them: the teacher runs with the student's blocks in
    every other layer, and each refit block regresses what the teacher's attention makes of its
    layer's input there ("phase2-refit"). Returns the phase and the refit blocks' normalised MSE on
    the held-out probe, measured the same way, before and after.

    Why: phase 1 and its focus fit each block on the teacher's own residual stream, but in the
    converted model a block receives the stream the blocks before it made. On SmolLM2 layer 23's
    block, fitted to 0.22 on the teacher's inputs, was at 0.61 on the converted model's; 1,500 steps
    on those brought LAMBADA from 0.070 to 0.127 (evals/results/smollm2-135m-layer-swap/retrain.py).
    """
    p1, p2, student = run.recipe.phase1, run.recipe.phase2, run.student
    layers = list(p2.refit_layers)
    section = replace(p1, steps=p2.refit_steps, lr=p2.refit_lr, warmup_steps=max(p2.refit_steps // 10, 1))
    with blocks_in(teacher, student, _other_layers(student, layers)) as hybrid:
        before = attention_transfer_errors(student, hybrid, probe, layers)
        pool = run.phase2_stream[: p2.refit_pool * p1.seq_len]
        result = _attention_transfer(run, "phase2-refit", section, layers, hybrid, stream=pool, pool=True)
        after = attention_transfer_errors(student, hybrid, probe, layers)
    return result, {"layers": layers, "before": before, "after": after}


def _hardware(accelerator) -> str:
    if torch.cuda.is_available():
        return f"{accelerator.num_processes} x {torch.cuda.get_device_name(0)}"
    return (f"{accelerator.num_processes} process(es) on CPU ({platform.processor() or platform.machine()}, "
            f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)")


def _transfer_probe(recipe: Recipe, tokens, tokenizer, notify=print) -> tuple[torch.Tensor, str]:
    """Two phase-1-length sequences to measure attention transfer on: held-out text when the
    source has held-out documents (never trained on), else the start of the training stream.
    Held-out text asked for and not found is said through ``notify``: the user then knows why the
    probes read training text (a plain-text file with no blank lines is a single document)."""
    length = recipe.phase1.seq_len
    if recipe.data.heldout_fraction > 0:
        texts = _heldout_texts(recipe, max_chars=2 * length * 8)
        ids = [i for text in texts for i in tokenizer(text, add_special_tokens=False).input_ids]
        if len(ids) >= 2 * length:
            return torch.tensor(ids[: 2 * length]).view(2, length), f"2 x {length} held-out tokens"
        notify(
            f"note: data.heldout_fraction {recipe.data.heldout_fraction} held out {len(texts)} document(s), "
            f"{len(ids)} tokens, fewer than the probes' 2 x {length} (a plain-text file is cut into documents "
            "at blank lines): attention transfer is measured on training text instead, and the model card's "
            "held-out bits/token cover only what was held out"
        )
    return PackedBatches(tokens, length, seed=recipe.seed).sequences[:2], f"2 x {length} training tokens"


CONTINUATION_PROMPT = "The water cycle describes how water moves between the oceans, the air and the land. First,"


@torch.no_grad()
def _greedy_continuations(recipe: Recipe, teacher, student, tokenizer, new_tokens: int = 32) -> dict:
    """A short greedy continuation of one fixed prompt by teacher and converted model (model card)."""
    if recipe.eval.max_windows == 0:
        return {}
    ids = tokenizer(CONTINUATION_PROMPT, return_tensors="pt").input_ids
    result = {"prompt": CONTINUATION_PROMPT}
    for name, model in (("teacher", teacher), ("converted", student)):
        device = next(model.parameters()).device
        output = model.generate(
            ids.to(device), attention_mask=torch.ones_like(ids).to(device), max_new_tokens=new_tokens,
            do_sample=False, pad_token_id=tokenizer.eos_token_id,
        )
        result[name] = tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True)
    return result


def _evaluate_for_card(recipe: Recipe, teacher, student, tokenizer) -> dict:
    """Held-out bits/token of teacher and student at the recipe's lengths (for the model card)."""
    if recipe.eval.max_windows == 0 or recipe.data.heldout_fraction == 0:
        return {}
    from hallamonic.evaluation.context import evaluate_context

    longest = max(recipe.eval.context_lengths)
    texts = _heldout_texts(recipe, max_chars=longest * recipe.eval.max_windows * 6)
    if not texts:
        return {}
    results = {}
    for name, model in (("teacher", teacher), ("converted", student)):
        result = evaluate_context(
            model, tokenizer, texts, recipe.eval.context_lengths, limit=recipe.eval.max_windows, progress=False
        )
        results[name] = {"bits_per_token": result["bits_per_token"], "tokens": result["tokens"], "not_run": result["not_run"]}
    return results


__all__ = ["ConversionRun", "OutputDirError", "check_output_dir", "convert", "parse_phases", "prepare_output_dir"]
