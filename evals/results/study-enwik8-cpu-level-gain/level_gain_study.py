"""The study CLI with every LevelInputNorm gain initialised to LEVEL_GAIN instead of the model's default
(experiment runner of this folder; run.sh calls it)."""
import os, sys
import torch
import hallamonic.modeling.modeling_hallamonic as M
gain = float(os.environ["LEVEL_GAIN"])
orig = M.HallamonicPreTrainedModel._init_weights
def patched(self, module):
    orig(self, module)
    if isinstance(module, M.LevelInputNorm):
        with torch.no_grad():
            module.weight.fill_(gain)
M.HallamonicPreTrainedModel._init_weights = patched
from hallamonic.cli import app
sys.argv = ["hallamonic"] + sys.argv[1:]
app()
