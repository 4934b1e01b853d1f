"""Attention-transfer probe: which HarmonicBlock variant reproduces SmolLM2's attention best?

Phase 1 trains every layer independently on the teacher's own attention inputs/outputs, so a few
layers trained alone measure what a variant does to phase 1 at a fraction of its cost. For each
variant: build the block of layers LAYERS from the teacher's attention (init_from_attention),
calibrate like the pipeline, train STEPS AdamW steps on TRAIN_SEQS x 512 training tokens, report
the normalised MSE on 2 x 512 held-out tokens (the pipeline's probe) before and after.

Variants (the feature map phi is applied to the write / read vectors per head):
  identity/none  - today's block: y = S q / sqrt(N)
  identity/rms   - plus a per-head RMSNorm of each level's read-out (GLA-style)
  elu/den        - phi = elu + 1, read-out divided by the same scan over ones (normalised)
  taylor/den     - phi(x) = [1, x, x (x) x / sqrt 2] scaled so phi(q).phi(k) = 1 + s + s^2/2 with s = q.k / sqrt(N):
                   Based's second-order Taylor of exp(s), on the teacher's full q / k (1 + N + N(N+1)/2 features), normalised;
                   taylor/den/features=M first projects q / k per head to M < N dims (learnable, started at their
                   top principal directions), 1 + M + M(M+1)/2 features
  hedgehog/den   - phi(x) = [softmax(Wx), softmax(-Wx)] per head, W learnable (identity init), normalised
  softmax/den    - phi(x) = softmax(Wx) only (N features, half of Hedgehog's), normalised
  identity/delta - each level's state follows the gated delta rule instead of a decayed sum:
                   S_t = a_t S_{t-1} + beta_t (u_t - a_t S_{t-1} k_t) k_t^T with k_t unit-norm and
                   beta_t = sigmoid(w.x_t + c) per head (DeltaNet / Gated DeltaNet: a write replaces
                   what the key held instead of adding to it); one decay per head (the mean of its
                   channels' log a), chunked (WY form) with a plain-loop twin, probe only
  identity/headdecay - the delta variant's control: today's decayed sum with that one decay per head

Options after a third slash: hierarchy=false, short_conv_size=4, timescale_bands=[[1,64],...], lr=5e-3,
steps=180 (e.g. identity/none/short_conv_size=4/lr=5e-3).

Usage: python evals/results/smollm2-135m-transfer-probe/probe.py [variant ...]
(needs outputs/smollm2-n64/training/tokens.npy from evals/smollm2_selective.sh)
"""

from __future__ import annotations

import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hallamonic.convert.phases import capture_attention_io
from hallamonic.convert.pipeline import _transfer_probe, load_base_model
from hallamonic.convert.recipe import load_recipe
from hallamonic.convert.surgery import student_config
from hallamonic.loading import smollm2_gguf_path
from hallamonic.modeling.hallamonic_selective_scan import selective_scan
import types

from hallamonic.modeling.modeling_hallamonic import HallamonicPreTrainedModel, HarmonicBlock, TaylorFeatureMap
from hallamonic.training.packing import PackedBatches

LAYERS = [3, 11, 19, 27]
TRAIN_SEQS = 48
STEPS = 60
BATCH = 4
LR = 2e-3


