#!/usr/bin/env bash
# The conversion's GPU checks (issue 12), for a bare CUDA machine (python3 with torch, transformers,
# accelerate, typer, safetensors, peft, matplotlib; the package need not be installed). From the repo root:
#
#     OUT=/some/dir GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf DATA=/path/shared/data bash benchmarks/convert_gpu.sh
#
# 1. Phase-1 / phase-2 tokens/s (`hallamonic bench convert`, the pipeline's own code on random
#    tokens) for a random teacher with TinyLlama's shapes under the tinyllama-1.1b recipe, and for
#    SmolLM2's shapes under the smollm2-135m recipe at GPU batch sizes. The tinyllama-1.1b recipe's
#    header then states its cost from these rates.
# 2. The smollm2-135m recipe with the real GGUF teacher at GPU batch sizes, its step counts set so
#    each phase takes about P1_S / P2_S seconds at the rates measured in 1 (>= 20x the CPU recipe's
#    420K tokens at the H200 rates expected), then the headline evaluations.
# FEATURE_MAP, when set, overrides harmonic.feature_map for the SmolLM2 rates and run (unset: the
# bundled recipe as is -- identity features, Hedgehog in its hedgehog_layers).
# The GGUF is ~98 MB and a device call carries <= 64 MiB: send it in two parts to a warm machine
# (split -b 60M; cat parts > file). Without GGUF, part 2 is skipped. CPU smoke test of the
# script itself: SMOKE=1 OUT=/tmp/cg bash benchmarks/convert_gpu.sh (tiny recipe, builtin teacher).
set -u
OUT=${OUT:-benchmarks/gpu_results/convert}
DATA=${DATA:-../shared/data}
P1_S=${P1_S:-150}
P2_S=${P2_S:-150}
P1_BATCH=${P1_BATCH:-16}   # sequences of 512 tokens per phase-1 step
P2_BATCH=${P2_BATCH:-8}    # sequences of 1,024 tokens per phase-2 step
FEATURE_MAP=${FEATURE_MAP:-}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec > >(tee "$OUT/convert_gpu.log") 2>&1
PY=${PYTHON:-python3}
H="$PY -m hallamonic.cli"
if ls .gpu-wheels/*.whl >/dev/null 2>&1; then $PY -m pip install -q --no-index --user .gpu-wheels/*.whl || true; fi
echo "== $(date -u +%FT%TZ)  $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"

GPU_SETS=(--set phase1.batch_size=$P1_BATCH --set phase2.batch_size=$P2_BATCH ${FEATURE_MAP:+--set harmonic.feature_map=$FEATURE_MAP})
if [ -n "${SMOKE:-}" ]; then  # CPU check of the script: tiny recipe, builtin teacher, a few seconds per phase
  RECIPE=tiny; GPU_SETS=(--set phase1.seq_len=64 --set phase2.seq_len=64 --set phase1.batch_size=2 --set phase2.batch_size=1 ${FEATURE_MAP:+--set harmonic.feature_map=$FEATURE_MAP})
  timeout 300 $H bench convert tiny --steps 2 "${GPU_SETS[@]}" --json "$OUT/rates-smollm2.json"
else
  RECIPE=smollm2-135m
  # 1. throughput (random weights measure throughput as well as real ones)
  timeout 300 $H bench convert tinyllama-1.1b --teacher-shape tinyllama-1.1b --steps 4 --json "$OUT/rates-tinyllama.json"
  timeout 240 $H bench convert smollm2-135m --teacher-shape smollm2-135m --steps 4 "${GPU_SETS[@]}" --json "$OUT/rates-smollm2.json"
fi

# 2. the smollm2-135m recipe (or tiny, SMOKE) with step counts from the measured rates
if [ -z "${GGUF:-}" ] && [ -z "${SMOKE:-}" ]; then echo "== GGUF not set: part 2 skipped"; echo "== done in ${SECONDS}s"; exit 0; fi
read -r S1 S2 <<<"$($PY - "$OUT/rates-smollm2.json" "$P1_S" "$P2_S" <<'EOF'
import json, sys
rows = {r["phase"]: r for r in json.load(open(sys.argv[1]))["phases"]}
print(*(max(1, int(float(t) * rows[p]["tokens_per_s"] / rows[p]["tokens_per_step"])) for p, t in zip(("phase1", "phase2"), sys.argv[2:])))
EOF
)"
echo "== $RECIPE: phase1 $S1 steps, phase2 $S2 steps"
SCRATCH=${SCRATCH:-/tmp/convert_gpu}  # the model and the eval folders: $OUT keeps only <= 8 small files
MODEL="$SCRATCH/model"
if [ -n "${SMOKE:-}" ]; then
  SRC=(--set phase1.steps=$S1 --set phase2.steps=$S2 --set eval.max_windows=1 --set "eval.context_lengths=[64]")
else
  SRC=(--set base.model="$GGUF" --set data.path="$DATA/fineweb_train.jsonl" --set phase1.steps=$S1 --set phase2.steps=$S2
       --set phase1.warmup_steps=$((S1 / 10 + 1)) --set phase2.warmup_steps=$((S2 / 10 + 1)) --set checkpoint.every=0)
fi
timeout $((P1_S + P2_S + 240)) $H convert $RECIPE -o "$MODEL" --overwrite "${GPU_SETS[@]}" "${SRC[@]}"
cp "$MODEL/README.md" "$OUT/MODEL_CARD.md" 2>/dev/null; cp "$MODEL/training/report.json" "$OUT/" 2>/dev/null
EV="$H eval $MODEL --no-progress --name converted-gpu"
if [ -n "${SMOKE:-}" ]; then
  timeout 120 $EV --task passkey --context-lengths 256 --trials 2 --output-dir "$SCRATCH/passkey"
else
  timeout 120 $EV --task lambada --data "$DATA/lambada_openai_dev1000.jsonl" --limit 300 --output-dir "$SCRATCH/lambada"
  timeout 120 $EV --task context --data "$DATA/fineweb_edu_head_heldout.txt" --context-lengths 1024,4096,16384 --output-dir "$SCRATCH/context"
  timeout 120 $EV --task passkey --context-lengths 1K,2K,4K --trials 10 --output-dir "$SCRATCH/passkey"
fi
for t in lambada context passkey; do [ -f "$SCRATCH/$t/results.json" ] && cp "$SCRATCH/$t/results.json" "$OUT/$t.json"; done
echo "== done in ${SECONDS}s"
