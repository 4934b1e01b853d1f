#!/usr/bin/env bash
# Phase-2 variants of the bundled smollm2-135m conversion, each started from the SAME end-of-phase-1
# checkpoint (the bundled run's, outputs/smollm2-n64 from evals/smollm2_selective.sh; SRC= another run's
# folder, whose phase1-focus checkpoint is restored too when it has one, unless RESTORE_FOCUS=0), so a row
# costs one phase 2 (~24 min on 2 cores) instead of a whole conversion, and rows differ only in phase 2.
# Usage: bash evals/results/smollm2-135m-phase2-sweep/run.sh NAME [--set phase2.KEY=VALUE ...]
# Writes outputs/p2-NAME (the converted model) and evals/results/smollm2-135m-phase2-sweep/NAME/.
# PHASES (default phase2), OUT and RES override the phases run after the restored phase 1 and the
# two folders (../smollm2-135m-layer-swap/focus_run.sh runs phase1,phase2 to add a phase1-focus).
# RESTORE_PHASE2=1 restores SRC's finished phase 2 as well, so only a phase2-refit runs (refit variants).
# DATA= another training file (default ../shared/data/fineweb_train.jsonl): SRC's token cache is then
# not copied and phase 2 and the refit tokenize DATA (the restored phase 1 and focus keep SRC's data).
# Rows measured before the recipe had `phase2.refit_steps` (2026-12-02) ran without one: add
# --set phase2.refit_steps=0 to reproduce them.
set -euo pipefail
NAME=$1; shift
SRC=${SRC:-outputs/smollm2-n64}
PHASES=${PHASES:-phase2}
OUT=${OUT:-outputs/p2-$NAME}
RES=${RES:-evals/results/smollm2-135m-phase2-sweep/$NAME}
FINEWEB=../shared/data/fineweb_train.jsonl  # the data every earlier row trained on
DATA=${DATA:-$FINEWEB}
G=$(python -c "from hallamonic.loading import smollm2_gguf_path as p; print(p())")
export OMP_NUM_THREADS=2
if [ ! -f "$OUT/model.safetensors" ]; then
  mkdir -p "$OUT/training/checkpoints"
  if [ "$DATA" = "$FINEWEB" ]; then cp "$SRC/training/tokens.npy" "$OUT/training/"; fi
  [ -d "$OUT/training/checkpoints/phase1" ] || cp -r "$SRC/training/checkpoints/phase1" "$OUT/training/checkpoints/"
  if [ "${RESTORE_FOCUS:-1}" = 1 ] && [ -d "$SRC/training/checkpoints/phase1-focus" ] && [ ! -d "$OUT/training/checkpoints/phase1-focus" ]; then
    cp -r "$SRC/training/checkpoints/phase1-focus" "$OUT/training/checkpoints/"  # a run with the focus: restored too
  fi
  if [ "${RESTORE_PHASE2:-0}" = 1 ] && [ ! -d "$OUT/training/checkpoints/phase2" ]; then
    cp -r "$SRC/training/checkpoints/phase2" "$OUT/training/checkpoints/"
  fi
  hallamonic convert smollm2-135m -o "$OUT" --resume --phases "$PHASES" \
    --set base.model="$G" --set data.path="$DATA" "$@"
fi
mkdir -p "$RES"
cp "$OUT"/training/{report.json,recipe.yaml} "$RES/"
[ -f "$OUT/training/metrics.jsonl" ] && cp "$OUT/training/metrics.jsonl" "$RES/"  # none when phase2.steps=0
EV="hallamonic eval $OUT --threads 2 --no-progress --name $NAME"
$EV --task lambada --data ../shared/data/lambada_openai_dev1000.jsonl --limit 300 --output-dir $RES/lambada
$EV --task context --data ../shared/data/fineweb_edu_head_heldout.txt --context-lengths 1024 --output-dir $RES/context
