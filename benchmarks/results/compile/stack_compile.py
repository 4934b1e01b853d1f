import sys, time, torch
from hallamonic.loading import load_causal_lm
from hallamonic.convert.phases import MixerStack
student, _ = load_causal_lm("outputs/smollm2-n64")
mixers = [l.mixer for l in student.model.layers]
torch.manual_seed(0)
xs = [torch.randn(4, 512, 576) for _ in mixers]; ys = [torch.randn(4, 512, 576) for _ in mixers]
stack = MixerStack(mixers)
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = stack(xs, ys).sum()
    loss.backward()
def timed(name, n=2):
    t = time.perf_counter()
    for _ in range(n): step()
    print(name, "s/step", (time.perf_counter() - t) / n, flush=True)
if "eager" in sys.argv:
    step(); timed("eager")
if "compiled" in sys.argv:
    for m in mixers: m.compile()
    t = time.perf_counter(); step(); print("compile+first", time.perf_counter() - t, flush=True)
    timed("compiled")
    import torch._dynamo.utils as U
    print(U.counters["stats"])
