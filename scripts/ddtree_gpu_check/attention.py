"""SGLang's Triton extend attention (the Triton backend's target-verify kernel) with a DDTree
tree mask, against a dense float32 reference.

The kernel files come from the release wheel (carried): ``kernels/ops/attention/
extend_attention.py`` and the two SGLang modules it imports (``decode_attention.py``,
``score_mod.py``), loaded under their own module names. Their package ``__init__`` files
are not run (they import the kernel registry), and the two server modules they import are
replaced by our stand-ins, which give the values those functions give on this machine:

- ``sglang.srt.utils``: ``is_cuda`` / ``is_hip`` / ``is_gfx95_supported`` /
  ``is_gfx1250_supported`` / ``get_device_core_count`` with the bodies of
  ``srt/utils/common.py`` (torch's CUDA and HIP flags; False off ROCm);
- ``sglang.srt.environ``: ``envs``, whose flags refuse to be read. On CUDA the extend path
  reads none (every read sits behind ``_is_hip`` / ``_is_gfx95``); a release that starts
  reading one fails here by name instead of running on a made-up default.

The call is the backend's for target verify (triton_backend.py ``forward_extend``):
``extend_attention_fwd(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
custom_mask, causal=True, mask_indptr, max_extend_len, 1.0, 1.0, sm_scale)`` with the
mask laid out per request as n rows of (prefix + n) cells (``mask_indptr`` = cumsum of
n * (prefix + n)), uint8 like the backend's preallocated buffer. On CUDA: bfloat16, real
shapes (32 query / 8 KV heads, head dim 128). Off CUDA (the dry run): Triton's interpreter
(TRITON_INTERPRET=1, set by run.py before Triton is imported), float32 (the interpreter's
bfloat16 is not usable), small shapes.
"""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from . import ddtree as dd

ATTENTION_PKG = "sglang.kernels.ops.attention"


class _EnvFlag:
    def __init__(self, name: str):
        self.name = name

    def get(self):
        raise RuntimeError(f"{self.name}: the GPU check's stand-in for sglang.srt.environ does "
                           "not know this flag, and the Triton path it runs reads it")


class _Envs:
    def __getattr__(self, name: str) -> _EnvFlag:
        if name.startswith("__"):
            raise AttributeError(name)
        return _EnvFlag(name)


def _utils_standin() -> types.ModuleType:
    mod = types.ModuleType("sglang.srt.utils")
    mod.__doc__ = "ddtree-deploy GPU check: stand-in for sglang.srt.utils (see attention.py)"
    mod.is_hip = lambda: torch.version.hip is not None
    mod.is_cuda = lambda: torch.cuda.is_available() and torch.version.cuda is not None

    def _gcn(*archs):
        return lambda: bool(torch.version.hip) and any(
            a in torch.cuda.get_device_properties(0).gcnArchName for a in archs)

    mod.is_gfx95_supported = _gcn("gfx95")
    mod.is_gfx1250_supported = _gcn("gfx1250")

    def get_device_core_count(device_id: int = 0) -> int:
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(device_id).multi_processor_count
        return 0

    mod.get_device_core_count = get_device_core_count
    return mod


def load_extend_attention(release_root: Path):
    """The wheel's extend_attention module, loaded from the carried folder."""
    existing = sys.modules.get("sglang")
    if existing is not None and not getattr(existing, "__ddtree_gpu_check__", False):
        raise RuntimeError(f"an SGLang is already imported ({getattr(existing, '__file__', '?')})"
                           "; the check loads the carried release files in a fresh process")
    root = Path(release_root) / "sglang"

    def package(name: str, path) -> None:
        if name in sys.modules:
            return
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)] if path is not None else []
        mod.__ddtree_gpu_check__ = True
        sys.modules[name] = mod

    package("sglang", root)
    package("sglang.kernels", root / "kernels")
    package("sglang.kernels.ops", root / "kernels" / "ops")
    package(ATTENTION_PKG, root / "kernels" / "ops" / "attention")
    package("sglang.srt", None)
    env = types.ModuleType("sglang.srt.environ")
    env.envs = _Envs()
    sys.modules.setdefault("sglang.srt.environ", env)
    sys.modules.setdefault("sglang.srt.utils", _utils_standin())
    return importlib.import_module(f"{ATTENTION_PKG}.extend_attention")


@dataclass(frozen=True)
class Shape:
    label: str
    cfg: dd.Config  # the tree: budget, top-K, block, batch
    heads: int
    kv_heads: int
    head_dim: int
    max_prefix: int
    dtype: torch.dtype
    atol: float


def shapes(on_gpu: bool):
    if on_gpu:
        return [
            Shape("default tree", dd.Config("default", 64, 8, 16, 4), 32, 8, 128, 1000,
                  torch.bfloat16, 3e-2),
            Shape("budget 256", dd.Config("budget 256", 256, 8, 16, 2), 16, 2, 128, 600,
                  torch.bfloat16, 3e-2),
        ]
    return [Shape("small tree (interpreter)", dd.Config("small", 8, 3, 5, 2), 4, 2, 16, 20,
                  torch.float32, 1e-4)]


