#!/usr/bin/env bash
# Controlled check of where the fixed run's bits gain comes from: phase 2 rerun from the fixed run's
# own phase-1 and focus checkpoints (outputs/smollm2-fixed: same seed, same data order) with the
# compiled blocks' backward traced under autocast again (torch's default, the setting before the
# 2026-12-05 fix: eager_backward_precision replaced by a no-op in this process), against the fixed
# run's own phase-2 checkpoint; both to be exported before the refit (phase2.refit_steps=0).
# Usage: bash evals/results/smollm2-135m-hallamonic-fixed/phase2-bf16-backward/run.sh
set -euo pipefail
SRC=outputs/smollm2-fixed
RES=evals/results/smollm2-135m-hallamonic-fixed/phase2-bf16-backward
G=$(python -c "from hallamonic.loading import smollm2_gguf_path as p; print(p())")
export OMP_NUM_THREADS=2
SETS=(--set base.model="$G" --set data.path=../shared/data/fineweb_train.jsonl
      --set phase2_data.path=../shared/data/fineweb_edu_head_train.txt --set phase2.refit_steps=0)
prepare() {  # OUT, phases whose checkpoints are copied
  mkdir -p "$1/training/checkpoints"
  cp "$SRC"/training/tokens{,-phase2}.{npy,json} "$1/training/"
  for phase in "${@:2}"; do cp -r "$SRC/training/checkpoints/$phase" "$1/training/checkpoints/"; done
}
A=outputs/smollm2-fixed-p2-bf16-backward  # phase 2 retrained with torch's default backward setting
if [ ! -f "$A/model.safetensors" ]; then
  prepare "$A" phase1 phase1-focus
  python -c "import contextlib, sys; import hallamonic.convert.phases as P; P.eager_backward_precision = contextlib.nullcontext; \
from hallamonic.cli import main; sys.argv = ['hallamonic'] + sys.argv[1:]; main()" \
    convert smollm2-135m -o "$A" --resume --phases phase2 "${SETS[@]}"
fi
# Measured 2026-12-05: phase 2 stopped at its first step with NaN (run.log), so the comparison
# against the fixed run's own phase 2 (prepare with phase2 too, convert, eval) was not run.
