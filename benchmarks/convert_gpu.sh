#!/usr/bin/env bash
# The conversion's GPU checks (issue 12), for a bare CUDA machine (python3 with torch, transformers
# >= 5.24, accelerate, typer, safetensors, peft, matplotlib, gguf; the package need not be installed).
# From the repo root:
#
#     OUT=/some/dir GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf DATA=/path/shared/data bash benchmarks/convert_gpu.sh
#
# Stage "rates": phase-1 / focus / phase-2 / refit tokens/s (`hallamonic bench convert`, the
#   pipeline's own phase runners on random tokens) for a random teacher with TinyLlama's shapes under
#   the tinyllama-1.1b recipe, and for SmolLM2's shapes under the smollm2-135m recipe at GPU batch
#   sizes. The tinyllama-1.1b recipe's header states its cost from these rates.
# Stage "run": the smollm2-135m recipe with the real GGUF teacher at GPU batch sizes, each phase's
#   step count set from the measured rates so that it takes about P1_S / FOCUS_S / P2_S / REFIT_S
#   seconds (the token multiple over the CPU recipe is printed), then the headline evaluations
#   (LAMBADA 300, held-out bits at 1K/4K/16K, passkey 10 trials at 1K/2K/4K).
# Stage "compile" (not in the default): stage rates' SmolLM2 row again with torch.compile on.
# STAGES picks stages (default "rates run"); the rates are kept in $SCRATCH, so the two stages can
# run in separate calls to one warm machine; RATES=FILE (e.g. the committed
# evals/results/smollm2-135m-hallamonic-h200/rates-smollm2.json) lets stage run go without them. torch.compile is off on the GPU (its compile time would
# eat a short window; the CPU recipe's compile: true is for 2-core CPUs). SETS (a string of extra
# --set KEY=VALUE) applies to the SmolLM2 rates and run, e.g. the block variant being tested.
# The GGUF is ~98 MB and a device call carries <= 64 MiB: send it in parts to a warm machine
# (split -b 40M; cat parts > file). CPU smoke test of the script itself:
#     SMOKE=1 OUT=/tmp/cg bash benchmarks/convert_gpu.sh      (tiny recipe, builtin teacher)
set -u
OUT=${OUT:-benchmarks/gpu_results/convert}
DATA=${DATA:-../shared/data}
SCRATCH=${SCRATCH:-/tmp/convert_gpu}  # the model, rates and eval folders: $OUT keeps only <= 8 small files
STAGES=${STAGES:-rates run}
P1_S=${P1_S:-100}; FOCUS_S=${FOCUS_S:-40}; P2_S=${P2_S:-100}; REFIT_S=${REFIT_S:-40}
P1_BATCH=${P1_BATCH:-16}   # sequences of 512 tokens per phase-1 / focus / refit step
P2_BATCH=${P2_BATCH:-8}    # sequences of 1,024 tokens per phase-2 step
POOL=${POOL:-1536}         # sequences the focus and the refit cycle over (CPU recipe: 192 at batch 4)
SETS=${SETS:-}
P2_DATA=${P2_DATA-$DATA/fineweb_edu_head_train.txt}  # phase 2's text (the recipe's offline pairing); empty: fineweb_train.jsonl as phase 1
mkdir -p "$OUT" "$SCRATCH"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec > >(tee "$OUT/convert_gpu.log") 2>&1
PY=${PYTHON:-python3}
H="$PY -m hallamonic.cli"
echo "== $(date -u +%FT%TZ)  $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)  stages: $STAGES"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"
stage() {  # stage NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  echo; echo "== $name (timeout ${limit}s, at ${SECONDS}s)"
  timeout "$limit" "$@"; local rc=$?
  echo "== $name rc=$rc, done at ${SECONDS}s"
}

read -r -a EXTRA <<<"$(set -f; for s in $SETS; do printf -- '--set %s ' "$s"; done)"
GPU_SETS=(--set phase1.batch_size=$P1_BATCH --set phase2.batch_size=$P2_BATCH --set phase1.compile=false
          --set phase2.compile=false --set phase1.focus_pool=$POOL --set phase2.refit_pool=$POOL "${EXTRA[@]}")
RECIPE=smollm2-135m
if [ -n "${SMOKE:-}" ]; then  # CPU check of the script: tiny recipe, builtin teacher, a few seconds per phase
  RECIPE=tiny; GPU_SETS=(--set phase1.seq_len=64 --set phase2.seq_len=64 --set phase1.batch_size=2 --set phase2.batch_size=1 "${EXTRA[@]}")
fi

if [[ " $STAGES " == *" rates "* ]]; then
  if [ -z "${SMOKE:-}" ]; then  # random weights measure throughput as well as real ones
    stage rates-tinyllama 200 $H bench convert tinyllama-1.1b --teacher-shape tinyllama-1.1b --steps 3 --json "$SCRATCH/rates-tinyllama.json"
    stage rates-smollm2 150 $H bench convert smollm2-135m --teacher-shape smollm2-135m --steps 4 "${GPU_SETS[@]}" --json "$SCRATCH/rates-smollm2.json"
  else
    stage rates-smoke 300 $H bench convert tiny --steps 2 "${GPU_SETS[@]}" --json "$SCRATCH/rates-smollm2.json"
  fi
  cp "$SCRATCH"/rates-*.json "$OUT/" 2>/dev/null
