"""GPU check of DDTree on hybrid targets (v2 family, docs/patches-v2.md "Hybrid targets"): SGLang's
recurrent kernels on the TREE path, in bf16, against a sequential float32 reference that walks
each node's own path.

    python scripts/gpu_check_hybrid.py --sglang DIR [--budgets 64,256] [--device cuda|cpu]

``DIR`` holds SGLang's ``sglang/`` package (a release wheel unpacked, e.g. by
``scripts/gpu_check_v2.py install``; 0.5.20 - 0.5.23). Only the four Triton kernel files are
loaded, each by path, so the check needs torch + triton on the GPU machine and nothing of
SGLang's dependencies. Prints ``GPU-HYBRID: {json}`` per check; exit 0 iff all passed, 2 on bad
input. ``--device cpu`` runs the same checks at small shapes in Triton's CPU interpreter (how
tests/integration/test_v2_hybrid.py checks this script without a GPU). `make gpu-check` runs it (budgets 64
and 256 on the GPU, 16 in the dry run) on the files `make gpu-check-dry` carries
(scripts/ddtree_gpu_check/hybrid.py).

The trees are DDTree's own (payload/ddtree_utils.build_ddtree on random draft log-probs: deep,
bushy, full like the v2 worker's), at the verify width budget + 1, batch 4. Checks:

- conv: ``causal_conv1d_update`` with ``retrieve_next_token`` / ``retrieve_next_sibling``: each
  node's output and saved conv window equal the reference over its path, and the
  ``retrieve_parent_token`` it computes equals the tree's parents;
- gdn / kda: ``fused_sigmoid_gating_delta_rule_update`` with those parents (GDN: scalar gate per
  head, KDA: per key channel; head dims 128 as Qwen3-Next / Kimi Linear): each node's output and
  intermediate state, for an fp32 and a bf16 state pool;
- mamba2: ``selective_state_update`` (dt softplus, D, tied head dim) with the parents, fp32 state;
- commit: ``fused_mamba_state_scatter_with_mask`` / ``fused_conv_window_scatter_with_mask`` copy
  each request's ACCEPTED node's state (a random valid node) into its slot;
- control: the GDN kernel handed a chain's parents (i - 1) on the same tree must miss the
  reference by O(1) (else the check could not see a wrong path).

NAMED STAND-INS (import environment only; every kernel is SGLang's): ``sglang.kernels.jit.utils.
is_arch_support_pdl`` answers False (PDL only overlaps launches: "bit-exact (scheduling only)"
in SGLang's own comments), ``sglang.srt.utils`` answers the platform questions from torch,
``get_device_core_count`` from torch's device properties, ``make_ptr_table`` raises (the
multi-type conv scatter is not on this path).
Standard library only at module level.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TAG = "GPU-HYBRID:"
KERNEL_FILES = {
    "conv": ["sglang/kernels/ops/mamba/causal_conv1d_triton.py"],
    "recurrent": ["sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py",
                  "sglang/kernels/ops/attention/fla/fused_sigmoid_gating_recurrent.py"],
    "ssu": ["sglang/kernels/ops/mamba/triton_ops/mamba_ssm.py"],
    "scatter": ["sglang/kernels/ops/mamba/mamba_state_scatter_triton.py"],
}


# The SGLang names the kernel files import, as ``_stub_modules`` answers them (the carry step of
# `make gpu-check-dry` refuses a release whose files import anything else at module level).
STUBBED = {
    "sglang.kernels.jit.utils": {"is_arch_support_pdl"},
    "sglang.srt.utils": {"is_cuda", "is_hip", "is_gfx95_supported", "get_device_sm",
                         "is_sm90_supported"},
    "sglang.srt.utils.common": {"get_device_core_count"},
    "sglang.kernels.ops.memory.ptr_table": {"make_ptr_table"},
}
# The checks of one budget, in the order they run ("control-...": must miss the reference).
CHECKS = ("conv", "gdn-fp32-state", "gdn-bf16-state", "control-chain-parents-fail",
          "kda-fp32-state", "mamba2", "commit")


class BadInput(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Loading SGLang's kernel files without SGLang's package


def _stub_modules(torch) -> None:
    def module(name, **attrs):
        mod = sys.modules.get(name) or types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    cuda = torch.cuda.is_available() and torch.version.hip is None
    major, minor = torch.cuda.get_device_capability() if cuda else (0, 0)

    def core_count(device_id=0):
        return torch.cuda.get_device_properties(device_id).multi_processor_count if cuda else 1

    def no_ptr_table(*a, **k):
        raise RuntimeError("make_ptr_table: stand-in (the multi-type conv scatter is not checked)")

    for name in ("sglang", "sglang.kernels", "sglang.kernels.jit", "sglang.kernels.ops",
                 "sglang.kernels.ops.memory", "sglang.srt"):
        module(name, __path__=[])
    module("sglang.kernels.jit.utils", is_arch_support_pdl=lambda: False)
    module("sglang.srt.utils", __path__=[], is_cuda=lambda: cuda, is_hip=lambda: False,
           is_gfx95_supported=lambda: False, get_device_sm=lambda: major * 10 + minor,
           is_sm90_supported=lambda: cuda and major == 9)
    module("sglang.srt.utils.common", get_device_core_count=core_count)
    module("sglang.kernels.ops.memory.ptr_table", make_ptr_table=no_ptr_table)


def load_kernels(sglang_dir: Path, torch) -> dict:
    _stub_modules(torch)
    found = {}
    for key, candidates in KERNEL_FILES.items():
        path = next((sglang_dir / c for c in candidates if (sglang_dir / c).is_file()), None)
        if path is None:
            raise BadInput(f"{sglang_dir}: none of {candidates} (not an SGLang 0.5.20+ tree); "
                           "pass --sglang the folder that holds sglang/")
        spec = importlib.util.spec_from_file_location(f"_ddtree_gpu_{key}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        found[key] = mod
    return found


# SGLang's state-scatter launchers whose one device check refuses non-CUDA tensors before the
# Triton kernel (tests/integration/test_v2_hybrid.py pins that it is the only one).
SHIMMED_LAUNCHERS = ("fused_mamba_state_scatter_with_mask", "fused_conv_window_scatter_with_mask")


def answer_cuda_only_host_lines(torch, scatter_module) -> None:
    """For Triton's CPU interpreter only (this script's ``--device cpu``, tests/v2_hybrid_probe.py):
    two CUDA-only host lines stand between CPU tensors and kernels the interpreter runs.
    SGLang's state-scatter launchers check ``dst.is_cuda or dst.is_xpu`` once: they are handed
    CPU tensors whose ``is_cuda`` answers True, so every other host check and the kernel run as
    on a GPU. ``selective_state_update`` picks its GPU with ``torch.get_device_module(x.device)
    .device(index)``: torch.cpu gets a no-op one (one device, nothing to select)."""
    import contextlib

    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = lambda index: contextlib.nullcontext()

    class OnInterpreter(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    for name in SHIMMED_LAUNCHERS:
        real = getattr(scatter_module, name)
        if getattr(real, "_ddtree_shim", False):
            continue

        def launcher(dst, src, *args, _real=real, **kwargs):
            return _real(dst.as_subclass(OnInterpreter), src.as_subclass(OnInterpreter),
                         *args, **kwargs)

        launcher._ddtree_shim = True
        setattr(scatter_module, name, launcher)


def load_payload(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "payload" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------
# Trees and the sequential reference


def ddtree_trees(torch, du, bs, budget, depth, device, seed):
    """DDTree layouts (n = budget + 1) from random draft log-probs, on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, depth, 32, generator=gen) * 2
    logprobs, tokens = du.topk_logprobs(logits, 4)
    layout = du.build_ddtree(logprobs, tokens, torch.zeros(bs, dtype=torch.long), budget)
    return {"parents": layout.parents.clamp(min=0), "valid": layout.valid,
            "next_token": layout.retrieve_next_token.to(device),
            "next_sibling": layout.retrieve_next_sibling.to(device),
            "depth": int(layout.max_depth)}


