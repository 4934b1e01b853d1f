#!/usr/bin/env bash
# SmolLM2-135M -> Hallamonic with the expanded, selective state (state_size = head_dim = 64, write/read
# maps from k_proj/q_proj): conversion on 2 CPU cores with the bundled recipe, then the headline
# evaluations on the shared data. Usage: bash evals/smollm2_selective.sh [OUT] [RESULTS] [--set KEY=VALUE ...]
# (defaults outputs/smollm2-n64, evals/results/smollm2-135m-hallamonic-selective). Runs so far:
#   selective state, 140 + 130 steps, fresh teacher in phase 1, phase-2 lr 5e-4 (the recipe before
#     phase 2 was tuned): the defaults plus --set phase2.lr=5.0e-4. The recipe now (phase-2 lr 2e-4)
#     was measured by rerunning phase 2 from that run's phase 1: evals/results/smollm2-135m-phase2-sweep/run.sh
#   the recipe with phase1-focus on layers 20-24 and 100 phase-2 steps with KL (60.8 min): the recipe then,
#     NAME=converted-focus bash evals/smollm2_selective.sh outputs/smollm2-focus evals/results/smollm2-135m-hallamonic-focus \
#       --set phase2.kl_weight=1.0 --set phase2.steps=100
#   the recipe then (phase 2: 125 steps, cross-entropy only; 61.8 min; its --sets are now the defaults):
#     NAME=converted-ce125 bash evals/smollm2_selective.sh outputs/smollm2-ce125 evals/results/smollm2-135m-hallamonic-ce125
#     (the recipe since adds phase2.frozen_layers [20..24], measured from that run's focus by
#     evals/results/smollm2-135m-phase2-sweep/run.sh frozen-20-24; to rerun the ce125 recipe add
#     --set 'phase2.frozen_layers=[]')
#   the recipe with phase2.frozen_layers, fresh (53.2 min): NAME=converted-frozen bash evals/smollm2_selective.sh \
#     outputs/smollm2-frozen evals/results/smollm2-135m-hallamonic-frozen --set phase1.teacher_dtype=float32 --set phase1.focus_pool=48
#   the recipe before (bfloat16 teacher pass in phase 1 and the focus, focus pool 192; no refit):
#     NAME=converted-focus192 bash evals/smollm2_selective.sh outputs/smollm2-focus192 evals/results/smollm2-135m-hallamonic-focus192 \
#       --set phase2.refit_steps=0
#   the recipe before (+ phase2-refit of layer 23; fp32, 125 phase-2 steps: add --set train.mixed_precision=no --set phase2.steps=125): NAME=converted-refit bash evals/smollm2_selective.sh outputs/smollm2-refit \
#     evals/results/smollm2-135m-hallamonic-refit. Measured in two steps: that command with --set phase2.refit_steps=0
#     (48.5 min; LAMBADA of that export in the results' before-refit/), then `hallamonic convert smollm2-135m -o
#     outputs/smollm2-refit --resume` with the same two --sets as below (phases restored, the refit run: 9.7 min), then the evals
#   the recipe under bf16 autocast with 125 phase-2 steps (49.6 min): NAME=converted-bf16 bash evals/smollm2_selective.sh \
#     outputs/smollm2-bf16 evals/results/smollm2-135m-hallamonic-bf16 --set phase2.steps=125 --set 'harmonic.hedgehog_layers=[]' \
#     --set phase2.refit_steps=1500; with 220 phase-2 steps (measured from that run's focus): evals/results/smollm2-135m-hallamonic-bf16/README.md
#   the recipe before (Hedgehog block in layer 23, 170 phase-2 steps, 1,200 refit steps; 55.9 min fresh; add --set 'harmonic.delta_layers=[]'):
#     NAME=converted-hedgehog23 bash evals/smollm2_selective.sh outputs/smollm2-hh23 evals/results/smollm2-135m-hallamonic-hedgehog23
#   the gated delta rule in every layer (88.3 min; same LAMBADA, better 4K/16K bits, over budget): NAME=converted-delta \
#     bash evals/smollm2_selective.sh outputs/smollm2-delta evals/results/smollm2-135m-hallamonic-delta --set harmonic.update_rule=delta
#   the recipe now (the delta rule in layers 20, 21, 22, 24; 66.0 min fresh; its --set is now the default):
#     NAME=converted-delta20 bash evals/smollm2_selective.sh outputs/smollm2-delta20 evals/results/smollm2-135m-hallamonic-delta20 \
#       --set 'harmonic.delta_layers=[20,21,22,24]'  (to rerun the recipe before, hedgehog23: --set 'harmonic.delta_layers=[]')
#   teacher pool (measured worse, not the bundled recipe): NAME=converted-pool bash evals/smollm2_selective.sh \
#     outputs/smollm2-pool evals/results/smollm2-135m-hallamonic-pool \
#     --set phase1.teacher_pool=48 --set phase2.steps=170 (as run: also --set phase1.recompute=true, a key since removed)
#   since 2026-12-04 phase 2 and the refit train on FineWeb-Edu text (phase2_data.path below; LAMBADA 0.151 vs 0.134 on
#     1,000 passages, evals/results/smollm2-135m-phase2-sweep/lambada-1000): every run above trained both on
#     fineweb_train.jsonl; to rerun one add --set phase2_data.path=
#   one level per block (41.8 min; bits drift past 4K): NAME=converted-one-level bash evals/smollm2_selective.sh \
#     outputs/smollm2-one-level evals/results/smollm2-135m-hallamonic-one-level --set 'harmonic.timescale_bands=[[1,4096]]'
#   two levels per block (refit stopped early by mistake; exported from phase 2, see its README): NAME=converted-two-level \
#     bash evals/smollm2_selective.sh outputs/smollm2-two-level evals/results/smollm2-135m-hallamonic-two-level-norefit --set 'harmonic.timescale_bands=[[1,64],[64,4096]]'
#   the recipe now (two levels per block, 52.8 min; its --set is now the default): NAME=converted-two-level bash evals/smollm2_selective.sh \
#     outputs/smollm2-two-level-full evals/results/smollm2-135m-hallamonic-two-level --set 'harmonic.timescale_bands=[[1,64],[64,4096]]'
#     (every run above had three levels: to rerun one add --set 'harmonic.timescale_bands=[[1,16],[16,256],[256,4096]]')
#   the recipe now (three levels in the recall layers 20-24, two elsewhere; 52.8 min; its --sets are now the defaults):
#     NAME=converted-mixed-levels bash evals/smollm2_selective.sh outputs/smollm2-mixed-levels evals/results/smollm2-135m-hallamonic-mixed-levels \
#       --set 'harmonic.recall_layers=[20,21,22,23,24]' --set 'harmonic.recall_timescale_bands=[[1,16],[16,256],[256,4096]]'
#     (every run above had the same levels in every layer: to rerun one add --set 'harmonic.recall_layers=[]')
#   the recipe now, rerun after the compile fixes of 2026-12-05 (eager backward precision; the delta rule's solve
#     outside the graph; 53.4 min): NAME=converted-fixed bash evals/smollm2_selective.sh outputs/smollm2-fixed \
#       evals/results/smollm2-135m-hallamonic-fixed (the runs above with bf16 autocast and compiled blocks ran those blocks' backward in bf16)
#     and its second seed (the fixes' bits gain did not reproduce): NAME=converted-fixed-seed1 bash evals/smollm2_selective.sh \
#       outputs/smollm2-fixed-seed1 evals/results/smollm2-135m-hallamonic-fixed-seed1 --set seed=1
#   the recipe now (since 2026-12-06 it ends with the copy cache): its seed-0 run above resumed with the cache
#     (cp -r outputs/smollm2-fixed outputs/smollm2-fixed-cache; hallamonic convert outputs/smollm2-fixed-cache/training/recipe.yaml
#     -o outputs/smollm2-fixed-cache --resume --set 'copy_cache.orders=[1,2,3,4,6,8]'), then
#     NAME=converted-copy-cache bash evals/smollm2_selective.sh outputs/smollm2-fixed-cache evals/results/smollm2-135m-hallamonic-copy-cache
#     (to rerun a run above without it: --set 'copy_cache.orders=[]')
#   a fresh seed-3 run with the n-gram cache (2026-12-06, fourth session; 63.0 min, torch.compile's disk cache cold):
#     NAME=converted-seed3 bash evals/smollm2_selective.sh outputs/smollm2-seed3 evals/results/smollm2-135m-hallamonic-seed3 \
#       --set seed=3 --set copy_cache.seen=false
#   the recipe now (the cache's context-word cue, copy_cache.seen: true): that run resumed with it
#     (cp -r outputs/smollm2-seed3 outputs/smollm2-seed3-seen; hallamonic convert outputs/smollm2-seed3-seen/training/recipe.yaml
#     -o outputs/smollm2-seed3-seen --resume --set copy_cache.seen=true; 4.3 min), then
#     NAME=converted-seed3-seen bash evals/smollm2_selective.sh outputs/smollm2-seed3-seen evals/results/smollm2-135m-hallamonic-seed3-seen
#     (the runs above fitted the cache on phase-2 text: to rerun one add --set copy_cache.fit_text=phase2)
#   that recipe fresh on seed 4 (2026-12-06, fifth session; 57.7 min, compile cache warm; the cache fitted on phase-2 text):
#     NAME=converted-seed4 bash evals/smollm2_selective.sh outputs/smollm2-seed4 evals/results/smollm2-135m-hallamonic-seed4 \
#       --set seed=4 --set copy_cache.fit_text=phase2
#   the recipe now (copy_cache.fit_text: unseen, the cache fitted on text no phase read): that run resumed with it
#     (cp -r outputs/smollm2-seed4 outputs/smollm2-seed4-unseen; hallamonic convert outputs/smollm2-seed4-unseen/training/recipe.yaml
#     -o outputs/smollm2-seed4-unseen --resume --set copy_cache.fit_text=unseen), then
#     NAME=converted-seed4-unseen bash evals/smollm2_selective.sh outputs/smollm2-seed4-unseen evals/results/smollm2-135m-hallamonic-seed4-unseen
#     and the seed-3 run the same way (from outputs/smollm2-seed3-seen to outputs/smollm2-seed3-unseen):
#     NAME=converted-seed3-unseen bash evals/smollm2_selective.sh outputs/smollm2-seed3-unseen evals/results/smollm2-135m-hallamonic-seed3-unseen
#   the recipe now (copy_cache.continuation: the gate reads whether the copied token continues a word): the seed-4 run
#     resumed with it (cp -r outputs/smollm2-seed4-unseen outputs/smollm2-seed4-cont; hallamonic convert
#     outputs/smollm2-seed4-cont/training/recipe.yaml -o outputs/smollm2-seed4-cont --resume --set copy_cache.continuation=true), then
#     NAME=converted-seed4-continuation bash evals/smollm2_selective.sh outputs/smollm2-seed4-cont evals/results/smollm2-135m-hallamonic-seed4-continuation
#     and the seed-3 run the same way (from outputs/smollm2-seed3-unseen to outputs/smollm2-seed3-cont):
#     NAME=converted-seed3-continuation bash evals/smollm2_selective.sh outputs/smollm2-seed3-cont evals/results/smollm2-135m-hallamonic-seed3-continuation
#     (the runs above had no continuation term: to rerun one add --set copy_cache.continuation=false)
#   not adopted (copy_cache.prior: the context-word cue reads each token's log unigram frequency; passkey falls at 2K / 4K):
#     cp -r outputs/smollm2-seed4-cont outputs/smollm2-seed4-prior; hallamonic convert outputs/smollm2-seed4-prior/training/recipe.yaml
#     -o outputs/smollm2-seed4-prior --resume --set copy_cache.prior=true (4.8 min), then
#     NAME=converted-seed4-prior bash evals/smollm2_selective.sh outputs/smollm2-seed4-prior evals/results/smollm2-135m-hallamonic-seed4-prior
#   the recipe now (the cue's prior, rate and count cap, the gate fitted on 12 x 4,096-token windows; 2026-12-06, eighth session):
#     cp -r outputs/smollm2-seed4-cont outputs/smollm2-seed4-rate; hallamonic convert outputs/smollm2-seed4-rate/training/recipe.yaml
#     -o outputs/smollm2-seed4-rate --resume --set copy_cache.prior=true --set copy_cache.rate=true --set copy_cache.count_cap=16
#     --set copy_cache.fit_windows=12 --set copy_cache.fit_length=4096 (9.3 min), then
#     NAME=converted-seed4-rate bash evals/smollm2_selective.sh outputs/smollm2-seed4-rate evals/results/smollm2-135m-hallamonic-seed4-rate
#     and the seed-3 run the same way (from outputs/smollm2-seed3-cont to outputs/smollm2-seed3-rate):
#     NAME=converted-seed3-rate bash evals/smollm2_selective.sh outputs/smollm2-seed3-rate evals/results/smollm2-135m-hallamonic-seed3-rate
#     LAMBADA on all 1,000 passages, these two and the recipe before (seed4-cont / seed3-cont into *-continuation/lambada-1000):
#     hallamonic eval outputs/smollm2-seed4-rate --threads 2 --name converted-seed4-rate --task lambada \
#       --data ../shared/data/lambada_openai_dev1000.jsonl --limit 1000 --output-dir evals/results/smollm2-135m-hallamonic-seed4-rate/lambada-1000
#     (the runs above had none of the three and 48 x 1,024-token fit windows: to rerun one add --set copy_cache.prior=false
#     --set copy_cache.rate=false --set copy_cache.count_cap=0 --set copy_cache.fit_windows=48 --set copy_cache.fit_length=1024)
#   the recipe now, fresh, seed 5, on a 2-core AMD EPYC with AVX2 only (2026-12-07, third session; `native` precision is
#     float32 there: no bf16 autocast, a float32 teacher pass; 135.5 min):
#     NAME=converted-seed5-fp32 bash evals/smollm2_selective.sh outputs/smollm2-seed5 evals/results/smollm2-135m-hallamonic-seed5-fp32 --set seed=5
#   the same, fresh, on a 2-core AMD EPYC with AVX-512 BF16 (2026-12-08; bf16 autocast and a bfloat16 teacher pass there; 39.6 min):
#     NAME=converted-seed5-bf16 bash evals/smollm2_selective.sh outputs/smollm2-seed5-bf16 evals/results/smollm2-135m-hallamonic-seed5-bf16 --set seed=5
#     and seed 6 (36.6 min): NAME=converted-seed6 bash evals/smollm2_selective.sh outputs/smollm2-seed6 evals/results/smollm2-135m-hallamonic-seed6 --set seed=6
set -euo pipefail
OUT=${1:-outputs/smollm2-n64}
RES=${2:-evals/results/smollm2-135m-hallamonic-selective}
shift $(( $# < 2 ? $# : 2 ))
G=$(python -c "from hallamonic.loading import smollm2_gguf_path as p; print(p())")
export OMP_NUM_THREADS=2
if [ ! -f "$OUT/model.safetensors" ]; then
  hallamonic convert smollm2-135m -o "$OUT" --set base.model="$G" --set data.path=../shared/data/fineweb_train.jsonl \
    --set phase2_data.path=../shared/data/fineweb_edu_head_train.txt "$@"
fi
mkdir -p "$RES"
cp "$OUT/README.md" "$RES/MODEL_CARD.md"
cp "$OUT"/training/{metrics.jsonl,report.json,recipe.yaml,loss.png} "$RES/"
EV="hallamonic eval $OUT --threads 2 --no-progress --name ${NAME:-converted-selective}"
$EV --task lambada --data ../shared/data/lambada_openai_dev1000.jsonl --limit 300 --output-dir $RES/lambada
$EV --task context --data ../shared/data/fineweb_edu_head_heldout.txt --context-lengths 1024,4096 --output-dir $RES/context
$EV --task passkey --context-lengths 1K,2K,4K --trials 10 --output-dir $RES/passkey
# Past the teacher's 8K RoPE window: every 16K window of the held-out file (2), chunked forward.
$EV --task context --data ../shared/data/fineweb_edu_head_heldout.txt --context-lengths 16384 --output-dir $RES/context-16k
