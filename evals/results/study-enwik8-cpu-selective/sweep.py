"""The one-seed option sweep of README.md: python sweep.py NAME '{"config_key": value}' [recipe overrides JSON] [context].
MAP_STD / READ_SCALE environment variables re-initialise the write/read maps / change the read scale;
PER_HEAD_TIMESCALES=1 gives each head one timescale per level (heads spread over the level's band)
instead of every head spreading its channels over the band; GATE_BIAS_SCALE=s stores each gate's
timescale bias as s * raw, so Adam moves the band edges s times faster (learnable band edges);
PER_STATE_DECAY=r gives every state n of a channel its own decay, log a_pn = r_n log a_p with r_n
log-spaced over [1/r, r] (Mamba spreads its A over the states the same way); it runs through the
diagonal scan with the (B, L, D, N) state sequence materialised (fine at this size only).
STREAM_SILU=v|all passes the short conv's output through SiLU (v only, or v, k and q), as Mamba
does after its conv (needs the config flag short_conv_size > 0); HEAD_NORM=1 RMS-normalises each
head's mixer output before o_proj (no weight: o_proj absorbs the scale), as GLA / RetNet /
Mamba-2 do. ARCH=transformer|mamba trains that baseline (fitted to Harmonic's parameter count
as the study does) with the flags set on its config instead. DELTA=1 replaces every level's
decayed sum with the gated delta rule of ../smollm2-135m-transfer-probe/probe.py (unit-norm write
vectors, beta = sigmoid(w.x + c) per head, one decay per head: the mean of the head's log a).
D_SKIP=1 adds Mamba's D, a learned per-channel skip of v (init 1) into the mixer output before o_proj;
GATE_FROM_X=1 makes every level's decay gate read the block input x (as Mamba's dt does) instead of
the level's own input (v or the normalised error). RESID_SCALE=1 scales every residual write
(o_proj, down_proj) by 1 / sqrt(2 x layers) after init, as GPT-2 does.
Since 2026-12-04 the recipe carries lr 6e-3, weight decay 0, short_conv and context bands: '{}' is that row."""
import os

import torch
from hallamonic.study import models as M
from hallamonic.modeling import modeling_hallamonic as MH
_orig = M.Architecture.build
def build(self, seed):
    m = _orig(self, seed)
    std = os.environ.get("MAP_STD")
    if std:
        g = torch.Generator().manual_seed(seed + 7)
        for mod in m.modules():
            if isinstance(mod, MH.StateMap):
                with torch.no_grad():
                    mod.weight.normal_(0, float(std), generator=g)
    if os.environ.get("RESID_SCALE"):  # GPT-2's scaled init: every residual write (o_proj, down_proj) / sqrt(2 x layers)
        layers = m.config.num_hidden_layers
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    p.mul_((2 * layers) ** -0.5)
    scale = os.environ.get("GATE_BIAS_SCALE")
    if scale:  # learnable band edges: the gate biases (timescales) move `scale` times faster under Adam
        from torch.nn.utils import parametrize
        class Scaled(torch.nn.Module):
            def forward(self, raw):
                return raw * float(scale)
            def right_inverse(self, bias):
                return bias / float(scale)
        for mod in m.modules():
            if isinstance(mod, MH.TimescaleLinear):
                parametrize.register_parametrization(mod, "bias", Scaled())
    return m
M.Architecture.build = build
if os.environ.get("READ_SCALE"):
    _sm = MH.HarmonicBlock._state_maps
    def _state_maps(self, w, r):
        wr, rd = _sm(self, w, r)
        return wr, rd * (self.state_size ** 0.5) * float(os.environ["READ_SCALE"])
    MH.HarmonicBlock._state_maps = _state_maps