def tree_scan(init, parents_row, step):
    """States of every node, in index order (a parent precedes its children): step(parent
    state, node) -> (output, state); the root's parent state is ``init``."""
    outs, states = [], []
    for i in range(len(parents_row)):
        prev = init if i == 0 else states[int(parents_row[i])]
        out, state = step(prev, i)
        outs.append(out)
        states.append(state)
    return outs, states


def rel_err(got, want) -> float:
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-6))


# ---------------------------------------------------------------------------------------------
# The checks


def check_conv(torch, k, tree, device, dims):
    bs, n, dim, width = dims["bs"], dims["n"], dims["conv_dim"], dims["conv_kernel"]
    act = getattr(torch, dims["act"])
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(bs, dim, n, generator=g).to(device, act)
    weight = (torch.randn(dim, width, generator=g) * 0.5).to(device, act)
    bias = (torch.randn(dim, generator=g) * 0.1).to(device, act)
    slots = torch.arange(1, bs + 1, dtype=torch.int32, device=device)
    conv_state = torch.randn(bs + 2, dim, width - 1, generator=g).to(device, act)
    init = conv_state.clone()
    inter = torch.zeros(bs + 1, n, dim, width - 1, dtype=act, device=device)
    parents = torch.empty(bs, n, dtype=torch.int64, device=device)
    out = k["conv"].causal_conv1d_update(
        x, conv_state, weight, bias, "silu", conv_state_indices=slots,
        intermediate_conv_window=inter,
        intermediate_state_indices=torch.arange(bs, dtype=torch.int32, device=device),
        retrieve_next_token=tree["next_token"], retrieve_next_sibling=tree["next_sibling"],
        retrieve_parent_token=parents)
    errs = {"out": 0.0, "window": 0.0}
    valid = tree["valid"]
    wrong_parents = int(((parents.cpu() != tree["parents"]) & valid).sum())
    for b in range(bs):
        xb, w32, b32 = x[b].float().cpu(), weight.float().cpu(), bias.float().cpu()

        def step(window, i):
            taps = torch.cat([window, xb[:, i:i + 1]], 1)  # [dim, K]
            y = (taps * w32).sum(1) + b32
            return y / (1 + torch.exp(-y)), taps[:, 1:]

        outs, wins = tree_scan(init[int(slots[b])].float().cpu(), tree["parents"][b], step)
        for i in range(n):
            if not valid[b, i]:
                continue
            errs["out"] = max(errs["out"], rel_err(out[b, :, i].cpu(), outs[i]))
            errs["window"] = max(errs["window"], rel_err(inter[b, i].cpu(), wins[i]))
    ok = wrong_parents == 0 and errs["out"] < 2e-2 and errs["window"] < 1e-2
    return ok, dict(errs, wrong_parents=wrong_parents)


