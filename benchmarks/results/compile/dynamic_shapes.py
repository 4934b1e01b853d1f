"""Why every compiled block uses dynamic=False: one SmolLM2 block compiled at phase 1's shape
(4 x 512, no input gradient), then compiled in place and run at phase 2's (1 x 1,024, input
gradient). With dynamic=None (torch's default) dynamo sees the block's forward code a second time
with new sizes and recompiles it with symbolic sizes ("automatic dynamic"); with dynamic=False it
compiles a second static graph.

Usage (repo root; any finished SmolLM2 conversion as the block source):
    TORCH_LOGS=dynamic python benchmarks/results/compile/dynamic_shapes.py none    # torch's default
    TORCH_LOGS=dynamic python benchmarks/results/compile/dynamic_shapes.py false   # dynamic=False
(the path outputs/smollm2-compile is the conversion used on 2026-12-03). Prints the first (compiling)
and later step times of each shape.
"""
import sys, time, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("outputs/smollm2-compile", trust_remote_code=True, dtype=torch.float32)
dyn = None if sys.argv[1] == "none" else False
block = model.model.layers[1].mixer
def step(f, shape, xgrad):
    x = (torch.randn(*shape, 576) * 0.5).requires_grad_(xgrad)
    t = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = f(x)[0].float()
    out.pow(2).mean().backward()
    return round(time.perf_counter() - t, 2)
c = torch.compile(block, dynamic=dyn)
print("phase1-like", step(c, (4, 512), False), step(c, (4, 512), False), flush=True)
block.compile(dynamic=dyn)
print("phase2-like", step(block, (1, 1024), True), step(block, (1, 1024), True), step(block, (1, 1024), True), flush=True)
