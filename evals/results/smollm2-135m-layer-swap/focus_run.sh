#!/usr/bin/env bash
# The bundled recipe plus a phase1-focus on layers 20-24, from the SAME end-of-phase-1 checkpoint as
# the phase-2 sweep rows (outputs/smollm2-n64 from evals/smollm2_selective.sh): phase 1 is restored,
# then phase1-focus (FOCUS_STEPS steps on layers 20-24, 48 pooled sequences) and the recipe's phase 2
# run through the product pipeline, then LAMBADA and held-out bits at 1K as in the sweep.
# Usage: bash evals/results/smollm2-135m-layer-swap/focus_run.sh NAME [--set KEY=VALUE ...]
set -euo pipefail
NAME=$1; shift
SRC=${SRC:-outputs/smollm2-n64}
OUT=outputs/$NAME
RES=evals/results/smollm2-135m-layer-swap/$NAME
G=$(python -c "from hallamonic.loading import smollm2_gguf_path as p; print(p())")
export OMP_NUM_THREADS=2
if [ ! -f "$OUT/model.safetensors" ]; then
  mkdir -p "$OUT/training/checkpoints"
  cp "$SRC/training/tokens.npy" "$OUT/training/"
  [ -d "$OUT/training/checkpoints/phase1" ] || cp -r "$SRC/training/checkpoints/phase1" "$OUT/training/checkpoints/"
  hallamonic convert smollm2-135m -o "$OUT" --resume \
    --set base.model="$G" --set data.path=../shared/data/fineweb_train.jsonl \
    --set phase1.focus_steps=${FOCUS_STEPS:-400} --set 'phase1.focus_layers=[20, 21, 22, 23, 24]' "$@"
fi
mkdir -p "$RES"
cp "$OUT"/training/{report.json,recipe.yaml,metrics.jsonl} "$RES/"
EV="hallamonic eval $OUT --threads 2 --no-progress --name $NAME"
$EV --task lambada --data ../shared/data/lambada_openai_dev1000.jsonl --limit 300 --output-dir $RES/lambada
$EV --task context --data ../shared/data/fineweb_edu_head_heldout.txt --context-lengths 1024 --output-dir $RES/context