fi

if [[ " $STAGES " == *" compile "* ]] && [ -z "${SMOKE:-}" ]; then  # the same SmolLM2 rates with torch.compile on (compile time left out)
  COMPILED=("${GPU_SETS[@]}" --set phase1.compile=true --set phase2.compile=true)
  stage rates-smollm2-compiled 300 $H bench convert smollm2-135m --teacher-shape smollm2-135m --steps 4 "${COMPILED[@]}" \
    --json "$SCRATCH/rates-smollm2-compiled.json"
  cp "$SCRATCH"/rates-smollm2-compiled.json "$OUT/" 2>/dev/null
fi

if [[ " $STAGES " == *" run "* ]]; then
  if [ -z "${GGUF:-}" ] && [ -z "${SMOKE:-}" ]; then echo "== GGUF not set: stage run skipped"; echo "== done in ${SECONDS}s"; exit 0; fi
  if [ -n "${RATES:-}" ]; then cp "$RATES" "$SCRATCH/rates-smollm2.json" || exit 2; fi  # rates measured before (saves the stage)
  [ -f "$SCRATCH/rates-smollm2.json" ] || { echo "== no $SCRATCH/rates-smollm2.json: run stage rates first, or set RATES"; exit 2; }
  # each phase's steps from its measured rate and its seconds (phases the recipe skips stay at 0)
  STEPS=$($PY - "$SCRATCH/rates-smollm2.json" "$RECIPE" "$P1_S" "$FOCUS_S" "$P2_S" "$REFIT_S" <<'EOF'
import json, sys
from hallamonic.convert.recipe import load_recipe
rows = {r["phase"]: r for r in json.load(open(sys.argv[1]))["phases"]}
cpu = load_recipe(sys.argv[2])  # the bundled recipe as it runs on CPU: the token multiples' reference
p1, p2, accum = cpu.phase1, cpu.phase2, cpu.train.grad_accum
cpu_tokens = {"phase1": p1.steps * p1.batch_size * accum * p1.seq_len, "phase1-focus": p1.focus_steps * p1.batch_size * accum * p1.seq_len,
              "phase2": p2.steps * p2.batch_size * accum * p2.seq_len, "phase2-refit": p2.refit_steps * p1.batch_size * accum * p1.seq_len}
keys = {"phase1": "phase1.steps", "phase1-focus": "phase1.focus_steps", "phase2": "phase2.steps", "phase2-refit": "phase2.refit_steps"}
for (phase, key), seconds in zip(keys.items(), sys.argv[3:]):
    if phase in rows:
        r = rows[phase]
        steps = max(1, int(float(seconds) * r["tokens_per_s"] / r["tokens_per_step"]))
        tokens = steps * r["tokens_per_step"]
        print(f"--set {key}={steps}", end=" ")
        print(f"{phase}: {steps} steps x {r['tokens_per_step']:,} tokens = {tokens:,} "
              f"({tokens / cpu_tokens[phase]:.1f}x the CPU recipe's {cpu_tokens[phase]:,})", file=sys.stderr)
EOF
)
  read -r -a STEP_SETS <<<"$STEPS"
  MODEL="$SCRATCH/model"
  if [ -n "${SMOKE:-}" ]; then
    SRC=(--set eval.max_windows=1 --set "eval.context_lengths=[64]")
  else
    SRC=(--set base.model="$GGUF" --set data.path="$DATA/fineweb_train.jsonl" --set phase2_data.path="$P2_DATA"
         --set checkpoint.every=0)
  fi
  stage convert $((P1_S + FOCUS_S + P2_S + REFIT_S + 240)) $H convert $RECIPE -o "$MODEL" --overwrite "${GPU_SETS[@]}" "${STEP_SETS[@]}" "${SRC[@]}"
  cp "$MODEL/README.md" "$OUT/MODEL_CARD.md" 2>/dev/null; cp "$MODEL/training/report.json" "$OUT/" 2>/dev/null
  EV="$H eval $MODEL --no-progress --name converted-gpu"
  keep() { [ -f "$SCRATCH/$1/results.json" ] && cp "$SCRATCH/$1/results.json" "$OUT/$1.json"; }  # at once: a later stage may time out
  if [ -n "${SMOKE:-}" ]; then
    stage passkey 120 $EV --task passkey --context-lengths 256 --trials 2 --output-dir "$SCRATCH/passkey"; keep passkey
  else
    EV="$EV --device cuda"
    stage lambada 90 $EV --task lambada --data "$DATA/lambada_openai_dev1000.jsonl" --limit 300 --output-dir "$SCRATCH/lambada"; keep lambada
    stage context 120 $EV --task context --data "$DATA/fineweb_edu_head_heldout.txt" --context-lengths 1024,4096,16384 --output-dir "$SCRATCH/context"; keep context
    stage passkey 90 $EV --task passkey --context-lengths 1K,2K,4K --trials 10 --output-dir "$SCRATCH/passkey"; keep passkey
  fi
fi
echo "== done in ${SECONDS}s"
