#!/usr/bin/env bash
# The study's GPU checks, for a bare CUDA machine (python3 with torch, transformers, accelerate,
# typer, matplotlib; the package itself need not be installed). Run from the repo root:
#
#     OUT=/some/dir bash benchmarks/study_gpu.sh      # a few minutes on an H200 (estimate)
#
# 1. memory wall of the 28M models: peak memory of one bf16 training step at 1K -> 256K bytes
#    (hallamonic study study-enwik8-28m --memory); OOM is recorded, not fatal.
# 2. a throughput sample of every architecture at 1K and 16K (16 steps each), to turn the cost
#    estimate in recipes/study/study-enwik8-28m.yaml into a measured one.
# transformers' Mamba needs the `mambapy` wheel for its parallel scan; carry it when the machine
# has no registry:  pip download mambapy --no-deps -d .gpu-wheels   (and carry .gpu-wheels).
set -u
OUT=${OUT:-benchmarks/gpu_results/study}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec > >(tee "$OUT/study_gpu.log") 2>&1
PY=${PYTHON:-python3}
if ls .gpu-wheels/*.whl >/dev/null 2>&1; then $PY -m pip install -q --no-index --user .gpu-wheels/*.whl || true; fi
echo "== $(date -u +%FT%TZ)  $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

timeout 300 $PY -m hallamonic.cli study study-enwik8-28m --memory -o "$OUT/28m"
for ctx in 1024 16384; do
  timeout 240 $PY -m hallamonic.cli study study-enwik8-28m -o "$OUT/28m-sample-$ctx" --overwrite \
    --set "contexts=[$ctx]" --set train.tokens=1048576 --set train.warmup_steps=2 \
    --set eval.tokens=65536 --set train.save_weights=false --set train.checkpoint_every=0
done
echo "== done in ${SECONDS}s"
