#!/usr/bin/env bash
# The level inputs' initial gain (LevelInputNorm), harmonic (three levels) and harmonic-two-level,
# contexts 1K / 2K, seeds 0-2, ~50-60 s a run. Gain 1.2 is the model's default here
# (initializer_range 0.1 * sqrt(144)); 0.39 is the first level's expected input RMS on Mamba's value
# path (u = silu(conv(v)), ~1/3 of v's; measured 0.38-0.41, the three-level runs used 0.4); 0.13 a
# third of that.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"; . .venv/bin/activate; export OMP_NUM_THREADS=2
HERE=evals/results/study-enwik8-cpu-level-gain
for MODEL in harmonic harmonic-two-level; do for S in 0 1 2; do for C in 1024 2048; do
  for G in $([ $MODEL = harmonic ] && echo 0.4 0.13 || echo 0.39 0.13); do
  O=outputs/level-gain/$MODEL-g$G-$C-s$S
  [ -f $O/results.json ] || LEVEL_GAIN=$G python $HERE/level_gain_study.py study study-enwik8-cpu -o $O --set seed=$S \
    --set "models=[$MODEL]" --set "contexts=[$C]" --set train.save_weights=false > $O.log 2>&1 || echo FAIL $O
done; done; done; done
