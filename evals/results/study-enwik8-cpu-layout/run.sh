#!/usr/bin/env bash
# Harmonic in Mamba's layout (probe.py), each VARIANT x CONTEXT x SEED from the environment.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"; . .venv/bin/activate; export OMP_NUM_THREADS=2
for S in ${SEEDS:-0}; do for C in ${CONTEXTS:-256}; do for V in ${VARIANTS:-mamba-layout}; do
  python3 evals/results/study-enwik8-cpu-layout/probe.py "$V" "$C" "$S" 2> "outputs/layout-${V//,/_}-$C-$S.log" | tail -1 || echo "FAIL $V $C $S"
done; done; done
