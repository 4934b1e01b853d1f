#!/usr/bin/env bash
# The bundled recipe plus a phase1-focus on layers 20-24, from the SAME end-of-phase-1 checkpoint as
# the phase-2 sweep rows (outputs/smollm2-n64 from evals/smollm2_selective.sh; SRC= another run): the product pipeline
# restores phase 1, runs phase1-focus (FOCUS_STEPS, default 400, on layers 20-24, 48 pooled
# sequences) and the recipe's phase 2, then LAMBADA and held-out bits at 1K as in the sweep.
# Usage: bash evals/results/smollm2-135m-layer-swap/focus_run.sh NAME [--set KEY=VALUE ...]
set -euo pipefail
NAME=$1; shift
RESTORE_FOCUS=0 PHASES=phase1,phase2 OUT=outputs/$NAME RES=evals/results/smollm2-135m-layer-swap/$NAME \
  exec bash evals/results/smollm2-135m-phase2-sweep/run.sh "$NAME" \
  --set phase1.focus_steps="${FOCUS_STEPS:-400}" --set 'phase1.focus_layers=[20, 21, 22, 23, 24]' "$@"