def width_shape(cfg: dd.Config, on_gpu: bool) -> Shape:
    """The attention shape of a schedule width (checks_schedule): its tree, GPU or interpreter
    sizes."""
    if on_gpu:
        return Shape(f"{cfg.label}, width {cfg.n}", cfg, 32, 8, 128, 1000, torch.bfloat16, 3e-2)
    return Shape(f"{cfg.label}, width {cfg.n} (interpreter)", cfg, 4, 2, 16, 20, torch.float32,
                 1e-4)


def _tree(utils, shape: Shape, device, seed: int, layout=None):
    """DDTree's tree for the shape (or ``layout``, one the worker built) and prefix lengths."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    cfg = shape.cfg
    logits = torch.randn(cfg.batch, cfg.drafted, 64, generator=gen) * 3
    roots = torch.randint(0, 64, (cfg.batch,), generator=gen)
    prefix = torch.randint(1, shape.max_prefix, (cfg.batch,), generator=gen)
    if layout is None:
        logprobs, tokens = utils.topk_logprobs(logits, cfg.topk)
        layout = utils.build_ddtree(logprobs.to(device), tokens.to(device), roots.to(device),
                                    cfg.budget)
    return layout, prefix.to(device), gen


def dense_reference(q, k, v, k_buf, v_buf, kv_indptr, kv_indices, prefix, rows, n, sm_scale):
    """softmax(q k^T * scale, masked) v per request in float32; rows [bs, n, n] bool: which
    tree nodes each node sees (the prefix is always visible)."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(prefix.shape[0]):
        idx = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])]
        keys = torch.cat([k_buf[idx], k[b * n:(b + 1) * n]]).float().repeat_interleave(group, 1)
        vals = torch.cat([v_buf[idx], v[b * n:(b + 1) * n]]).float().repeat_interleave(group, 1)
        qs = q[b * n:(b + 1) * n].float()
        seen = torch.cat([torch.ones(n, idx.shape[0], dtype=torch.bool, device=q.device),
                          rows[b]], dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, keys) * sm_scale
        scores = scores.masked_fill(~seen.unsqueeze(0), float("-inf"))
        out[b * n:(b + 1) * n] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vals)
    return out


def check_attention(report, ea_module, utils, device, shape: Shape, seed: int,
                    layout=None) -> bool:
    name = (f"Triton extend attention with the tree mask vs dense reference: {shape.label} "
            f"(batch {shape.cfg.batch}, {shape.cfg.n} verify tokens, {shape.heads}/"
            f"{shape.kv_heads} heads, dim {shape.head_dim}, {str(shape.dtype)[6:]})")
    utils = utils or dd.real().ddtree_utils
    layout, prefix, gen = _tree(utils, shape, device, seed, layout)
    bs, n, dt = shape.cfg.batch, shape.cfg.n, shape.dtype
    total = int(prefix.sum())
    slots = total + 64

    def rnd(*size):
        return (torch.randn(*size, generator=gen)).to(device=device, dtype=dt)

    q, k, v = rnd(bs * n, shape.heads, shape.head_dim), rnd(bs * n, shape.kv_heads,
                                                           shape.head_dim), \
        rnd(bs * n, shape.kv_heads, shape.head_dim)
    k_buf, v_buf = rnd(slots, shape.kv_heads, shape.head_dim), rnd(slots, shape.kv_heads,
                                                                   shape.head_dim)
    kv_indices = torch.randperm(slots, generator=gen)[:total].to(device)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = prefix.cumsum(0)
    qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=device)
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    mask_indptr[1:] = (n * (prefix + n)).cumsum(0)
    mask = utils.flat_mask_for_sglang(layout, prefix, total).to(torch.uint8)
    o = torch.empty_like(q)
    sm_scale = shape.head_dim ** -0.5
    ea_module.extend_attention_fwd(q, k, v, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                                   mask, True, mask_indptr, n, 1.0, 1.0, sm_scale)
    ref = dense_reference(q, k, v, k_buf, v_buf, kv_indptr, kv_indices, prefix,
                          layout.tree_mask, n, sm_scale)
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(bs, n, n)
    # The wrong mask the comparison must tell apart: a chain's (causal), or, where the tree
    # is a chain (a top-K 1 schedule entry), every node seeing every node.
    is_chain = bool(torch.equal(layout.tree_mask.bool(), causal))
    wrong = torch.ones_like(causal) if is_chain else causal
    chain = dense_reference(q, k, v, k_buf, v_buf, kv_indptr, kv_indices, prefix, wrong, n,
                            sm_scale)
    err = float((o.float() - ref).abs().max())
    power = float((chain - ref).abs().max())  # how far the wrong mask would land
    detail = (f"max |triton - reference| {err:.2e} (tolerance {shape.atol:.0e}); "
              f"{'no mask (the tree is a chain)' if is_chain else 'a causal mask'} instead of "
              f"the tree's would be off by {power:.2e}")
    if not err <= shape.atol:
        return report.record("FAIL", name, detail)
    if not power > 10 * shape.atol:
        return report.record("FAIL", name, detail + ": the comparison cannot tell the masks apart")
    return report.record("PASS", name, detail)
