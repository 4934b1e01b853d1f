#!/usr/bin/env bash
# Two-level band layouts of the study's harmonic row (MLP 342, not refitted), contexts 1K / 2K, seeds 0-2.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"; . .venv/bin/activate; export OMP_NUM_THREADS=2
for S in 0 1 2; do for C in 1024 2048; do
  R=$(python3 -c "print(round($C**0.5, 2))")
  for V in banded shared overlap; do
    case $V in
      banded) B="[[1,$R],[$R,$C]]";; shared) B="[[1,$C],[1,$C]]";; overlap) B="[[1,$R],[1,$C]]";;
    esac
    O=outputs/bands/$V-$C-s$S
    [ -f $O/results.json ] || hallamonic study study-enwik8-cpu -o $O --set seed=$S --set 'models=[harmonic]' \
      --set "contexts=[$C]" --set "model.timescale_bands=$B" --set train.save_weights=false > $O.log 2>&1 || echo FAIL $O
    python3 -c "import json; m=json.load(open('$O/results.json'))['models']['harmonic']; print('$V $C $S', m['valid_bits']['$C'], m['bits']['$C'])"
  done
done; done
