#!/usr/bin/env bash
# GPU check of the Triton scan kernel, for a bare CUDA machine whose python3 has torch + triton
# (the package itself need not be installed; typer need not be there). Run from the repo root:
#
#     OUT=/some/dir bash benchmarks/gpu_check.sh        # ~2-3 minutes on an H200
#
# Stages, each under its own timeout so a hang (e.g. a look-back deadlock) cannot eat the rest:
#   1. smoke: compiled kernel vs the reference loop on small odd shapes (fwd + all grads)
#   2. bandwidth table: (8,4096,2048) and (1,65536,2048), fp32 and bf16, vs a device copy
#   3. full correctness: long sequences (~1000 chunks of look-back) vs the torch backend
#   4. tile-config sweep (CHUNK, BLOCK_D, num_warps) on the same shapes
#   5. the fused selective-scan kernel vs its chunked PyTorch twin (outputs, grads, fwd+bwd time)
#   6. the CPU test file (Triton interpreter) under this machine's triton version
# Everything is logged to $OUT/gpu_check.log; JSON results to $OUT/*.json.
set -u
OUT=${OUT:-benchmarks/gpu_results/out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
exec > >(tee "$OUT/gpu_check.log") 2>&1

PY=${PYTHON:-python3}
# Run hallamonic.bench.scan without executing the package __init__ files: they import the
# Hugging Face model code (transformers), which this check does not need and whose version on the
# machine may differ. Empty package stubs with the right __path__ stand in for them.
BENCH=(-c 'import runpy, sys, types
for name, path in (("hallamonic", "hallamonic"), ("hallamonic.modeling", "hallamonic/modeling")):
    mod = types.ModuleType(name); mod.__path__ = [path]; sys.modules[name] = mod
sys.argv[0] = "hallamonic.bench.scan"
runpy.run_module("hallamonic.bench.scan", run_name="__main__", alter_sys=True)')
SWEEP=${SWEEP:-"64,64,4;128,64,8;64,128,8;32,128,4;128,32,4;64,32,2"}
echo "== $(date -u +%FT%TZ)  $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
nvidia-smi -L || true
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

stage() {  # stage NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  echo; echo "== stage $name (timeout ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@"; local rc=$?
  echo "== stage $name rc=$rc in $((SECONDS - t0))s"
  return $rc
}

stage smoke 75 $PY "${BENCH[@]}" --device cuda --check-only --cases 5 --json "$OUT/check_small.json" \
  || { echo "smoke check failed: stopping"; exit 1; }
stage bench 60 $PY "${BENCH[@]}" --device cuda --json "$OUT/bench.json"
stage check 60 $PY "${BENCH[@]}" --device cuda --check-only --json "$OUT/check_full.json"
stage sweep 90 $PY "${BENCH[@]}" --device cuda --sweep "$SWEEP" --json "$OUT/sweep.json"
stage selective 200 $PY -c 'import runpy, sys, types
for name, path in (("hallamonic", "hallamonic"), ("hallamonic.modeling", "hallamonic/modeling"), ("hallamonic.bench", "hallamonic/bench")):
    mod = types.ModuleType(name); mod.__path__ = [path]; sys.modules[name] = mod
sys.argv[0] = "hallamonic.bench.selective"
runpy.run_module("hallamonic.bench.selective", run_name="__main__", alter_sys=True)' --json "$OUT/selective.json"
if (( SECONDS < 200 )); then stage pytest 45 $PY -m pytest -q -p no:cacheprovider tests/modeling/test_scan.py; fi
echo "== done in ${SECONDS}s"