def check_delta_rule(torch, k, tree, device, dims, *, kda, state_dtype, chain=False):
    bs, n, H, HV, K, V = (dims[x] for x in ("bs", "n", "heads_k", "heads_v", "dk", "dv"))
    act = getattr(torch, dims["act"])
    g = torch.Generator(device="cpu").manual_seed(2)
    T = bs * n
    q = torch.randn(1, T, H, K, generator=g).to(device, act)
    kk = torch.randn(1, T, H, K, generator=g).to(device, act)
    v = torch.randn(1, T, HV, V, generator=g).to(device, act)
    gates = HV * K if kda else HV
    a = torch.randn(T, gates, generator=g).to(device, act)
    b = torch.randn(T, HV, generator=g).to(device, act)
    A_log = (torch.randn(HV, generator=g) * 0.3 - 2.0).to(device, torch.float32)
    dt_bias = (torch.randn(gates, generator=g) * 0.3).to(device, torch.float32)
    state = (torch.randn(bs + 2, HV, V, K, generator=g) * 0.1).to(device, state_dtype)
    init = state.clone()
    slots = torch.arange(1, bs + 1, dtype=torch.int32, device=device)
    inter = torch.zeros(bs + 1, n, HV, V, K, dtype=state_dtype, device=device)
    o = k["recurrent"].fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0, q=q, k=kk,
        v=v, b=b, initial_state_source=state, initial_state_indices=slots,
        cu_seqlens=torch.arange(0, T + 1, n, dtype=torch.int32, device=device),
        use_qk_l2norm_in_kernel=True, is_kda=kda, disable_state_update=True,
        intermediate_states_buffer=inter,
        intermediate_state_indices=torch.arange(bs, dtype=torch.int32, device=device),
        cache_steps=n, retrieve_parent_token=(
            # The control: parents of a chain (i - 1) on a branching tree.
            (torch.arange(n) - 1).clamp(min=0).expand(bs, n).contiguous() if chain
            else tree["parents"]).to(device))
    assert torch.equal(state, init), "disable_state_update wrote the committed state"
    errs = {"out": 0.0, "state": 0.0}
    valid = tree["valid"]
    f = lambda t: t.float().cpu()  # noqa: E731
    qf, kf, vf, af, bf = f(q)[0], f(kk)[0], f(v)[0], f(a), f(b)
    A, dtb = f(A_log), f(dt_bias)
    for r in range(bs):
        def step(h_prev, i):  # h_prev [HV, V, K]
            t = r * n + i
            outs, new = [], torch.empty_like(h_prev)
            for hv in range(HV):
                qh, kh = qf[t, hv // (HV // H)], kf[t, hv // (HV // H)]
                qh = qh / torch.sqrt((qh * qh).sum() + 1e-6) * K**-0.5
                kh = kh / torch.sqrt((kh * kh).sum() + 1e-6)
                sl = slice(hv * K, (hv + 1) * K) if kda else hv
                x = af[t, sl] + dtb[sl]
                gate = -torch.exp(A[hv]) * torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
                h = h_prev[hv].T * (torch.exp(gate)[:, None] if kda else torch.exp(gate))  # [K, V]
                vv = (vf[t, hv] - (h * kh[:, None]).sum(0)) * torch.sigmoid(bf[t, hv])
                h = h + kh[:, None] * vv[None, :]
                outs.append((h * qh[:, None]).sum(0))
                new[hv] = h.T
            return torch.stack(outs), new

        outs, states = tree_scan(f(init[int(slots[r])]), tree["parents"][r], step)
        for i in range(n):
            if not valid[r, i]:
                continue
            errs["out"] = max(errs["out"], rel_err(o[0, r * n + i].cpu(), outs[i]))
            errs["state"] = max(errs["state"], rel_err(inter[r, i].cpu(), states[i]))
    # bf16 state: one rounding per tree level (up to 15 here) accumulates.
    tol = 6e-2 if state_dtype == torch.bfloat16 else 2e-2
    if chain:  # the check must see a wrong parent: O(1) off
        return errs["state"] > 0.1, errs
    return errs["out"] < tol and errs["state"] < tol, errs


def check_mamba2(torch, k, tree, device, dims):
    bs, n, heads, hd, ds = dims["bs"], dims["n"], dims["m_heads"], dims["m_head_dim"], dims["m_dstate"]
    act = getattr(torch, dims["act"])
    g = torch.Generator(device="cpu").manual_seed(3)
    ssu = k["ssu"].selective_state_update
    x = torch.randn(bs, n, heads, hd, generator=g).to(device, act)
    dt = torch.randn(bs, n, heads, generator=g).to(device, act)
    B = torch.randn(bs, n, 1, ds, generator=g).to(device, act)
    C = torch.randn(bs, n, 1, ds, generator=g).to(device, act)
    A = (-torch.exp(torch.randn(heads, generator=g) * 0.3 - 1)).to(device, torch.float32)
    D = torch.randn(heads, generator=g).to(device, torch.float32)
    dt_bias = (torch.randn(heads, generator=g) * 0.3).to(device, torch.float32)
    state = (torch.randn(bs + 2, heads, hd, ds, generator=g) * 0.1).to(device, torch.float32)
    init = state.clone()
    slots = torch.arange(1, bs + 1, dtype=torch.int32, device=device)
    inter = torch.zeros(bs + 1, n, heads, hd, ds, dtype=torch.float32, device=device)
    out = torch.empty_like(x)
    # MambaMixer2's tree verify call (layers/attention/mamba/mamba.py): tied head dim.
    ssu(state, x, dt[..., None].expand(-1, -1, -1, hd),
        A[:, None, None].expand(-1, hd, ds), B, C, D[:, None].expand(-1, hd), z=None,
        dt_bias=dt_bias[:, None].expand(-1, hd), dt_softplus=True, state_batch_indices=slots,
        out=out, disable_state_update=True, intermediate_states_buffer=inter, cache_steps=n,
        retrieve_parent_token=tree["parents"].to(device),
        intermediate_state_indices=torch.arange(bs, dtype=torch.int32, device=device))
    assert torch.equal(state, init), "disable_state_update wrote the committed state"
    errs = {"out": 0.0, "state": 0.0}
    f = lambda t: t.float().cpu()  # noqa: E731
    xf, dtf, Bf, Cf, Af, Df, dbf = f(x), f(dt), f(B), f(C), f(A), f(D), f(dt_bias)
    for r in range(bs):
        def step(s, i):  # s [heads, hd, ds]
            d = dtf[r, i] + dbf
            d = torch.where(d <= 20, torch.log1p(torch.exp(d)), d)  # [heads]
            s = s * torch.exp(Af * d)[:, None, None] + (d[:, None] * xf[r, i])[:, :, None] * Bf[r, i, 0]
            return (s * Cf[r, i, 0]).sum(-1) + Df[:, None] * xf[r, i], s

        outs, states = tree_scan(f(init[int(slots[r])]), tree["parents"][r], step)
        for i in range(n):
            if tree["valid"][r, i]:
                errs["out"] = max(errs["out"], rel_err(out[r, i].cpu(), outs[i]))
                errs["state"] = max(errs["state"], rel_err(inter[r, i].cpu(), states[i]))
    return errs["out"] < 2e-2 and errs["state"] < 1e-3, errs


def check_commit(torch, k, tree, device, dims):
    bs, n = dims["bs"], dims["n"]
    g = torch.Generator(device="cpu").manual_seed(4)
    src = torch.randn(1, bs + 1, n, 3, 5, 7, generator=g).to(device)
    dst = torch.zeros(1, bs + 3, 3, 5, 7, device=device)
    win_src = torch.randn(1, bs + 1, n, 6, 3, generator=g).to(device, torch.bfloat16)
    win_dst = torch.zeros(1, bs + 3, 6, 3, dtype=torch.bfloat16, device=device)
    valid_nodes = [torch.nonzero(tree["valid"][b]).flatten() for b in range(bs)]
    accepted = torch.stack([v[torch.randint(len(v), (1,), generator=g)][0] for v in valid_nodes])
    slots = torch.arange(2, bs + 2, dtype=torch.int64)
    k["scatter"].fused_mamba_state_scatter_with_mask(dst, src, slots.to(device), accepted.to(device))
    k["scatter"].fused_conv_window_scatter_with_mask(win_dst, win_src, slots.to(device),
                                                      accepted.to(device))
    ok = all(torch.equal(dst[0, int(slots[b])], src[0, b, int(accepted[b])]) and
             torch.equal(win_dst[0, int(slots[b])], win_src[0, b, int(accepted[b])])
             for b in range(bs))
    untouched = bool((dst[0, 0] == 0).all() and (dst[0, -1] == 0).all())
    return ok and untouched, {"accepted_nodes": accepted.tolist()}


# ---------------------------------------------------------------------------------------------


def dims_for(device: str, budget: int) -> dict:
    if device == "cpu":
        # Triton's interpreter: small shapes, the same code paths; float32 activations (its
        # bfloat16 emulation is not faithful: the self-test checks the calls, a GPU the numbers).
        return {"bs": 2, "n": budget + 1, "conv_dim": 16, "conv_kernel": 4, "heads_k": 1,
                "heads_v": 2, "dk": 8, "dv": 8, "m_heads": 2, "m_head_dim": 4, "m_dstate": 8,
                "act": "float32"}
    # Qwen3-Next's GDN head dims (128) and a Nemotron-H-like Mamba2 head, batch 4, bf16.
    return {"bs": 4, "n": budget + 1, "conv_dim": 1024, "conv_kernel": 4, "heads_k": 2,
            "heads_v": 4, "dk": 128, "dv": 128, "m_heads": 8, "m_head_dim": 64, "m_dstate": 128,
            "act": "bfloat16"}


def run(sglang_dir: Path, device: str = "cuda", budgets=(64, 256)) -> list:
    """Every check, as records {"check", "budget", "ok", ...} (the entry point of a caller such
    as `make gpu-check`: ``device`` "cpu" needs TRITON_INTERPRET=1 set before Triton is
    imported). Raises BadInput when ``sglang_dir`` holds no SGLang 0.5.20+ kernel files."""
    import torch

    kernels = load_kernels(Path(sglang_dir), torch)
    if device == "cpu":
        answer_cuda_only_host_lines(torch, kernels["scatter"])
    du = load_payload("ddtree_utils")
    records = []
    for budget in budgets:
        dims = dims_for(device, budget)
        tree = ddtree_trees(torch, du, dims["bs"], budget, depth=min(budget, 15), device=device,
                            seed=budget)

        def delta(**kw):
            return lambda: check_delta_rule(torch, kernels, tree, device, dims, **kw)

        checks = [("conv", lambda: check_conv(torch, kernels, tree, device, dims)),
                  ("gdn-fp32-state", delta(kda=False, state_dtype=torch.float32)),
                  ("gdn-bf16-state", delta(kda=False, state_dtype=torch.bfloat16)),
                  ("control-chain-parents-fail", delta(kda=False, state_dtype=torch.float32,
                                                       chain=True)),
                  ("kda-fp32-state", delta(kda=True, state_dtype=torch.float32)),
                  ("mamba2", lambda: check_mamba2(torch, kernels, tree, device, dims)),
                  ("commit", lambda: check_commit(torch, kernels, tree, device, dims))]
        assert tuple(name for name, _ in checks) == CHECKS
        for name, check in checks:
            start = time.perf_counter()
            try:
                ok, facts = check()
            except Exception as exc:  # a kernel that does not launch is a failed check
                ok, facts = False, {"error": f"{type(exc).__name__}: {exc}"}
            records.append({"check": name, "budget": budget, "ok": bool(ok),
                            "depth": tree["depth"],
                            "seconds": round(time.perf_counter() - start, 2), **facts})
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang", required=True, type=Path,
                        help="folder holding SGLang's sglang/ package (0.5.20 - 0.5.23)")
    parser.add_argument("--budgets", default="64,256", help="tree budgets B (verify width B + 1)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
        if not budgets or min(budgets) < 1:
            raise ValueError
    except ValueError:
        print(f"gpu_check_hybrid: --budgets {args.budgets!r}: comma-separated integers >= 1",
              file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check_hybrid: no CUDA device (use --device cpu for Triton's interpreter)",
              file=sys.stderr)
        return 2
    try:
        records = run(args.sglang, args.device, budgets)
    except BadInput as exc:
        print(f"gpu_check_hybrid: {exc}", file=sys.stderr)
        return 2
    for record in records:
        print(TAG + json.dumps(record), flush=True)
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