if os.environ.get("PER_HEAD_TIMESCALES"):
    def timescales(self):
        lo, hi = self.band
        head = torch.arange(self.out_features, dtype=torch.float64) // self.head_dim  # (D,)
        fraction = head / max(self.out_features // self.head_dim - 1, 1)
        return lo * (hi / lo) ** fraction
    MH.TimescaleLinear.timescales = timescales
if os.environ.get("PER_STATE_DECAY"):
    from hallamonic.modeling.hallamonic_scan import scan as diagonal_scan
    _level_orig = MH.HarmonicBlock._level
    def _level(self, log_a, level_input, maps, state, mask):
        if maps is None:
            return _level_orig(self, log_a, level_input, maps, state, mask)
        r = float(os.environ["PER_STATE_DECAY"])
        batch, length, width = log_a.shape
        heads, n = width // self.head_dim, self.state_size
        rates = torch.logspace(-1, 1, n, base=r, dtype=torch.float32)  # (N,) from 1/r to r
        la = (log_a.view(batch, length, heads, self.head_dim, 1) * rates).clamp_min(-MH.MAX_DECAY_RATE)  # (B, L, H, P, N)
        write, read = maps  # (B, L, H, N) each
        b = -torch.expm1(la) * level_input.float().view(batch, length, heads, self.head_dim, 1) * write.unsqueeze(3)
        prev = state.reshape(batch, -1) if state is not None else None
        h = diagonal_scan(la.exp().reshape(batch, length, -1), b.reshape(batch, length, -1), prev)  # (B, L, H*P*N)
        y = (h.view(batch, length, heads, self.head_dim, n) * read.unsqueeze(3)).sum(-1)  # (B, L, H, P)
        return y.reshape(batch, length, width), h[:, -1].view(batch, width, n)
    MH.HarmonicBlock._level = _level
if os.environ.get("STREAM_SILU"):
    _conv_forward = MH.ShortConv.forward
    def conv_forward(self, v, tail):
        out, new_tail = _conv_forward(self, v, tail)
        if os.environ["STREAM_SILU"] == "all":
            return torch.nn.functional.silu(out), new_tail
        width = out.shape[-1] - getattr(self, "_kq_width", 0)
        return torch.cat([torch.nn.functional.silu(out[..., :width]), out[..., width:]], dim=-1), new_tail
    MH.ShortConv.forward = conv_forward
    _block_init = MH.HarmonicBlock.__init__
    def block_init(self, config, layer_idx=0):
        _block_init(self, config, layer_idx)
        if self.short_conv is not None:
            self.short_conv._kq_width = sum(self.conv_widths[1:])
    MH.HarmonicBlock.__init__ = block_init
if os.environ.get("HEAD_NORM"):
    _block_init2 = MH.HarmonicBlock.__init__
    def block_init2(self, config, layer_idx=0):
        _block_init2(self, config, layer_idx)
        head_dim, eps = self.head_dim, config.rms_norm_eps
        def head_norm(module, args):
            (x,) = args
            heads = x.view(*x.shape[:-1], -1, head_dim)  # (B, L, H, P)
            heads = heads * torch.rsqrt(heads.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)
            return (heads.reshape(x.shape),)
        self.o_proj.register_forward_pre_hook(head_norm)
    MH.HarmonicBlock.__init__ = block_init2
if os.environ.get("DELTA"):  # every level's state follows the gated delta rule (one decay per head)
    import sys as _sys
    from pathlib import Path as _Path
    _sys.path.insert(0, str(_Path(__file__).resolve().parents[1] / "smollm2-135m-transfer-probe"))
    from probe import delta_rule_chunked
    _block_init3 = MH.HarmonicBlock.__init__
    def block_init3(self, config, layer_idx=0):
        _block_init3(self, config, layer_idx)
        self.beta_proj = torch.nn.Linear(config.hidden_size, config.num_attention_heads)
    MH.HarmonicBlock.__init__ = block_init3
    _block_forward = MH.HarmonicBlock.forward
    def block_forward(self, x, state=None, mask=None):
        self._beta = torch.sigmoid(self.beta_proj(x).float())  # (B, L, H)
        return _block_forward(self, x, state, mask)
    MH.HarmonicBlock.forward = block_forward
    def delta_level(self, log_a, level_input, maps, state, mask):
        batch, length, width = level_input.shape
        heads = width // self.head_dim
        u = level_input.float().view(batch, length, heads, self.head_dim)
        head_log_a = log_a.clamp_min(-3.0).view(batch, length, heads, self.head_dim).mean(-1)
        write, read = maps
        return delta_rule_chunked(u, head_log_a, torch.nn.functional.normalize(write, dim=-1), read, self._beta)
    MH.HarmonicBlock._level = delta_level
if os.environ.get("D_SKIP"):  # Mamba's D: a learned per-channel skip of v into the mixer output (init 1)
    _block_init4 = MH.HarmonicBlock.__init__
    def block_init4(self, config, layer_idx=0):
        _block_init4(self, config, layer_idx)
        self.skip = torch.nn.Parameter(torch.ones(config.state_width))
        self.v_proj.register_forward_hook(lambda mod, args, out: setattr(self, "_v", self._repeat_kv(out)))
        self.o_proj.register_forward_pre_hook(lambda mod, args: (args[0] + self.skip.to(args[0].dtype) * self._v.to(args[0].dtype),))
    MH.HarmonicBlock.__init__ = block_init4
if os.environ.get("GATE_FROM_X"):  # every level's decay gate reads the block input x (as Mamba's dt), not the level input
    _block_init5 = MH.HarmonicBlock.__init__
    def block_init5(self, config, layer_idx=0):
        _block_init5(self, config, layer_idx)
        assert config.state_width == config.hidden_size, "GATE_FROM_X needs state width == hidden size"
        self.register_forward_pre_hook(lambda mod, args: setattr(self, "_x", args[0]))
        for gate in self.gates:
            gate.register_forward_pre_hook(lambda mod, args: (self._x,))
    MH.HarmonicBlock.__init__ = block_init5
import json, sys, dataclasses
from pathlib import Path
import torch
from hallamonic.study.recipe import load_study_recipe
from hallamonic.study.data import load_study_corpus
from hallamonic.study.models import Architecture, harmonic_config, count_parameters
from hallamonic.study.runner import train_one

name = sys.argv[1]
flags = json.loads(sys.argv[2])      # HallamonicConfig overrides
shape = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}   # recipe overrides
ctx = int(sys.argv[4]) if len(sys.argv) > 4 else 256
recipe = load_study_recipe("study-enwik8-cpu", [f"{k}={v}" for k, v in shape.items()])
corpus = load_study_corpus(recipe.data)
if os.environ.get("ARCH"):  # a baseline (transformer / mamba) fitted to Harmonic's count as the study does
    from hallamonic.study.models import build_architectures
    config = build_architectures(recipe.model, corpus.vocab_size, [os.environ["ARCH"]], ctx)[os.environ["ARCH"]].config
else:
    config = harmonic_config(recipe.model, corpus.vocab_size, ctx)
for k, v in flags.items():
    setattr(config, k, v)
arch = Architecture(name, config, count_parameters(config))
out = Path("outputs/sweep")
rec = train_one(recipe, arch, ctx, corpus, out, resume=False)
print(json.dumps({"name": name, "params": arch.params, "ctx": ctx, "valid": rec.get("valid_bits"), "test": rec["bits"], "s": rec["train_seconds"]}))
with open("outputs/sweep/results.jsonl", "a") as f:
    f.write(json.dumps({"name": name, "env": {k: v for k, v in os.environ.items() if k in ("MAP_STD", "READ_SCALE", "PER_HEAD_TIMESCALES", "GATE_BIAS_SCALE", "PER_STATE_DECAY", "STREAM_SILU", "HEAD_NORM", "ARCH", "DELTA", "D_SKIP", "GATE_FROM_X", "RESID_SCALE")}, "flags": flags, "shape": shape, "params": arch.params, "ctx": ctx, "valid": rec.get("valid_bits"), "test": rec["bits"], "s": rec["train_seconds"]}) + "\n")
