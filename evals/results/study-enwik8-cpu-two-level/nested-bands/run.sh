#!/usr/bin/env bash
# Nested timescale bands (every level's band starts at 1 token; level l ends at C^(l/L)) for the study's
# harmonic row: two levels with the MLP fitted to Harmonic's count (367), three levels (MLP 342).
# Contexts and seeds from the environment (default 1K / 2K, seeds 0-2); ~45 s a run on 2 cores.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"; . .venv/bin/activate; export OMP_NUM_THREADS=2
for S in ${SEEDS:-0 1 2}; do for C in ${CONTEXTS:-1024 2048}; do
  R2=$(python3 -c "print(round($C**0.5, 2))"); R3=$(python3 -c "print(round($C**(1/3), 2))"); R33=$(python3 -c "print(round($C**(2/3), 2))")
  for V in ${VARIANTS:-two-nested three-nested}; do
    case $V in
      two-nested) B="[[1,$R2],[1,$C]]"; W=367;; three-nested) B="[[1,$R3],[1,$R33],[1,$C]]"; W=342;;
    esac
    O=outputs/nested/$V-$C-s$S; mkdir -p outputs/nested
    [ -f $O/results.json ] || hallamonic study study-enwik8-cpu -o $O --set seed=$S --set 'models=[harmonic]' \
      --set "contexts=[$C]" --set "model.timescale_bands=$B" --set model.intermediate_size=$W \
      --set train.save_weights=false > $O.log 2>&1 || echo FAIL $O
    python3 -c "import json; r=json.load(open('$O/results.json')); m=r['models']['harmonic']; print('$V $C $S', m['params'], m['valid_bits']['$C'], m['bits']['$C'])"
  done
done; done
