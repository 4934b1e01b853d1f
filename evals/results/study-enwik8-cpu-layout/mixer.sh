#!/usr/bin/env bash
# Mamba's mixer in Harmonic's Llama layout (transformers' MambaMixer, expand 2, N 16, MLP 207 for the
# study's count; ../study-enwik8-cpu-gap section 1) at each CONTEXT x SEED: ~4-5 min a run on 2 cores.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"; . .venv/bin/activate; export OMP_NUM_THREADS=2
S=evals/results/study-enwik8-cpu-selective/sweep.py
for C in ${CONTEXTS:-1024 2048}; do for SEED in ${SEEDS:-0 1 2}; do
  MAMBA_MIXER=1 python3 $S mamba-mixer-in-llama-$C-s$SEED '{}' "{\"model.intermediate_size\": 207, \"seed\": $SEED}" $C \
    2> outputs/mixer-$C-s$SEED.log | tail -1 || echo "FAIL $C $SEED"
done; done
