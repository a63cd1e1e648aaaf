"""The recurrent layer kinds of tests/v2_hybrid_probe.py (GDN, KDA, Mamba2): their float64
parameters, SGLang's config class / cache params / layer / backend for each, the verify call as
the SGLang model makes it, the pool layout, and the sequential reference re-derived from SGLang's
kernels' math. Run inside the test host (imports SGLang inside the methods only; module level is
stdlib-only).
"""

from __future__ import annotations


# ---------------------------------------------------------------------------------------------
# The recurrent kinds: parameters, SGLang's cache params and layer, the sequential reference


class _DeltaRuleKind:
    """GDN and KDA: conv1d (SiLU) over cat(q, k, v), then the gated delta rule (the math of
    SGLang's fused_sigmoid_gating_delta_rule_update, re-derived here in float64)."""

    name = "gdn"
    heads_k = 2  # query/key heads
    heads_v = 4  # value heads (GQA: 2 value heads per key head)
    dk = 8
    dv = 8
    conv_kernel = 4

    def __init__(self, torch):
        self.torch = torch
        self.q_dim = self.heads_k * self.dk
        self.k_dim = self.heads_k * self.dk
        self.v_dim = self.heads_v * self.dv
        self.conv_dim = self.q_dim + self.k_dim + self.v_dim

    # -- parameters (float64) ----------------------------------------------------------
    def gate_width(self):
        return self.heads_v  # GDN: one gate per value head

    def params(self, g, hidden):
        torch = self.torch
        r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
        return {
            "qkv": r(hidden, self.conv_dim) / hidden**0.5,
            "a": r(hidden, self.gate_width()) / hidden**0.5,
            "b": r(hidden, self.heads_v) / hidden**0.5,
            "conv_w": r(self.conv_dim, self.conv_kernel) * 0.5,
            "conv_b": r(self.conv_dim) * 0.1,
            "A_log": r(self.heads_v) * 0.3 - 3.0,  # slow decay: a state error lasts
            "dt_bias": r(self.gate_width()) * 0.3,
            "o": r(self.heads_v * self.dv, hidden) * 3 / (self.heads_v * self.dv) ** 0.5,
            "up": r(hidden, 2 * hidden) / hidden**0.5,
            "down": r(2 * hidden, hidden) / (2 * hidden) ** 0.5,
        }

    # -- SGLang's objects --------------------------------------------------------------
    def hf_config(self, layers):
        from sglang.srt.configs import Qwen3NextConfig

        types = ["linear_attention" if k == "rec" else "full_attention" for k in layers]
        return Qwen3NextConfig(
            vocab_size=24, hidden_size=32, num_hidden_layers=len(layers), layer_types=types,
            linear_num_key_heads=self.heads_k, linear_num_value_heads=self.heads_v,
            linear_key_head_dim=self.dk, linear_value_head_dim=self.dv,
            linear_conv_kernel_dim=self.conv_kernel, num_attention_heads=2, num_key_value_heads=2,
            head_dim=16)

    def cache_params(self, layer_ids):
        return _mamba2_cache_params(
            self, layer_ids, intermediate_size=self.v_dim, n_groups=self.heads_k,
            num_heads=self.heads_v, head_dim=self.dv, state_size=self.dk,
            conv_kernel=self.conv_kernel, conv_shard_groups=[self.k_dim, self.k_dim, self.v_dim])

    def backend_class(self):
        from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

        return GDNAttnBackend

    def layer(self, layer_id, p):
        from sglang.srt.layers.radix_linear_attention import RadixLinearAttention

        return RadixLinearAttention(
            layer_id=layer_id, num_q_heads=self.heads_k, num_k_heads=self.heads_k,
            num_v_heads=self.heads_v, head_q_dim=self.dk, head_k_dim=self.dk, head_v_dim=self.dv,
            conv_weights=p["conv_w"], bias=p["conv_b"], activation="silu", A_log=p["A_log"],
            dt_bias=p["dt_bias"])

    # -- pool layout <-> the reference's (conv window [conv_dim, K-1] oldest first, SSM
    #    state [HV, V, K]) --------------------------------------------------------------
    def pool_state(self, pool, slot):
        cache = pool.mamba_cache
        return cache.conv[0][0, slot].clone(), cache.temporal[0, slot].clone()

    def write_pool_state(self, pool, slot, state):
        conv, ssm = state
        cache = pool.mamba_cache
        cache.conv[0][0, slot] = conv
        cache.temporal[0, slot] = ssm

    # -- the verify forward: SGLang's HybridLinearAttnBackend, as the GDN/KDA models call it
    def verify(self, backend, layer, fb, x, p):
        core = backend.forward(layer=layer, forward_batch=fb, mixed_qkv=x @ p["qkv"],
                               a=x @ p["a"], b=x @ p["b"])
        return core.reshape(x.shape[0], -1).to(x.dtype) @ p["o"]

    # -- the sequential reference ------------------------------------------------------
    def project(self, p, x):
        return x @ p["qkv"], x @ p["a"], x @ p["b"]

    def init_state(self):
        torch = self.torch
        return (torch.zeros(self.conv_dim, self.conv_kernel - 1, dtype=torch.float64),
                torch.zeros(self.heads_v, self.dv, self.dk, dtype=torch.float64))

    def gate(self, p, a_t, hv):
        torch = self.torch
        x = a_t[hv] + p["dt_bias"][hv]
        softplus = torch.where(x <= 20.0, torch.log1p(torch.exp(x)), x)
        return -torch.exp(p["A_log"][hv]) * softplus  # scalar (GDN)

    def step(self, p, state, mixed_t, a_t, b_t):
        """One token: (the layer's output row [hidden], new state)."""
        torch = self.torch
        window, ssm = state
        taps = torch.cat([window, mixed_t.unsqueeze(1)], 1)  # [conv_dim, K]
        y = (taps * p["conv_w"]).sum(1) + p["conv_b"]
        y = y / (1 + torch.exp(-y))  # SiLU
        q = y[: self.q_dim].view(self.heads_k, self.dk)
        k = y[self.q_dim:self.q_dim + self.k_dim].view(self.heads_k, self.dk)
        v = y[self.q_dim + self.k_dim:].view(self.heads_v, self.dv)
        out, new_ssm = [], torch.empty_like(ssm)
        group = self.heads_v // self.heads_k
        for hv in range(self.heads_v):
            qh, kh = q[hv // group], k[hv // group]
            qh = qh / torch.sqrt((qh * qh).sum() + 1e-6) * self.dk**-0.5
            kh = kh / torch.sqrt((kh * kh).sum() + 1e-6)
            g = self.gate(p, a_t, hv)
            beta = torch.sigmoid(b_t[hv])
            h = ssm[hv].T.clone()  # [K, V]
            h = h * torch.exp(g).reshape(-1, 1) if g.dim() else h * torch.exp(g)
            vv = (v[hv] - (h * kh[:, None]).sum(0)) * beta
            h = h + kh[:, None] * vv[None, :]
            out.append((h * qh[:, None]).sum(0))
            new_ssm[hv] = h.T
        return torch.cat(out) @ p["o"], (taps[:, 1:].clone(), new_ssm)


def _mamba2_cache_params(kind, layer_ids, **shape):
    """SGLang's Mamba2CacheParams for one TP rank, float64 states (GDN's and Mamba2's layout)."""
    torch = kind.torch
    from sglang.srt.configs.mamba_utils import (
        Mamba2CacheParams,
        Mamba2StateDType,
        Mamba2StateShape,
    )

    import inspect

    if "conv_shard_groups" not in inspect.signature(Mamba2StateShape.create).parameters:
        # 0.5.14 - 0.5.15.post1 shard the conv channels by n_groups alone (the groups'
        # split only matters across TP ranks: one rank here).
        shape.pop("conv_shard_groups", None)
    built = Mamba2StateShape.create(tp_world_size=1, **shape)
    assert built.conv_dim == kind.conv_dim
    return Mamba2CacheParams(shape=built, layers=list(layer_ids),
                             dtype=Mamba2StateDType(conv=torch.float64, temporal=torch.float64))


class _KDAKind(_DeltaRuleKind):
    """Kimi Delta Attention: the same delta rule with a per-key-channel gate; conv states stored
    [K-1, dim] in the pool (KimiLinearStateShape)."""

    name = "kda"
    heads_k = 2
    heads_v = 2
    dk = 8
    dv = 8

    def gate_width(self):
        return self.heads_v * self.dk  # one gate per (value head, key channel)

    def gate(self, p, a_t, hv):
        torch = self.torch
        sl = slice(hv * self.dk, (hv + 1) * self.dk)
        x = a_t[sl] + p["dt_bias"][sl]
        softplus = torch.where(x <= 20.0, torch.log1p(torch.exp(x)), x)
        return -torch.exp(p["A_log"][hv]) * softplus  # [K]

    def hf_config(self, layers):
        from sglang.srt.configs import KimiLinearConfig

        kda = [i + 1 for i, k in enumerate(layers) if k == "rec"]
        full = [i + 1 for i, k in enumerate(layers) if k != "rec"]
        return KimiLinearConfig(
            vocab_size=24, hidden_size=32, num_hidden_layers=len(layers), num_attention_heads=2,
            linear_attn_config={"kda_layers": kda, "full_attn_layers": full,
                                "num_heads": self.heads_v, "head_dim": self.dv,
                                "short_conv_kernel_size": self.conv_kernel})

    def cache_params(self, layer_ids):
        torch = self.torch
        from sglang.srt.configs.mamba_utils import (
            KimiLinearCacheParams,
            KimiLinearStateShape,
            Mamba2StateDType,
        )

        shape = KimiLinearStateShape.create(tp_world_size=1, num_heads=self.heads_v,
                                            head_dim=self.dv, conv_kernel_size=self.conv_kernel)
        assert shape.conv[0] == (self.conv_kernel - 1, self.conv_dim), shape.conv
        return KimiLinearCacheParams(shape=shape, layers=list(layer_ids),
                                     dtype=Mamba2StateDType(conv=torch.float64,
                                                            temporal=torch.float64))

    def backend_class(self):
        from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend

        return KDAAttnBackend

    def pool_state(self, pool, slot):
        conv, ssm = super().pool_state(pool, slot)
        return conv.T.contiguous(), ssm

    def write_pool_state(self, pool, slot, state):
        conv, ssm = state
        super().write_pool_state(pool, slot, (conv.T, ssm))


class _Mamba2Kind:
    """Mamba2 (Nemotron-H's mixer): SGLang's own MambaMixer2 (in_proj, Triton conv, Triton
    selective_state_update, gated RMS norm, out_proj) behind Mamba2AttnBackend; the reference
    re-derives its math in float64."""

    name = "mamba2"
    heads = 4
    head_dim = 8
    dstate = 8
    groups = 1
    conv_kernel = 4

    def __init__(self, torch):
        self.torch = torch
        self.inter = self.heads * self.head_dim
        self.conv_dim = self.inter + 2 * self.groups * self.dstate
        self.mixer = None

    def params(self, g, hidden):
        torch = self.torch
        r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
        return {
            "in": r(self.inter + self.conv_dim + self.heads, hidden) / hidden**0.5,
            "conv_w": r(self.conv_dim, self.conv_kernel) * 0.5,
            "conv_b": r(self.conv_dim) * 0.1,
            # SGLang keeps A (= -exp(A_log)) in float32: the reference uses the same values.
            "A": (-torch.exp(r(self.heads) * 0.3 - 3.0)).float().double(),  # slow decay
            "D": r(self.heads) * 0.5,
            "dt_bias": r(self.heads) * 0.3,
            "norm": 1.0 + r(self.inter) * 0.1,
            "out": r(hidden, self.inter) * 3 / self.inter**0.5,
            "up": r(hidden, 2 * hidden) / hidden**0.5,
            "down": r(2 * hidden, hidden) / (2 * hidden) ** 0.5,
        }

    def hf_config(self, layers):
        from sglang.srt.configs import NemotronHConfig

        return NemotronHConfig(
            vocab_size=24, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
            head_dim=16, hybrid_override_pattern="".join("M" if k == "rec" else "*" for k in layers),
            mamba_num_heads=self.heads, mamba_head_dim=self.head_dim, mamba_n_groups=self.groups,
            ssm_state_size=self.dstate, mamba_d_conv=self.conv_kernel)

    def cache_params(self, layer_ids):
        return _mamba2_cache_params(
            self, layer_ids, intermediate_size=self.inter, n_groups=self.groups,
            num_heads=self.heads, head_dim=self.head_dim, state_size=self.dstate,
            conv_kernel=self.conv_kernel)

    def backend_class(self):
        from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend

        return Mamba2AttnBackend

    def layer(self, layer_id, p):
        """SGLang's MambaMixer2 (one TP rank, float64 weights = p)."""
        torch = self.torch
        from sglang.srt.layers.attention.mamba.mamba import MambaMixer2

        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            mixer = MambaMixer2(self.cache_params([layer_id]), hidden_size=p["in"].shape[1],
                                use_conv_bias=True, use_bias=False, n_groups=self.groups,
                                rms_norm_eps=1e-5, activation="silu", use_rms_norm=True,
                                prefix=f"layers.{layer_id}.mixer")
        finally:
            torch.set_default_dtype(default)
        with torch.no_grad():
            mixer.in_proj.weight.copy_(p["in"])
            mixer.conv1d.weight.copy_(p["conv_w"].unsqueeze(1))
            mixer.conv1d.bias.copy_(p["conv_b"])
            mixer.A.copy_(p["A"])
            mixer.D.copy_(p["D"])
            mixer.dt_bias.copy_(p["dt_bias"])
            mixer.norm.weight.copy_(p["norm"])
            mixer.out_proj.weight.copy_(p["out"])
        mixer.requires_grad_(False)  # inference, as SGLang loads it
        mixer.layer_id = layer_id
        return mixer

    def verify(self, backend, mixer, fb, x, p):
        # As NemotronH's mamba layer calls it (models/nemotron_h.py _forward_mamba).
        return backend.linear_attn_backend.forward(
            mixer=mixer, layer_id=mixer.layer_id, hidden_states=x, output=None,
            forward_batch=fb, use_triton_causal_conv=True)

    pool_state = _DeltaRuleKind.pool_state
    write_pool_state = _DeltaRuleKind.write_pool_state

    def project(self, p, x):
        return (x @ p["in"].T,)

    def init_state(self):
        torch = self.torch
        return (torch.zeros(self.conv_dim, self.conv_kernel - 1, dtype=torch.float64),
                torch.zeros(self.heads, self.head_dim, self.dstate, dtype=torch.float64))

    def step(self, p, state, proj_t):
        torch = self.torch
        window, ssm = state
        gate, xbc, dt = torch.split(proj_t, [self.inter, self.conv_dim, self.heads])
        taps = torch.cat([window, xbc.unsqueeze(1)], 1)
        y = (taps * p["conv_w"]).sum(1) + p["conv_b"]
        y = y / (1 + torch.exp(-y))
        xs, B, C = torch.split(y, [self.inter, self.groups * self.dstate,
                                   self.groups * self.dstate])
        xs = xs.view(self.heads, self.head_dim)
        B, C = B.view(self.groups, self.dstate), C.view(self.groups, self.dstate)
        new_ssm, out = torch.empty_like(ssm), []
        for h in range(self.heads):
            g = h // (self.heads // self.groups)
            d = dt[h] + p["dt_bias"][h]
            d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
            new_ssm[h] = ssm[h] * torch.exp(p["A"][h] * d) + (d * xs[h])[:, None] * B[g][None, :]
            out.append((new_ssm[h] * C[g][None, :]).sum(-1) + p["D"][h] * xs[h])
        z = torch.cat(out) * (gate / (1 + torch.exp(-gate)))
        z = z * torch.rsqrt(z.pow(2).mean() + 1e-5) * p["norm"]
        return z @ p["out"].T, (taps[:, 1:].clone(), new_ssm)


KINDS = {"gdn": _DeltaRuleKind, "kda": _KDAKind, "mamba2": _Mamba2Kind}
