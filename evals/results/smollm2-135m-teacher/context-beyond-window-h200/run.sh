set -o pipefail
cat /tmp/ggufpart.aa .gguf-b/ggufpart.ab > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf && md5sum /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HALLAMONIC_CACHE=/tmp/hcache PYTHONUNBUFFERED=1
G=/tmp/SmolLM2-135M-Instruct.Q4_1.gguf
EV='import sys, typer; from hallamonic.evaluation.cli import eval_command; typer.run(eval_command)'
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
run() { /usr/bin/time -f "%e s" python3 -c "$EV" $G --device cuda --no-progress --baseline ntk --baseline yarn "$@"; }
{
run --task context --data .evaldata/fineweb_edu_head_heldout.txt --context-lengths 1024,4096,8192,16384,32768 --output-dir $OUT/context
run --task passkey --context-lengths 1K,2K,4K,8K,16K,32K --trials 10 --output-dir $OUT/passkey
run --task context --data .evaldata/pg1342_pride_and_prejudice.txt --context-lengths 8192,16384,32768,65536 --limit 2 --output-dir $OUT/context-pg1342
nvidia-smi --query-gpu=memory.used --format=csv
} 2>&1 | grep -v "Loading weights" | tee $OUT/gpu.log
