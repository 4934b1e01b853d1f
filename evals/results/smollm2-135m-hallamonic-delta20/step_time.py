"""Is a phase-2 step of the delta20 conversion dearer than one of the recipe before (hedgehog23)?

One phase-2-like step per call: 1 x 1,024 real training tokens, bf16 autocast, forward and backward
through every layer (the mixers trainable, everything else frozen), on finished conversions, each
alternated with and without flushing denormals (torch.set_flush_denormal), three times.

Usage (repo root; needs outputs/smollm2-n64/training/tokens.npy from evals/smollm2_selective.sh):
    python evals/results/smollm2-135m-hallamonic-delta20/step_time.py outputs/smollm2-delta20 outputs/smollm2-hh23
Measured (2026-12-03, 2 threads): delta20 no flush 31.18 (first, warm-up) / 8.87 / 6.93 s, flush
41.5 / 5.83 / 7.25 s; hh23 no flush 9.75 / 6.66 / 7.0 s, flush 7.91 / 7.16 / 7.64 s.
"""

import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

tokens = np.load("outputs/smollm2-n64/training/tokens.npy")
for path in sys.argv[1:]:
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, dtype=torch.float32)
    for name, param in model.named_parameters():
        param.requires_grad_(".mixer." in name)
    times = {False: [], True: []}
    for rep in range(3):
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            ids = torch.from_numpy(tokens[rep * 1024 : (rep + 1) * 1024].astype(np.int64)).unsqueeze(0)  # (1, 1024)
            began = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            model.zero_grad(set_to_none=True)
            times[flush].append(time.perf_counter() - began)
    print(path, "no flush", [round(t, 2) for t in times[False]], "flush", [round(t, 2) for t in times[True]], flush=True)
