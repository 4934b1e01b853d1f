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
Since 2026-12-04 the recipe carries lr 6e-3, weight decay 0, short_conv and context bands: '{}' is that row.
Since 2026-12-04 (third session) it also carries Mamba's value path (random conv init, silu(conv(v)),
maps from u, D skip; intermediate_size 342): '{}' is the study's harmonic row of
../study-enwik8-cpu-value-path; rows of ../study-enwik8-cpu-gap ran before that, on the combined
recipe (reproduce them with '{"short_conv_init": "identity", "value_activation": "identity",
"maps_from_value": false, "value_skip": false}' '{"model.intermediate_size": 341}' plus their own
settings). Options added for that diagnosis (each explained where it is defined below): PER_LEVEL_MAPS,
LEVEL_SCALE, RATE_POWER, QK_NORM, OUTPUT_SILU, PARALLEL_LEVELS, MAMBA_MIXER, KEY_DECAY, MINI, WRITE_DT,
KQ_FROM_U / U_ACT / U_SKIP, CONV_KAIMING."""
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
    if os.environ.get("CONV_KAIMING"):  # the short conv drawn as nn.Conv1d draws its weights (kaiming uniform) instead of the identity
        import math
        g = torch.Generator().manual_seed(seed + 13)
        for mod in m.modules():
            if isinstance(mod, MH.ShortConv):
                bound = 1.0 / math.sqrt(mod.weight.shape[-1])  # fan_in = taps (depthwise)
                with torch.no_grad():
                    mod.weight.uniform_(-bound, bound, generator=g)
    if os.environ.get("LEVEL_NORM"):  # the upper levels' input norms start at this gain (the model's init: initializer_range x sqrt(hidden))
        for mod in m.modules():
            if isinstance(mod, MH.LevelInputNorm):
                with torch.no_grad():
                    mod.weight.fill_(float(os.environ["LEVEL_NORM"]))
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
def _level_hooks():
    """Wraps HarmonicBlock.forward / _level so that per-level options below know the block input
    x and which level _level is computing (levels run in order inside one forward)."""
    if getattr(MH.HarmonicBlock, "_level_hooked", False):
        return
    MH.HarmonicBlock._level_hooked = True
    fwd, lvl = MH.HarmonicBlock.forward, MH.HarmonicBlock._level
    def forward(self, x, state=None, mask=None):
        self._x, self._lvl = x, 0
        return fwd(self, x, state, mask)
    def level(self, log_a, level_input, maps, state, mask):
        index = self._lvl
        self._lvl += 1
        for hook in self._level_pre:
            log_a, level_input, maps = hook(self, index, log_a, level_input, maps)
        y, final = lvl(self, log_a, level_input, maps, state, mask)
        for hook in self._level_post:
            y = hook(self, index, y)
        return y, final
    MH.HarmonicBlock.forward, MH.HarmonicBlock._level = forward, level
    MH.HarmonicBlock._level_pre, MH.HarmonicBlock._level_post = [], []
def _block_extra(init_fn):
    orig = MH.HarmonicBlock.__init__
    def block_init(self, config, layer_idx=0):
        orig(self, config, layer_idx)
        init_fn(self, config)
    MH.HarmonicBlock.__init__ = block_init
def _replace_mixer(mixer_class, reseed=None):
    """Every decoder layer's mixer becomes mixer_class(config, layer_idx), re-initialised by its own
    reinit() after the model's init (which would otherwise draw its linears like Harmonic's)."""
    layer_init_orig, build_orig = MH.HallamonicDecoderLayer.__init__, M.Architecture.build
    def layer_init(self, config, layer_idx):
        layer_init_orig(self, config, layer_idx)
        self.mixer = mixer_class(config, layer_idx)
    def build(self, seed):
        m = build_orig(self, seed)
        if reseed is not None:
            torch.manual_seed(seed + reseed)
        for mod in m.modules():
            if isinstance(mod, mixer_class):
                mod.reinit()
        return m
    MH.HallamonicDecoderLayer.__init__, M.Architecture.build = layer_init, build
if os.environ.get("PER_LEVEL_MAPS"):  # read (r) or write and read (wr) maps of its own for every level above the first
    _level_hooks()
    which = os.environ["PER_LEVEL_MAPS"]
    def init_maps(self, config):
        extra = self.num_levels - 1
        self.level_reads = torch.nn.ModuleList(MH.StateMap(config.hidden_size, self.state_read.out_features) for _ in range(extra))
        if which == "wr":
            self.level_writes = torch.nn.ModuleList(MH.StateMap(config.hidden_size, self.state_write.out_features) for _ in range(extra))
    _block_extra(init_maps)
    def per_level_maps(self, index, log_a, level_input, maps):
        if index == 0 or maps is None:
            return log_a, level_input, maps
        write, read = maps
        batch, length = write.shape[:2]
        read = self.level_reads[index - 1](self._x).float().view(batch, length, -1, self.state_size) * self.state_size**-0.5
        if which == "wr":
            write = self.level_writes[index - 1](self._x).float().view(batch, length, -1, self.state_size)
        return log_a, level_input, (write, read)
    MH.HarmonicBlock._level_pre.append(per_level_maps)
if os.environ.get("LEVEL_SCALE"):  # a learned per-level, per-channel output scale (init 1) before the levels are summed
    _level_hooks()
    def init_scale(self, config):  # LEVEL_SCALE=0: the levels above the first start switched off (the block starts as one level)
        scale = torch.ones(self.num_levels, config.state_width)
        scale[1:] = float(os.environ["LEVEL_SCALE"]) if os.environ["LEVEL_SCALE"] != "1" else 1.0
        self.level_scale = torch.nn.Parameter(scale)
    _block_extra(init_scale)
    MH.HarmonicBlock._level_post.append(lambda self, index, y: y * self.level_scale[index])
if os.environ.get("RATE_POWER"):  # write with (1 - a)^p instead of (1 - a): p = 1 is the block, p = 0 writes u unscaled
    _level_hooks()
    power = float(os.environ["RATE_POWER"])
    def rate_power(self, index, log_a, level_input, maps):
        rate = -torch.expm1(log_a.clamp_min(-MH.MAX_DECAY_RATE))
        return log_a, level_input * rate.pow(power - 1.0).to(level_input.dtype), maps
    MH.HarmonicBlock._level_pre.append(rate_power)
if os.environ.get("QK_NORM"):  # unit-norm write and read vectors (read scaled by QK_NORM), as GLA / GDN normalise q and k
    _sm2 = MH.HarmonicBlock._state_maps
    def _state_maps2(self, w, r):
        wr, rd = _sm2(self, w, r)
        return torch.nn.functional.normalize(wr, dim=-1), torch.nn.functional.normalize(rd, dim=-1) * float(os.environ["QK_NORM"])
    MH.HarmonicBlock._state_maps = _state_maps2
if os.environ.get("OUTPUT_SILU"):  # Mamba's output gate: mixer output * SiLU(W_z x), W_z full rank (hidden -> state width)
    def init_z(self, config):
        self.z_proj = torch.nn.Linear(config.hidden_size, config.state_width, bias=False)
        self.register_forward_pre_hook(lambda mod, args: setattr(mod, "_xz", args[0]))
        self.o_proj.register_forward_pre_hook(lambda mod, args: (args[0] * torch.nn.functional.silu(self.z_proj(self._xz)),))
    _block_extra(init_z)
if os.environ.get("PARALLEL_LEVELS"):  # every level reads v (after the conv) with its own gate: no stacking, no error
    _level_hooks()
    def parallel(self, index, log_a, level_input, maps):
        if index == 0:
            self._v0 = level_input
            return log_a, level_input, maps
        return self.gates[index](self._v0), self._v0, maps
    MH.HarmonicBlock._level_pre.append(parallel)
if os.environ.get("MAMBA_MIXER"):  # diagnostic: transformers' MambaMixer (expand 2, N 16, Mamba's init) in the Llama layout, MLP kept
    from transformers import MambaConfig
    from transformers.models.mamba.modeling_mamba import MambaMixer
    class MambaInLlama(torch.nn.Module):
        def __init__(self, config, layer_idx):
            super().__init__()
            mc = MambaConfig(hidden_size=config.hidden_size, state_size=16, expand=2, num_hidden_layers=config.num_hidden_layers,
                             use_mambapy=True, initializer_range=config.initializer_range)
            self.mamba = MambaMixer(mc, layer_idx)
        def forward(self, x, state=None, mask=None):
            return self.mamba(x), x.new_zeros(x.shape[0], 1, 1)
        @torch.no_grad()
        def reinit(self):
            import math
            self.mamba.init_mamba_weights()
            torch.nn.init.kaiming_uniform_(self.mamba.conv1d.weight, a=math.sqrt(5))
            torch.nn.init.zeros_(self.mamba.conv1d.bias)
            torch.nn.init.kaiming_uniform_(self.mamba.out_proj.weight, a=math.sqrt(5))
    _replace_mixer(MambaInLlama)
if os.environ.get("KEY_DECAY"):  # GLA's layout: decay per (head, state) from a gate of its own, so the read picks timescales;
    # key: only that decay; both: channel decay x state decay (log a summed). (B, L, D, N) materialised.
    from hallamonic.modeling.hallamonic_scan import scan as diagonal_scan
    mode = os.environ["KEY_DECAY"]
    class KeyGate(torch.nn.Module):
        def __init__(self, width, rank, out, band, n):
            super().__init__()
            self.down = torch.nn.Linear(width, rank, bias=False)
            self.up = MH.TimescaleLinear(rank, out, band, n)
        def forward(self, u):
            return -torch.nn.functional.softplus(self.up(self.down(u.float())))
    def init_key(self, config):
        out = config.num_attention_heads * config.state_size
        self.key_gates = torch.nn.ModuleList(KeyGate(config.state_width, config.gate_rank, out, band, config.state_size) for band in config.layer_level_bands(0))
    _block_extra(init_key)
    def key_level(self, log_a, level_input, maps, state, mask):
        index = self._lvl - 1
        batch, length, width = level_input.shape
        heads, n = width // self.head_dim, self.state_size
        key = self.key_gates[index](level_input).view(batch, length, heads, 1, n)  # (B, L, H, 1, N)
        chan = log_a.view(batch, length, heads, self.head_dim, 1)
        la = (key if mode == "key" else key + chan).expand(batch, length, heads, self.head_dim, n).clamp_min(-MH.MAX_DECAY_RATE)
        write, read = maps
        b = -torch.expm1(la) * level_input.float().view(batch, length, heads, self.head_dim, 1) * write.unsqueeze(3)
        prev = state.reshape(batch, -1) if state is not None else None
        h = diagonal_scan(la.exp().reshape(batch, length, -1), b.reshape(batch, length, -1), prev)
        y = (h.view(batch, length, heads, self.head_dim, n) * read.unsqueeze(3)).sum(-1)
        return y.reshape(batch, length, width), h[:, -1].view(batch, width, n)
    MH.HarmonicBlock._level = key_level
    _level_hooks()
if os.environ.get("MINI"):  # diagnostic: a compact Mamba mixer in the Llama layout, its parts switched by MINI="key=value,..."
    # expand (2), z (1: y * silu(z)), conv (1), act (1: silu after conv), aspread (0: A = 1, the chunked scan; 1: A = 1..N per state as Mamba, (B, L, E, N) materialised, levels=1 only),
    # dskip (1), inw (dt: write dt * B x as Mamba; rate: (1 - a) * B x as Harmonic), heads (1: B, C shared by all channels),
    # levels (1), dtinit (auto), convinit (kaiming | identity), outinit (kaiming | normal), alearn (1: A_log trained),
    # rscale (0 | 1: C / sqrt(N) as Harmonic's read), dtzero (0 | 1: dt_proj weights start at 0)
    import math
    from hallamonic.modeling.hallamonic_scan import scan as diagonal_scan
    opts = dict(expand=2, z=1, conv=1, act=1, aspread=0, dskip=1, inw="dt", heads=1, n=16, levels=1, dtinit="auto", convinit="kaiming", outinit="kaiming", alearn=1, rscale=0, dtzero=0)
    for item in os.environ["MINI"].split(","):
        if item:
            key, value = item.split("=")
            opts[key] = value if key in ("inw", "dtinit", "convinit", "outinit") else int(value)
    class MiniMamba(torch.nn.Module):
        def __init__(self, config, layer_idx):
            super().__init__()
            w, n = config.hidden_size, opts["n"]
            self.inner, self.n, self.heads = opts["expand"] * w, n, opts["heads"]
            self.rank = math.ceil(w / 16)
            self.levels = opts["levels"]
            # levels > 1: Harmonic's hierarchy on Mamba's mixer; level l reads the normalised error of
            # level l-1's input predicted from its output, its dt from its own input; bands = config's
            # dtinit: auto (bands with levels > 1, else mamba), mamba (every level 1/dt in [10, 1000]), bands (the config's
            # level bands), union (every level over [min, max] of the bands)
            init = opts["dtinit"] if opts["dtinit"] != "auto" else ("bands" if self.levels > 1 else "mamba")
            union = [min(lo for lo, _ in config.layer_level_bands(0)), max(hi for _, hi in config.layer_level_bands(0))]
            self.bands = {"mamba": None, "bands": config.layer_level_bands(0), "union": [union] * self.levels}[init]
            self.in_proj = torch.nn.Linear(w, self.inner * (2 if opts["z"] else 1), bias=False)
            self.conv = torch.nn.Conv1d(self.inner, self.inner, 4, groups=self.inner, padding=3) if opts["conv"] else None
            self.x_proj = torch.nn.Linear(self.inner, self.rank + 2 * n * self.heads, bias=False)
            self.dt_proj = torch.nn.Linear(self.rank, self.inner, bias=True)
            self.dt_downs = torch.nn.ModuleList(torch.nn.Linear(self.inner, self.rank, bias=False) for _ in range(self.levels - 1))
            self.dt_ups = torch.nn.ModuleList(torch.nn.Linear(self.rank, self.inner, bias=True) for _ in range(self.levels - 1))
            self.predictors = torch.nn.ModuleList(MH.LowRank(self.inner, self.rank * 2, self.inner) for _ in range(self.levels - 1))
            self.norms = torch.nn.ModuleList(MH.LevelInputNorm(self.inner, config.rms_norm_eps) for _ in range(self.levels - 1))
            self.A_log = torch.nn.Parameter(torch.zeros(self.inner, n))
            self.D = torch.nn.Parameter(torch.ones(self.inner)) if opts["dskip"] else None
            self.out_proj = torch.nn.Linear(self.inner, w, bias=False)
        @torch.no_grad()
        def reinit(self):
            a = torch.arange(1, self.n + 1, dtype=torch.float32) if opts["aspread"] else torch.ones(self.n)
            self.A_log.copy_(torch.log(a).expand(self.inner, -1))
            for level, up in enumerate([self.dt_proj, *self.dt_ups]):
                torch.nn.init.uniform_(up.weight, -self.rank**-0.5, self.rank**-0.5)
                lo, hi = (0.001, 0.1) if self.bands is None else (1.0 / self.bands[level][1], 1.0 / self.bands[level][0])
                dt = torch.exp(torch.rand(self.inner) * (math.log(hi) - math.log(lo)) + math.log(lo)).clamp(min=1e-4)
                up.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            if opts["dtzero"]:  # Harmonic's TimescaleLinear: the gate starts data-independent
                for up in [self.dt_proj, *self.dt_ups]:
                    torch.nn.init.zeros_(up.weight)
            if not opts["alearn"]:
                self.A_log.requires_grad_(False)
            if self.conv is not None:
                if opts["convinit"] == "identity":  # Harmonic's ShortConv: the current input only
                    torch.nn.init.zeros_(self.conv.weight); self.conv.weight[:, 0, -1] = 1.0
                else:
                    torch.nn.init.kaiming_uniform_(self.conv.weight, a=math.sqrt(5))
                torch.nn.init.zeros_(self.conv.bias)
            if opts["outinit"] == "kaiming":  # else the model's normal(0, initializer_range), as Harmonic's o_proj
                torch.nn.init.kaiming_uniform_(self.out_proj.weight, a=math.sqrt(5))
        def forward(self, x, state=None, mask=None):
            from hallamonic.modeling.hallamonic_selective_scan import selective_scan
            batch, length, _ = x.shape
            xz = self.in_proj(x)
            u, z = (xz.chunk(2, dim=-1) if opts["z"] else (xz, None))  # (B, L, E)
            if self.conv is not None:
                u = self.conv(u.transpose(1, 2))[..., :length].transpose(1, 2)
            if opts["act"]:
                u = torch.nn.functional.silu(u)
            dt, B, C = self.x_proj(u).split([self.rank, self.n * self.heads, self.n * self.heads], dim=-1)
            Bh = B.float().view(batch, length, self.heads, self.n)
            Ch = C.float().view(batch, length, self.heads, self.n) * (self.n**-0.5 if opts["rscale"] else 1.0)
            heads = lambda t: t.reshape(batch, length, self.heads, -1)  # noqa: E731
            if opts["aspread"]:  # A = 1..N per state (Mamba): the (B, L, E, N) state sequence materialised, one level
                step = torch.nn.functional.softplus(self.dt_proj(dt).float())  # (B, L, E)
                la = step.unsqueeze(-1) * -torch.exp(self.A_log.float())  # (B, L, E, N)
                weight = step.unsqueeze(-1) if opts["inw"] == "dt" else -torch.expm1(la)
                per = self.inner // self.heads
                Bn = Bh.unsqueeze(3).expand(-1, -1, -1, per, -1).reshape(batch, length, self.inner, self.n)
                Cn = Ch.unsqueeze(3).expand(-1, -1, -1, per, -1).reshape(batch, length, self.inner, self.n)
                b = weight * Bn * u.float().unsqueeze(-1)  # (B, L, E, N)
                h = diagonal_scan(la.exp().reshape(batch, length, -1), b.reshape(batch, length, -1), None)
                y = (h.view(batch, length, self.inner, self.n) * Cn).sum(-1)
                if self.D is not None:
                    y = y + self.D * u.float()
                y = y.to(x.dtype)
                return self.out_proj(y * torch.nn.functional.silu(z) if z is not None else y), x.new_zeros(batch, 1, 1)
            A = torch.exp(self.A_log[:, 0].float())  # (E,) one decay rate per channel
            below = level_input = u
            total = None
            for level in range(self.levels):
                up = self.dt_proj(dt) if level == 0 else self.dt_ups[level - 1](self.dt_downs[level - 1](level_input))
                step = torch.nn.functional.softplus(up.float())  # (B, L, E)
                la = (-step * A).clamp_min(-MH.MAX_DECAY_RATE)
                weight = step if opts["inw"] == "dt" else -torch.expm1(la)
                y, _ = selective_scan(heads(weight * level_input.float()), heads(la), Bh, Ch, None)
                y = y.reshape(batch, length, self.inner)
                total = y if total is None else total + y
                if level + 1 < self.levels:
                    h_low = y.to(x.dtype)
                    below, level_input = h_low, self.norms[level](below - self.predictors[level](h_low))
            y = total
            if self.D is not None:
                y = y + self.D * u.float()
            y = y.to(x.dtype)
            if z is not None:
                y = y * torch.nn.functional.silu(z)
            return self.out_proj(y), x.new_zeros(batch, 1, 1)
    _replace_mixer(MiniMamba, reseed=11)
if os.environ.get("WRITE_DT"):  # write with dt = -log a (Mamba's input weight) instead of 1 - a
    _level_hooks()
    def write_dt(self, index, log_a, level_input, maps):
        la = log_a.clamp_min(-MH.MAX_DECAY_RATE)
        return log_a, level_input * (-la / -torch.expm1(la)).to(level_input.dtype), maps
    MH.HarmonicBlock._level_pre.append(write_dt)
if os.environ.get("KQ_FROM_U"):  # Mamba's data path: u = act(conv(v_proj x)); write, read and gates all read u, not x
    # (no conv on k / q: as Mamba's B / C come from the conv'd u). U_ACT=silu|none, U_SKIP=1 adds D * u (Mamba's D).
    act = os.environ.get("U_ACT", "silu")
    def init_u(self, config):
        assert config.state_width == config.hidden_size and self.kv_groups == 1 and self.state_size > 1
        self.short_conv = None
        self.v_conv = MH.ShortConv(config.state_width, config.short_conv_size)
        if os.environ.get("U_SKIP"):
            self.u_skip = torch.nn.Parameter(torch.ones(config.state_width))
    _block_extra(init_u)
    def forward_u(self, x, state=None, mask=None):
        assert state is None and mask is None, "sweep option: training only"
        u, _ = self.v_conv(self.v_proj(x), None)  # (B, L, D)
        if act == "silu":
            u = torch.nn.functional.silu(u)
        maps = self._state_maps(self.state_write(u), self.state_read(u))
        below = level_input = u
        total = None
        for level, gate in enumerate(self.gates):
            log_a = gate(level_input)
            h, _ = self._level(log_a, level_input, maps, None, None)
            total = h if total is None else total + h
            if level + 1 < self.num_levels:
                h_low = h.to(x.dtype)
                signal = below - self.predictors[level](h_low) if self.error_signal else h_low
                below, level_input = h_low, self.error_norms[level](signal)
        mixed = total.to(x.dtype)
        if hasattr(self, "u_skip"):
            mixed = mixed + self.u_skip * u
        return self.o_proj(mixed), x.new_zeros(x.shape[0], 1, 1)
    MH.HarmonicBlock.forward = forward_u
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
    f.write(json.dumps({"name": name, "env": {k: v for k, v in os.environ.items() if k in ("MAP_STD", "READ_SCALE", "PER_HEAD_TIMESCALES", "GATE_BIAS_SCALE", "PER_STATE_DECAY", "STREAM_SILU", "HEAD_NORM", "ARCH", "DELTA", "D_SKIP", "GATE_FROM_X", "RESID_SCALE", "PER_LEVEL_MAPS", "LEVEL_SCALE", "RATE_POWER", "QK_NORM", "OUTPUT_SILU", "PARALLEL_LEVELS", "MAMBA_MIXER", "KEY_DECAY", "MINI", "WRITE_DT", "KQ_FROM_U", "U_ACT", "U_SKIP", "CONV_KAIMING", "LEVEL_NORM")}, "flags": flags, "shape": shape, "params": arch.params, "ctx": ctx, "valid": rec.get("valid_bits"), "test": rec["bits"], "s": rec["train_seconds"]}) + "\n")
