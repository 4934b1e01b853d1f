#!/usr/bin/env bash
# The study's GPU checks (issue 11), for a bare CUDA machine (python3 with torch, triton,
# transformers >= 5.24, accelerate, typer, matplotlib, mambapy; the package need not be installed).
# From the repo root:
#
#     OUT=/some/dir DATA=/path/shared/data bash benchmarks/study_gpu.sh     # ~9 minutes on an H200 (STAGES splits it)
#
# 1. the fused Triton selective scan against its chunked PyTorch twin (outputs, every gradient,
#    fwd+bwd time) -- "auto" uses it on CUDA for N <= 32 since it passed on an H200;
# 2. quality at the protocol: study-enwik8-28m with 1,048,576 training bytes, 8,192 bytes
#    per optimizer step, harmonic, harmonic-one-level, transformer and mamba at 1K, then at 8K;
#    results.json carries each run's training bytes/s too;
# 3. one bf16 training step at 1K, 64K and 128K bytes, harmonic vs transformer: peak memory and
#    warm-step tokens/s (the memory and speed targets), as the recipe says and with
#    model.recompute_mixer (each block recomputed in backward).
# Each stage has its own timeout; a stage that fails does not stop the next. STAGES picks stages
# (default "selective quality memory"); TAG names the memory results (memory-$TAG-*.json);
# MODELS the quality stage's models (default harmonic,harmonic-one-level,transformer,mamba; add
# mamba-llama-layout, Mamba's mixer in Harmonic's layout, with Q1K_S / Q8K_S raising the stage timeouts).
# CPU smoke test of the script itself: SMOKE=1 OUT=/tmp/sg bash benchmarks/study_gpu.sh
set -u
OUT=${OUT:-benchmarks/gpu_results/study}
DATA=${DATA:-../shared/data}
SCRATCH=${SCRATCH:-/tmp/study_gpu}  # the study folders: $OUT keeps only <= 8 small files
mkdir -p "$OUT" "$SCRATCH"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec > >(tee "$OUT/study_gpu.log") 2>&1
PY=${PYTHON:-python3}
echo "== $(date -u +%FT%TZ)  $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"

stage() {  # stage NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  echo; echo "== stage $name (timeout ${limit}s, at ${SECONDS}s)"
  timeout "$limit" "$@"; local rc=$?
  echo "== stage $name rc=$rc, done at ${SECONDS}s"
}

RECIPE=study-enwik8-28m
SETS=(--set data.path="$DATA/enwik8_prefix.xml" --set train.tokens=1048576 --set train.batch_tokens=8192
      --set train.warmup_steps=12 --set eval.tokens=65536 --set train.save_weights=false --set train.checkpoint_every=0)
MEM_SETS=(--set data.path="$DATA/enwik8_prefix.xml" --set "models=[harmonic,transformer]" --set "memory.lengths=[1024,65536,131072]")
LONG_CTX=8192
STAGES=${STAGES:-selective quality memory}
TAG=${TAG:-auto}
has() { [[ " $STAGES " == *" $1 "* ]]; }
if [ -n "${SMOKE:-}" ]; then  # tiny shapes on CPU: checks the command lines, not the numbers
  RECIPE=study-ci; LONG_CTX=128
  SETS=(--set data.path="$DATA/enwik8_prefix.xml" --set train.tokens=4096 --set train.batch_tokens=256 --set train.warmup_steps=2
        --set eval.tokens=1024 --set train.save_weights=false --set train.checkpoint_every=0)
  MEM_SETS=(--set data.path="$DATA/enwik8_prefix.xml" --set "models=[harmonic,transformer]" --set "memory.lengths=[256,512]")
elif has selective; then
  stage selective 180 $PY -m hallamonic.bench.selective --json "$OUT/selective.json"
fi
H="$PY -m hallamonic.cli study $RECIPE"
if has quality; then
MODELS=${MODELS:-harmonic,harmonic-one-level,transformer,mamba}
stage quality-1k "${Q1K_S:-150}" $H -o "$SCRATCH/quality" --overwrite "${SETS[@]}" --set "contexts=[$((LONG_CTX / 8))]" \
  --set "models=[$MODELS]"
stage quality-8k "${Q8K_S:-240}" $H -o "$SCRATCH/quality" --resume "${SETS[@]}" --set "contexts=[$((LONG_CTX / 8)),$LONG_CTX]" \
  --set "models=[$MODELS]"
cp "$SCRATCH/quality/results.json" "$OUT/quality.json" 2>/dev/null; cp "$SCRATCH/quality/results.md" "$OUT/quality.md" 2>/dev/null
tar czf "$OUT/quality-runs.tgz" -C "$SCRATCH" quality 2>/dev/null  # every run's result.json and curve, also when a stage timed out
fi
if has memory; then  # as the recipe says, then with each block recomputed in backward (recompute_mixer)
for variant in default recompute; do
  extra=(); [ $variant = recompute ] && extra=(--set model.recompute_mixer=true)
  stage memory-$variant 90 $H --memory -o "$SCRATCH/memory-$TAG-$variant" --overwrite "${MEM_SETS[@]}" "${extra[@]}"
  cp "$SCRATCH/memory-$TAG-$variant/memory/memory.json" "$OUT/memory-$TAG-$variant.json" 2>/dev/null
done
fi
echo "== done in ${SECONDS}s"