class ProbeBlock(HarmonicBlock):
    def __init__(self, config, feature: str, normalise: str, layer_idx: int = 0, sink: bool = False, densink: bool = False,
                 features: int = 0):
        super().__init__(config, layer_idx)
        self.feature, self.normalise = feature, normalise
        if densink:  # a sink in the normalised read-out's denominator: a fixed, never-decaying key
            # (the teacher's first-token key; set by the caller), weighted like the current token
            self.sink_key = nn.Parameter(torch.zeros(config.num_key_value_heads, config.state_size))  # (Hkv, N)
            self.sink_scale = nn.Parameter(torch.zeros(config.num_attention_heads))  # (H,) log weight
        if sink:  # an attention-sink term: per head sigmoid(w.x + c) * v_sink, added before o_proj
            self.sink_gate = nn.Linear(config.hidden_size, config.num_attention_heads)
            self.sink_value = nn.Parameter(torch.zeros(config.num_attention_heads, config.head_dim))
        n = config.state_size
        if feature in ("hedgehog", "softmax"):
            eye = torch.eye(n)
            if features > n:  # M > N softmax logits per half: the identity, then random projections
                extra = torch.randn(features - n, n, generator=torch.Generator().manual_seed(layer_idx)) / n**0.5
                eye = torch.cat([eye, extra])  # (M, N)
            self.fk = nn.Parameter(eye.repeat(config.num_key_value_heads, 1, 1))  # (Hkv, M, N)
            self.fq = nn.Parameter(eye.repeat(config.num_attention_heads, 1, 1))  # (H, M, N)
        if feature == "taylor" and 0 < features < n:  # Based: project q / k to M < N dims before the Taylor map
            basis = torch.linalg.qr(torch.randn(n, features, generator=torch.Generator().manual_seed(layer_idx)))[0].T  # (M, N)
            self.fk = nn.Parameter(basis.repeat(config.num_key_value_heads, 1, 1))  # (Hkv, M, N); set_taylor_basis fits it
            self.fq = nn.Parameter(basis.repeat(config.num_attention_heads, 1, 1))  # (H, M, N)
        if normalise == "delta":  # per query head write strength of the delta rule
            self.beta_proj = nn.Linear(config.hidden_size, config.num_attention_heads)
        if normalise == "rms":
            self.out_norm = nn.Parameter(torch.ones(config.num_attention_heads * config.head_dim))

    def forward(self, x, state=None, mask=None):
        if self.normalise == "delta":
            self._beta = torch.sigmoid(self.beta_proj(x).float())  # (B, L, H)
        y, state = super().forward(x, state, mask)
        if hasattr(self, "sink_gate"):
            sink = torch.sigmoid(self.sink_gate(x)).unsqueeze(-1) * self.sink_value  # (B, L, H, P)
            y = y + F.linear(sink.flatten(2).to(y.dtype), self.o_proj.weight)
        return y, state

    def _phi(self, x, weight):  # x: (B, L, h, N)
        if self.feature == "identity":
            return x
        if self.feature == "elu":
            return F.elu(x) + 1
        if self.feature == "taylor":  # phi(q).phi(k) = 1 + s + s^2 / 2, s = q.k / sqrt(N): exp's second-order Taylor
            xs = x * x.shape[-1] ** -0.25  # xs(q).xs(k) = s
            if weight is not None:  # Based: the M-dim projection first, s = (Wq).(Wk) / sqrt(N)
                xs = torch.einsum("blhn,hmn->blhm", xs, weight)  # (B, L, h, M)
            rows, cols = torch.triu_indices(xs.shape[-1], xs.shape[-1], device=x.device)
            weight = torch.where(rows == cols, 0.5**0.5, 1.0)  # diagonal s_ii^2 / 2, off-diagonal pairs once: 2 s_ij^2 / 2
            square = xs[..., rows] * xs[..., cols] * weight  # (B, L, h, N(N+1)/2)
            return torch.cat([torch.ones_like(xs[..., :1]), xs, square], -1)  # (B, L, h, 1 + N + N(N+1)/2)
        z = torch.einsum("blhn,hmn->blhm", x, weight)
        if self.feature == "softmax":
            return z.softmax(-1)  # (B, L, h, N)
        return torch.cat([z.softmax(-1), (-z).softmax(-1)], -1)  # (B, L, h, 2N)

    @torch.no_grad()
    def set_taylor_basis(self, x):
        """Start the Based projection of every kv group at the top-M principal directions of its
        keys and queries on x (B, L, hidden), so (Wq).(Wk) keeps most of the teacher's q.k (the
        product's ``TaylorFeatureMap.principal_directions``)."""
        write = self.state_write(x).float().reshape(-1, self.num_kv_heads, self.state_size)  # (T, Hkv, N)
        read = self.state_read(x).float().reshape(-1, self.num_kv_heads * self.kv_groups, self.state_size)  # (T, H, N)
        bases = TaylorFeatureMap.principal_directions(write, read, self.fk.shape[1])  # (Hkv, M, N)
        self.fk.copy_(bases)
        self.fq.copy_(bases.repeat_interleave(self.kv_groups, dim=0))

    def _state_maps(self, write, read):
        B, L, _ = write.shape
        n = self.state_size
        k = self._phi(write.float().view(B, L, self.num_kv_heads, n), getattr(self, "fk", None))
        q = self._phi(read.float().view(B, L, -1, n), getattr(self, "fq", None))
        k = k.unsqueeze(3).expand(-1, -1, -1, self.kv_groups, -1).reshape(B, L, -1, k.shape[-1])
        return k, q * k.shape[-1] ** -0.5

    def _level(self, log_a, level_input, maps, state, mask):
        if self.normalise == "delta":
            return self._delta_level(log_a, level_input, maps)
        if self.normalise == "headdecay":  # the delta variant's control: its one decay per head, a plain sum
            log_a = log_a.view(*log_a.shape[:2], -1, self.head_dim).mean(-1, keepdim=True).expand(-1, -1, -1, self.head_dim).reshape(log_a.shape)
        log_a = log_a.clamp_min(-3.0)
        rate = -torch.expm1(log_a)
        b = rate * level_input.float()
        B, L, W = b.shape
        P = self.head_dim
        split = lambda t: t.reshape(B, L, W // P, P)  # noqa: E731
        write, read = maps
        y, new = selective_scan(split(b), split(log_a), write, read, None)
        if self.normalise == "den":
            den, _ = selective_scan(split(rate), split(log_a), write, read, None)
            if hasattr(self, "sink_key"):  # + (1 - a_t) exp(lambda) phi(q_t).phi(k_sink): no decay
                key = self._phi(self.sink_key.float()[None, None], getattr(self, "fk", None))[0, 0]  # (Hkv, F)
                key = key.repeat_interleave(self.kv_groups, dim=0)  # (H, F)
                sink = (read * key).sum(-1) * self.sink_scale.float().exp()  # (B, L, H)
                den = den + split(rate) * sink.unsqueeze(-1)
            y = y / den.clamp_min(1e-6)
        elif self.normalise == "rms":
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
            y = y * split(self.out_norm.view(1, 1, -1).expand(B, L, -1)).float()
        return y.reshape(B, L, W), new


    def _delta_level(self, log_a, level_input, maps):
        B, L, W = level_input.shape
        P = self.head_dim
        u = level_input.float().view(B, L, W // P, P)  # (B, L, H, P)
        a = log_a.clamp_min(-3.0).exp().view(B, L, W // P, P)  # (B, L, H, P) decay per value channel
        write, read = maps  # (B, L, H, N) each
        k = F.normalize(write, dim=-1)
        head_log_a = log_a.clamp_min(-3.0).view(B, L, W // P, P).mean(-1)  # (B, L, H): one decay per head
        return delta_rule_chunked(u, head_log_a, k, read, self._beta)


def delta_rule(u, a, k, q, beta):
    """Gated delta rule, a plain loop over time (the readable reference; no fast path).
    u, a: (B, L, H, P); k (unit rows), q: (B, L, H, N); beta: (B, L, H) -> y (B, L, H*P), final state."""
    B, L, H, P = u.shape
    S = u.new_zeros(B, H, P, k.shape[-1])  # (B, H, P, N)
    ys = []
    for t in range(L):
        S = S * a[:, t, :, :, None]  # decay each value channel's row
        miss = u[:, t] - torch.einsum("bhpn,bhn->bhp", S, k[:, t])  # what the key does not yet return: (B, H, P)
        S = S + (beta[:, t, :, None] * miss)[..., None] * k[:, t, :, None, :]  # (B, H, P, N)
        ys.append(torch.einsum("bhpn,bhn->bhp", S, q[:, t]))
    return torch.stack(ys, 1).reshape(B, L, H * P), S.reshape(B, H * P, -1)


def delta_rule_chunked(u, log_a, k, q, beta, chunk: int = 64):
    """The gated delta rule with ONE decay per head (Gated DeltaNet), in chunks: within a chunk the
    writes' corrections solve a unit lower-triangular system (the WY form), between chunks the
    (B, H, N, P) state is carried. Equals ``delta_rule`` with a broadcast over P (tested in
    place). u: (B, L, H, P); log_a, beta: (B, L, H); k (unit rows), q: (B, L, H, N)."""
    B, L, H, P = u.shape
    N = k.shape[-1]
    pad = (-L) % chunk
    if pad:  # padded tokens: no decay, no write, outputs dropped
        u, k, q = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (u, k, q))
        log_a, beta = (F.pad(t, (0, 0, 0, pad)) for t in (log_a, beta))
    n = u.shape[1] // chunk
    to_chunks = lambda t: t.reshape(B, n, chunk, H, -1).transpose(2, 3)  # noqa: E731 - (B, n, H, C, *)
    u, k, q = to_chunks(u), to_chunks(k), to_chunks(q)
    G = to_chunks(log_a.unsqueeze(-1)).squeeze(-1).cumsum(-1)  # (B, n, H, C) cumulative log decay
    b = to_chunks(beta.unsqueeze(-1)).squeeze(-1)  # (B, n, H, C)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=u.device).tril()
    ratio = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()  # (B, n, H, C, C) gamma_t / gamma_s, s <= t
    kk = k @ k.transpose(-1, -2)  # (B, n, H, C, C)
    A = (b.unsqueeze(-1) * ratio * kk).masked_fill(causal.diag().diag_embed() | ~causal, 0.0)  # strictly lower
    eye = torch.eye(chunk, dtype=u.dtype, device=u.device)
    rhs = torch.cat([b.unsqueeze(-1) * u, (b * G.exp()).unsqueeze(-1) * k], dim=-1)  # (B, n, H, C, P+N)
    solved = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    W, Kc = solved[..., :P], solved[..., P:]  # E = W - Kc M0
    qk = (q @ k.transpose(-1, -2)) * ratio  # (B, n, H, C, C)
    decay_q = G.exp().unsqueeze(-1) * q  # (B, n, H, C, N)
    last = G[..., -1:]  # (B, n, H, 1)
    decay_k = (last - G).exp().unsqueeze(-1) * k  # (B, n, H, C, N)
    M = u.new_zeros(B, H, N, P)
    outs = []
    for c in range(n):
        E = W[:, c] - Kc[:, c] @ M  # (B, H, C, P) the corrected writes
        outs.append(decay_q[:, c] @ M + qk[:, c] @ E)  # (B, H, C, P)
        M = last[:, c].exp().unsqueeze(-1) * M + decay_k[:, c].transpose(-1, -2) @ E
    y = torch.stack(outs, 1).transpose(2, 3).reshape(B, n * chunk, H * P)[:, :L]
    return y, M.transpose(-1, -2).reshape(B, H * P, N)


def parse_variant(variant: str, harmonic):
    """'feature/normalise[/key=value...]' -> feature, normalise, the recipe's harmonic section with
    the block options among the keys replaced, and every key=value given (lr, steps stay strings)."""
    feature, normalise, *extra = variant.split("/")
    overrides = dict(e.split("=") for e in extra)
    casts = {"hierarchy": lambda v: v == "true", "error_signal": lambda v: v == "true", "short_conv_size": int, "timescale_bands": json.loads}
    # delta_layers cleared: the variant's own `normalise` says the rule (the probe's _level handles sum only);
    # recall_layers cleared: every probed layer takes `timescale_bands` (the recipe's, or the variant's)
    harmonic = type(harmonic)(**{**harmonic.__dict__, "delta_layers": [], "recall_layers": [],
                                 **{k: casts[k](v) for k, v in overrides.items() if k in casts}})
    return feature, normalise, harmonic, overrides


def normalised_mse(block, x, y):
    pred = block(x)[0].float()
    return ((pred - y.float()).pow(2).mean() / y.float().pow(2).mean()).item()


def main(variants):
    torch.manual_seed(0)
    torch.set_num_threads(2)
    recipe = load_recipe("smollm2-135m", [f"base.model={smollm2_gguf_path()}", "data.path=../shared/data/fineweb_train.jsonl"])
    teacher, tokenizer = load_base_model(recipe.base.model)
    teacher.eval().requires_grad_(False)
    tokens = np.load("outputs/smollm2-n64/training/tokens.npy")
    seqs = PackedBatches(tokens, 512, seed=0).sequences[:TRAIN_SEQS]
    probe, source = _transfer_probe(recipe, tokens, tokenizer)
    t0 = time.time()
    train_io = {i: ([], []) for i in LAYERS}
    for start in range(0, len(seqs), 4):
        ins, outs = capture_attention_io(teacher, seqs[start : start + 4])
        for i in LAYERS:
            train_io[i][0].append(ins[i]); train_io[i][1].append(outs[i])
    train_io = {i: (torch.cat(a), torch.cat(b)) for i, (a, b) in train_io.items()}
    ins, outs = capture_attention_io(teacher, probe)
    held = {i: (ins[i], outs[i]) for i in LAYERS}
    print(f"captured {len(seqs)} x 512 training + {source} in {time.time() - t0:.0f}s", flush=True)
    results = {}
    for variant in variants:
        feature, normalise, harmonic, overrides = parse_variant(variant, recipe.harmonic)
        lr = float(overrides.get("lr", LR))
        steps = int(overrides.get("steps", STEPS))
        config = student_config(teacher, harmonic)
        row = {}
        t0 = time.time()
        for i in LAYERS:
            torch.manual_seed(i)
            block = ProbeBlock(config, feature, normalise, i)
            for module in block.modules():  # the model's own init (gate timescales, zero up-projections, conv identity)
                HallamonicPreTrainedModel._init_weights(types.SimpleNamespace(config=config), module)
            block.init_from_attention(teacher.model.layers[i].self_attn)
            x_cal, y_cal = train_io[i][0][:2], train_io[i][1][:2]
            with torch.no_grad():  # the pipeline's calibration
                rms = block.value_stream(x_cal).float().pow(2).mean().sqrt().item()
                for norm in block.error_norms:
                    norm.weight.fill_(rms)
                m = block(x_cal)[0].float()
                block.o_proj.weight.mul_((m * y_cal).sum() / (m * m).sum())
            calibrated = normalised_mse(block, *held[i])
            params = [p for p in block.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
            warm = max(steps // 10, 1)
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: (s + 1) / warm if s < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * (s - warm) / (steps - warm)))
            )
            g = torch.Generator().manual_seed(i)
            for step in range(steps):
                idx = torch.randint(0, len(seqs), (BATCH,), generator=g)
                x, y = train_io[i][0][idx], train_io[i][1][idx]
                pred = block(x)[0].float()
                loss = (pred - y.float()).pow(2).mean() / y.float().pow(2).mean()
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step(); sched.step()
            with torch.no_grad():
                row[i] = {"calibrated": calibrated, "trained": normalised_mse(block, *held[i])}
            print(f"  {variant} layer {i}: {row[i]['calibrated']:.3f} -> {row[i]['trained']:.3f}", flush=True)
        mean = {k: sum(r[k] for r in row.values()) / len(row) for k in ("calibrated", "trained")}
        print(f"{variant}: calibrated {mean['calibrated']:.3f} trained {mean['trained']:.3f} ({time.time() - t0:.0f}s)", flush=True)
        results[variant] = {"layers": row, "mean": mean, "seconds": time.time() - t0, "steps": steps, "lr": lr}
        with open("evals/results/smollm2-135m-transfer-probe/results.jsonl", "a") as f:  # one line per variant, as it ends
            f.write(json.dumps({"variant": variant, "train_seqs": TRAIN_SEQS, **results[variant]}) + "\n")
    return results


if __name__ == "__main__":
    variants = sys.argv[1:] or ["identity/none", "identity/rms", "elu/den", "hedgehog/den"]
    main(variants)
