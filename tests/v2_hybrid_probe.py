"""Probe run INSIDE a test host (real SGLang 0.5.23 + the v2 payload) by tests/integration/test_v2_hybrid.py:
DDTree on a hybrid target (attention + recurrent layers), proven lossless through SGLang's own
hybrid objects, with the recurrent kernels a CUDA host runs executed by Triton's CPU
interpreter (``TRITON_INTERPRET=1``).

``python v2_hybrid_probe.py CASE...`` prints one line ``V2HYBRID:{json}`` mapping each case to
"ok" or the failure text. Module level is stdlib-only (the test imports it for CASES/TAG).

What is real here, beyond tests/v2_worker_probe.py (whose harness, decode loop and worker set-up
this probe reuses): ``HybridReqToTokenPool`` with its ``MambaPool`` (conv + SSM state, the
speculative intermediate caches of B + 1 states per request), ``HybridLinearKVPool`` under the
allocator, SGLang's ``HybridLinearAttnBackend`` around the real recurrent backend
(``GDNAttnBackend`` / ``KDAAttnBackend``, built with ``speculative_eagle_topk = K > 1``: its
``_forward_metadata`` hands the verify's ``retrieve_next_token`` / ``retrieve_next_sibling`` to the
kernels), ``RadixLinearAttention`` layers, SGLang's Triton ``causal_conv1d_update`` (which computes
``retrieve_parent_token``) and ``fused_sigmoid_gating_delta_rule_update`` (the tree verify kernel
of GDN and KDA), and the commit: ``run_eagle_verify`` calls ``spec_utils.
commit_mamba_states_after_verify``, which calls ``HybridLinearAttnBackend.
update_mamba_state_after_mtp_verify``, whose Triton scatter kernels write the accepted node's
states into the pool (and, in the GDN case, the interval-crossing state into a per-request track
slot, as the prefix cache's extra buffer asks). The worker's whole decode step
(``DDTreeWorkerV2.forward_batch_generation``) drives it.

NAMED STAND-INS (on top of tests/v2_worker_probe.py's):
- The target forward: ``TinyHybrid`` (float64, layers [attention, recurrent, attention]); its
  attention layers read and write the full-attention side of the real ``HybridLinearKVPool`` and
  honour the verify's tree mask (as ``TinyTarget`` does), its recurrent layer is SGLang's backend.
  ``HybridTargetWorker`` is the model runner's forward.
- The full-attention backend inside ``HybridLinearAttnBackend``: ``_FullAttnStandIn`` (no kernel
  of its own; TinyHybrid computes attention).
- The CPU engine (``SGLANG_USE_CPU_ENGINE=1``, needed by EAGLE's CPU ops) binds the recurrent
  backends to ``sgl_kernel``'s compiled CPU ops; the probe binds the same names to the Triton
  kernels a CUDA host imports (``_bind_gpu_recurrent_kernels``), run by Triton's interpreter.
- The prefill: the reference model writes the prompt's attention KV and recurrent state into the
  pools (SGLang's prefill kernels are not the subject).
- The sequential reference (plain greedy decoding, and the state after every committed token) is
  TinyHybrid in float64, one token at a time; the kernels compute in float32, hence the tolerance.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

TAG = "V2HYBRID:"
KIND_CASES = ("gdn", "kda", "mamba2")
CASES = tuple(f"{kind}_lossless" for kind in KIND_CASES) + (
    "mamba2_widths", "draft_scope", "refusals", "memory", "memory_resolution")

# How close the committed recurrent state must be to the float64 sequential run (the kernels
# accumulate in float32; a wrong node's state is off by O(1)).
STATE_ATOL = 2e-5
# The prefix-cache track interval of the GDN case (small, so that steps cross it).
TRACK_INTERVAL = 4


def _probe_module():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import v2_worker_probe

    return v2_worker_probe


# ---------------------------------------------------------------------------------------------
# The tiny float64 hybrid target


def _tiny_hybrid_class(vp):
    TinyTarget = vp.TinyTarget

    class TinyHybrid(TinyTarget):
        """float64 target of layers [attention, recurrent, attention]: TinyTarget's attention
        blocks around one recurrent block of ``kind``."""

        PATTERN = ("attn", "rec", "attn")

        def __init__(self, torch, kind, seed=0, scale=1.0):
            super().__init__(torch, vocab=24, hidden=32, heads=2, layers=3, seed=seed,
                             scale=scale)
            self.kind = kind
            g = torch.Generator().manual_seed(seed + 1000)
            self.w[1] = kind.params(g, self.hidden)
            self._memo = {}

        def perturbed(self, scale, seed):
            other = super().perturbed(scale, seed)  # every layer's weights, recurrent too
            other._memo = {}
            return other

        # -- the sequential reference --------------------------------------------------
        def trace(self, ids):
            """Plain causal forward over ids (one token at a time in the recurrent layer):
            {"logits" [T, V], "hidden" [T, H], "kv": {layer: (k, v) [T, heads, hd]},
            "states": [state after 0..T tokens]} (memoized)."""
            key = tuple(int(i) for i in ids)
            if key in self._memo:
                return self._memo[key]
            torch = self.torch
            t = len(key)
            x = self.emb[torch.tensor(key, dtype=torch.long)] + self.pos[:t]
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            kv, states = {}, None
            for li, what in enumerate(self.PATTERN):
                p = self.w[li]
                if what == "attn":
                    kv[li] = ((x @ p["k"]).view(t, self.heads, self.hd),
                              (x @ p["v"]).view(t, self.heads, self.hd))
                    x = self._block(p, x, x, mask)
                else:
                    inputs = self.kind.project(p, x)
                    state = self.kind.init_state()
                    states, outs = [state], []
                    for i in range(t):
                        out, state = self.kind.step(p, state, *(v[i] for v in inputs))
                        outs.append(out)
                        states.append(state)
                    x = self.rec_output(p, x, torch.stack(outs))
            out = {"logits": x @ self.head, "hidden": x, "kv": kv, "states": states}
            self._memo[key] = out
            return out

        def causal(self, ids):
            got = self.trace(ids)
            return got["logits"], got["hidden"]

        def rec_output(self, p, x, mixer_out):
            torch = self.torch
            x = x + mixer_out
            return x + torch.tanh(x @ p["up"]) @ p["down"]

        # -- one attention layer over the full-attention KV pool -----------------------
        def attend(self, li, pool_layer, kv_pool, x, positions, locs, prefix_slots, mask):
            torch = self.torch
            p = self.w[li]
            m = x.shape[0]
            k_new = (x @ p["k"]).view(-1, self.heads, self.hd)
            v_new = (x @ p["v"]).view(-1, self.heads, self.hd)
            kv_pool.k_buffer[pool_layer][locs] = k_new
            kv_pool.v_buffer[pool_layer][locs] = v_new
            k_pre = kv_pool.k_buffer[pool_layer][prefix_slots]
            v_pre = kv_pool.v_buffer[pool_layer][prefix_slots]
            full = torch.cat([torch.ones(m, len(prefix_slots), dtype=torch.bool), mask], 1)
            return self._block(p, x, x, full, k_pre=k_pre, v_pre=v_pre)

    return TinyHybrid


# ---------------------------------------------------------------------------------------------
# SGLang-side stand-ins


class _FullAttnStandIn:
    """The full-attention backend slot of HybridLinearAttnBackend (TinyHybrid computes the
    attention itself, over the real pool)."""

    needs_cpu_seq_lens = False
    use_captured_forward_metadata_for_breakable_cuda_graph = False
    verify_mask = None  # EAGLE allocates its own tree mask

    def __init__(self, runner):
        self.token_to_kv_pool = runner.token_to_kv_pool
        self.req_to_token_pool = runner.req_to_token_pool
        self.kv_index_translator = runner.kv_index_translator

    def init_forward_metadata(self, forward_batch):
        pass

    def update_verify_buffers_to_fill_after_draft(self, *a, **k):
        pass


def _hybrid_model_config(vp, target, kind):
    class HybridModelConfig(vp._ModelConfig):
        """Stand-in model config whose hf_config is SGLang's own config class of the kind
        (so mambaish_config(), which the commit tests first, finds the recurrent layers)."""

        def __init__(self):
            super().__init__(target.vocab)
            self.hf_config = kind.hf_config(target.PATTERN)
            self.hf_text_config = self.hf_config

    return HybridModelConfig()


class HybridTargetWorker:
    """The target's verify forward: TinyHybrid's attention over the real HybridLinearKVPool
    (tree mask honoured as in v2_worker_probe.StandInTargetWorker), its recurrent layer
    through SGLang's HybridLinearAttnBackend (real GDN/KDA backend, Triton kernels)."""

    def __init__(self, runner, target, layer):
        self.model_runner = runner
        self.target = target
        self.layer = layer  # RadixLinearAttention of the recurrent layer
        self.calls = 0

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, **kw):
        import torch
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.speculative import eagle_utils
        from sglang.srt.speculative.eagle_utils import TreeMaskMode

        fb = forward_batch
        assert is_verify and fb.forward_mode.is_target_verify()
        self.calls += 1
        r, tgt = self.model_runner, self.target
        backend = r.attn_backend
        backend.init_forward_metadata(fb)  # the recurrent backend's tree metadata (topk > 1)
        spec = fb.spec_info
        n, bs = spec.draft_token_num, fb.batch_size
        seq = fb.seq_lens.tolist()
        # (0.5.14 - 0.5.15.post1 have no default: EAGLE builds the full mask there.)
        mode = getattr(eagle_utils, "default_tree_mask_mode", lambda: TreeMaskMode.FULL_MASK)()
        qlen_only = mode == TreeMaskMode.QLEN_ONLY
        masks, off = [], 0
        for b in range(bs):
            s = int(seq[b])
            if qlen_only:
                masks.append(spec.custom_mask[b * n * n:(b + 1) * n * n].view(n, n).bool())
            else:
                full = spec.custom_mask[off:off + n * (s + n)].view(n, s + n)
                assert bool(full[:, :s].all())
                masks.append(full[:, s:].bool())
                off += n * (s + n)
        ids, pos = fb.input_ids.long(), fb.positions.long()
        locs = fb.out_cache_loc.long()
        x = tgt.emb[ids] + tgt.pos[pos]
        kv = r.token_to_kv_pool  # HybridLinearKVPool
        for li, what in enumerate(tgt.PATTERN):
            if what == "attn":
                pool_layer = kv.full_attention_layer_id_mapping[li]
                rows = []
                for b in range(bs):
                    row, s = int(fb.req_pool_indices[b]), int(seq[b])
                    part = slice(b * n, (b + 1) * n)
                    rows.append(tgt.attend(li, pool_layer, kv.full_kv_pool, x[part], pos[part],
                                           locs[part],
                                           r.req_to_token_pool.req_to_token[row, :s].long(),
                                           masks[b]))
                x = torch.cat(rows)
            else:
                p = tgt.w[li]
                x = tgt.rec_output(p, x, tgt.kind.verify(backend, self.layer, fb, x, p))
        out = LogitsProcessorOutput(next_token_logits=x @ tgt.head, hidden_states=x)
        return vp_module()._Out(out)


def vp_module():
    return sys.modules["v2_worker_probe"]


@__import__("contextlib").contextmanager
def _cuda_allocations_on_cpu(torch):
    """CPU answers to CUDA-only host lines: 0.5.19's MambaPool allocates its speculative caches
    (intermediate SSM states, conv windows) with ``device="cuda"`` written out (0.5.20+ pass
    the pool's device); while the pool is built, ``torch.zeros(..., device="cuda")`` allocates
    on the CPU. Pinned by
    tests/integration/test_v2_hybrid.py (test_the_probe_answers_0_5_19s_hard_coded_cuda_pool_line)."""
    zeros = torch.zeros

    def cpu_zeros(*args, device=None, **kwargs):
        return zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)

    torch.zeros = cpu_zeros
    try:
        yield
    finally:
        torch.zeros = zeros


# The recurrent kernels' modules, newest location first: 0.5.16 moved them from
# sglang/srt/layers/attention/ (0.5.14 - 0.5.15.post1) to sglang/kernels/ops/, and 0.5.23 moved
# the recurrent one again (0.5.20 - 0.5.22 keep it under fla/).
KERNEL_MODULES = {
    "conv": ("sglang.kernels.ops.mamba.causal_conv1d_triton",
             "sglang.srt.layers.attention.mamba.causal_conv1d_triton"),
    "recurrent": ("sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent",
                  "sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent",
                  "sglang.srt.layers.attention.fla.fused_sigmoid_gating_recurrent"),
    "ssu_dispatch": ("sglang.kernels.ops.mamba.triton_ops.ssu_dispatch",
                     "sglang.srt.layers.attention.mamba.ops.ssu_dispatch"),
    "scatter": ("sglang.kernels.ops.mamba.mamba_state_scatter_triton",
                "sglang.srt.layers.attention.mamba.mamba_state_scatter_triton"),
}


def kernel_module(what):
    """The release's module of kernel ``what`` (KERNEL_MODULES): the first location it has."""
    import importlib

    names = KERNEL_MODULES[what]
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise  # a missing dependency of a module that is there: not a location
    raise ModuleNotFoundError(f"none of {names}")


def _spec_settings():
    """The speculative settings the backends read: the runtime Spec bag (0.5.17+), else the
    global ServerArgs (0.5.14 - 0.5.15.post1), as the payload's seam answers."""
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_settings

    return runtime_settings("spec")


def _spec_override(**fields):
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_override

    return runtime_override(_spec_settings(), **fields)


def _bind_gpu_recurrent_kernels():
    """SGLANG_USE_CPU_ENGINE=1 binds the recurrent backends to sgl_kernel's compiled CPU ops
    (absent here; torch.ops names are looked up at import). Give those torch.ops names raising
    stand-ins so the modules import, then bind the names the backends call to the Triton
    kernels a CUDA host imports (gdn_backend / kda_backend / kda_triton / gdn_triton)."""
    import torch

    ns = torch.ops.sgl_kernel

    def raising(name):
        def op(*a, **k):
            raise RuntimeError(f"sgl_kernel.{name}: CPU op stand-in (not available here)")
        return op

    for name in ("fused_gdn_gating_cpu", "fused_sigmoid_gating_delta_rule_update_cpu"):
        if not hasattr(ns, name):
            setattr(ns, name, raising(name))
    causal_conv1d_triton = kernel_module("conv")
    from sglang.srt.layers.attention.linear import gdn_backend, kda_backend
    from sglang.srt.layers.attention.linear.kernels import gdn_triton, kda_triton

    fsg = kernel_module("recurrent")
    _shim_cuda_only_host_checks()
    gdn_backend.causal_conv1d_update = causal_conv1d_triton.causal_conv1d_update
    kda_backend.causal_conv1d_update = causal_conv1d_triton.causal_conv1d_update
    gdn_triton.fused_sigmoid_gating_delta_rule_update = fsg.fused_sigmoid_gating_delta_rule_update
    kda_triton.fused_sigmoid_gating_delta_rule_update = fsg.fused_sigmoid_gating_delta_rule_update
    # MambaMixer2 binds its Triton conv only on CUDA/XPU; its SSU dispatcher is initialized by
    # the scheduler from --mamba-backend (triton: the backend with the tree path).
    ssu_dispatch = kernel_module("ssu_dispatch")
    from sglang.srt.layers.attention.mamba import mamba as mamba_mixer

    mamba_mixer.causal_conv1d_update_triton = causal_conv1d_triton.causal_conv1d_update
    ssu_dispatch.initialize_mamba_selective_state_update_backend(type("Args", (), {
        "mamba_backend": "triton", "enable_mamba_cache_stochastic_rounding": False,
        "mamba_cache_philox_rounds": 0})())


def _shim_cuda_only_host_checks():
    """Two CUDA-only host lines on the way to Triton kernels the interpreter runs on CPU
    tensors (the scatter launchers' ``is_cuda`` check, selective_state_update's device
    context): answered as scripts/gpu_check_hybrid.py answers them for its own CPU self-test
    (``answer_cuda_only_host_lines``; tests/integration/test_v2_hybrid.py pins the lines)."""
    import torch

    scatter = kernel_module("scatter")
    script = _gpu_script()
    script.answer_cuda_only_host_lines(torch, scatter)
    # 0.5.14 - 0.5.15.post1's hybrid backend imported the launchers by name (0.5.16+ call them
    # inside the scatter module): its names are bound to the answered launchers too.
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hybrid

    for name in script.SHIMMED_LAUNCHERS:
        if hasattr(hybrid, name):
            setattr(hybrid, name, getattr(scatter, name))


def _gpu_script():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                        "gpu_check_hybrid.py")
    spec = importlib.util.spec_from_file_location("gpu_check_hybrid", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------


class _OneRankGroup:
    """Stand-in process group of one rank (no torch.distributed here), with the fields SGLang's
    parallel linear layers read."""

    world_size = 1
    rank_in_group = 0

    def broadcast(self, *a, **k):
        pass

    def all_reduce(self, x, *a, **k):
        return x


def make_harness():
    vp = _probe_module()

    class HybridHarness(vp.Harness):
        """v2_worker_probe's harness with the hybrid pools, backend and target worker."""

        HIDDEN_ATOL = 1e-4  # the recurrent kernels accumulate in float32

        def __init__(self, kind_name):
            super().__init__()
            _bind_gpu_recurrent_kernels()
            # SGLang's parallel layers (MambaMixer2) read this rank's place in its group.
            from sglang.srt.runtime_context import get_parallel

            ranks = dict(tp_rank=0, attn_tp_rank=0, tp_group=_OneRankGroup(),
                         attn_tp_group=_OneRankGroup())
            if hasattr(type(get_parallel()), "override_permanently"):  # 0.5.20 and later
                get_parallel().override_permanently(**ranks)
            else:  # 0.5.19: the scoped override, held open for the harness's life
                self._ranks_scope = get_parallel().override(**ranks)
                self._ranks_scope.__enter__()
                # 0.5.19's parallel linear layers ask parallel_state's TP group themselves
                # (0.5.20+ ask the runtime context): the same one-rank group.
                from sglang.srt.layers import linear

                if hasattr(linear, "get_tp_group"):
                    linear.get_tp_group = _OneRankGroup
            from v2_hybrid_kinds import KINDS

            self.kind = KINDS[kind_name](self.torch)
            self.budget = self.topk = None
            self.chain_commit = False  # the negative control: commit accept_len - 1
            self.off_node_commits = 0  # steps where the accepted node != the chain step
            self.widths = set()  # the verify widths the commit ran at
            self.topks = set()  # and the trees' top-K
            self.state_checks = 0
            # The prefix cache's interval-crossing state (mamba_track_indices): each request
            # gets a track slot, and a crossing of TRACK_INTERVAL must leave there the state
            # after the crossing point (SGLang's grid lcm(mamba chunk, page, interval) needs the
            # model's config: STAND-IN, the interval answered where the commit reads it,
            # _track_interval_scope).
            self.track = False
            self.track_slots = {}
            self.track_checks = 0

        def pools(self, target, bs, kv_slots=4096, max_context_len=512, page_size=1):
            # run_decode hands every harness its page size (v2_worker_probe's paged case).
            assert page_size == 1, "hybrid targets are served at page size 1 (ddtree_hybrid)"
            torch = self.torch
            from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
            from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool

            rec = [i for i, w in enumerate(target.PATTERN) if w == "rec"]
            full = [i for i, w in enumerate(target.PATTERN) if w != "rec"]
            with _cuda_allocations_on_cpu(torch):
                rtp = HybridReqToTokenPool(
                    size=bs + 2, mamba_size=2 * bs + 2, mamba_spec_state_size=bs + 2,
                    max_context_len=max_context_len, device="cpu", enable_memory_saver=False,
                    cache_params=self.kind.cache_params(rec), mamba_layer_ids=rec,
                    enable_mamba_extra_buffer=False,
                    speculative_num_draft_tokens=self.budget + 1,
                    speculative_eagle_topk=self.topk,
                )
            import inspect

            # (0.5.14 - 0.5.15.post1 also ask whether the KV cache is stored transposed: no.)
            layout = ({"enable_kvcache_transpose": False} if "enable_kvcache_transpose"
                      in inspect.signature(HybridLinearKVPool.__init__).parameters else {})
            kv = HybridLinearKVPool(
                size=kv_slots, dtype=torch.float64, page_size=1, head_num=target.heads,
                head_dim=target.hd, full_attention_layer_ids=full, device="cpu",
                mamba_pool=rtp.mamba_pool, enable_memory_saver=False, **layout,
            )
            allocator = TokenToKVPoolAllocator(
                size=kv_slots, dtype=torch.float64, device="cpu", kvcache=kv, need_sort=False)
            # The harness's KV checks read the full-attention side (layer 0 is attention).
            return rtp, kv.full_kv_pool, allocator

        def prefill(self, target, kv, alloc, rtp, req, row, prompt, page_size=1):
            assert page_size == 1, "hybrid targets are served at page size 1 (ddtree_hybrid)"
            slots = alloc.alloc(len(prompt))
            rtp.req_to_token[row, : len(prompt)] = slots.to(rtp.req_to_token.dtype)
            if getattr(req, "kv", None) is None and not hasattr(req, "kv_allocated_len"):
                # 0.5.18: allocation creates the KV record (0.5.14 - 0.5.15.post1 have none)
                from sglang.srt.managers.schedule_batch import ReqKvInfo

                req.kv = ReqKvInfo(kv_allocated_len=len(prompt), swa_evicted_seqlen=0)
            vp.committed_of(req).kv_committed_len = len(prompt)
            vp.allocated_of(req).kv_allocated_len = len(prompt)
            got = target.trace(prompt)
            hybrid = alloc.get_kvcache()
            for li, (k, v) in got["kv"].items():
                layer = hybrid.full_attention_layer_id_mapping[li]
                hybrid.full_kv_pool.k_buffer[layer][slots.long()] = k
                hybrid.full_kv_pool.v_buffer[layer][slots.long()] = v
            slot = int(rtp.req_index_to_mamba_index_mapping[row])
            self.kind.write_pool_state(rtp.mamba_pool, slot, got["states"][len(prompt)])
            return got["logits"]

        def worker(self, target, budget, topk, block, rtp, kv, alloc, entries=None):
            from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
                HybridLinearAttnBackend,
            )
            from sglang.srt.layers.attention.linear import utils as linear_utils
            w = super().worker(target, budget, topk, block, rtp, kv, alloc, entries=entries)
            runner = w.model_runner
            runner.token_to_kv_pool = alloc.get_kvcache()  # the HybridLinearKVPool
            runner.model_config = _hybrid_model_config(vp, target, self.kind)
            # 0.5.14 - 0.5.15.post1's commit and backends ask the runner's own kind predicates
            # (mambaish_config, mamba2_config, ...: ModelRunner properties there; 0.5.17+ ask
            # configs/hybrid_arch about the model config): SGLang's answers on this model
            # config, through the payload's reading of them.
            from sglang.srt.speculative import ddtree_hybrid

            arch = ddtree_hybrid._hybrid_arch()
            for name in ddtree_hybrid._PREDICATES:
                if callable(getattr(arch, name, None)):
                    setattr(runner, name, getattr(arch, name)(runner.model_config))
            assert runner.mambaish_config is not None, "the target is not hybrid to SGLang"
            # (What the backends read of the runner's ServerArgs: 0.5.19 also reads unified
            # memory and the Mamba extra buffer there; 0.5.18 the verify's top-K and width too,
            # the same values as the spec override below; 0.5.20+ from the runtime context.)
            # Anything else (0.5.18's ForwardBatch.init_new reads the runner's LoRA flag): the
            # probe's own ServerArgs, as the worker harness gives the runner.
            probe_args = runner.server_args
            runner.server_args = type("Args", (), {
                "enable_mis": False, "enable_unified_memory": False,
                "speculative_eagle_topk": topk, "speculative_num_draft_tokens": budget + 1,
                "enable_mamba_extra_buffer": staticmethod(lambda: False),
                "__getattr__": lambda self, name: getattr(probe_args, name)})()
            if hasattr(linear_utils, "resolve_linear_attn_backends"):  # 0.5.18+: per runner
                runner.linear_attn_backends = linear_utils.resolve_linear_attn_backends()
            else:  # 0.5.17: process-wide, set from the runner's args as its registry does
                linear_utils.initialize_linear_attn_config(runner.server_args)
            # Built as the scheduler builds the target's backends: under the resolved DDTREE
            # spec (topk = K > 1 switches the recurrent backend's tree path on).
            with _spec_override(speculative_eagle_topk=topk,
                                speculative_num_draft_tokens=budget + 1):
                linear = self.kind.backend_class()(runner)
            assert linear.topk == topk > 1, linear.topk
            runner.attn_backend = HybridLinearAttnBackend(
                _FullAttnStandIn(runner), linear,
                [i for i, kind in enumerate(target.PATTERN) if kind != "rec"])
            rec_id = target.PATTERN.index("rec")
            w._target_worker = HybridTargetWorker(runner, target,
                                                  self.kind.layer(rec_id, target.w[rec_id]))
            w._need_mamba_verify_commit = True  # DFlash's chain commit, for the control
            self._install_commit(w)
            self._install_state_check(w, target, rtp)
            return w

        def _install_commit(self, w):
            """Count the steps where the accepted node is not the chain step; in the negative
            control, commit DFlash's way instead (its _update_target_mamba_state_after_verify:
            the state of step accept_len - 1)."""
            torch = self.torch
            import importlib

            from sglang.srt.speculative import spec_utils

            # The module whose verify calls the commit by name: eagle_worker_common's
            # run_eagle_verify (0.5.16+), EAGLEWorkerV2.verify (0.5.14 - 0.5.15.post1).
            try:
                caller = importlib.import_module("sglang.srt.speculative.eagle_worker_common")
            except ModuleNotFoundError:
                caller = importlib.import_module("sglang.srt.speculative.eagle_worker_v2")

            real = spec_utils.commit_mamba_states_after_verify
            harness = self

            def commit(target_worker, batch, accept_lens, accept_index, draft_token_num,
                       *args, **kwargs):
                bs, n = accept_lens.shape[0], int(draft_token_num)  # this step's width
                harness.widths.add(n)
                harness.topks.add(int(batch.spec_info.topk))
                last = accept_index[torch.arange(bs), accept_lens.long() - 1] - torch.arange(bs) * n
                harness.off_node_commits += int((last != accept_lens.long() - 1).sum())
                if harness.chain_commit:
                    import inspect

                    chain = w._update_target_mamba_state_after_verify
                    lens = dict(batch=batch, seq_lens_pre_verify=batch.seq_lens,
                                commit_lens=accept_lens)
                    if "seq_lens_post_verify" in inspect.signature(chain).parameters:  # 0.5.20+
                        lens["seq_lens_post_verify"] = batch.seq_lens + accept_lens
                    return chain(**lens)
                return real(target_worker, batch, accept_lens, accept_index, draft_token_num,
                            *args, **kwargs)

            caller.commit_mamba_states_after_verify = commit

        def _install_state_check(self, w, target, rtp):
            """After every decode step: each request's committed recurrent state equals the
            sequential run over the tokens it has consumed (prompt, outputs, accepted drafts)."""
            torch = self.torch
            step = w.forward_batch_generation
            harness = self

            def checked(batch, *args, **kwargs):
                rows = [int(r) for r in batch.req_pool_indices]
                if harness.track:
                    for row in rows:
                        if row not in harness.track_slots:
                            harness.track_slots[row] = int(rtp.mamba_allocator.alloc(1)[0])
                    batch.mamba_track_indices = torch.tensor(
                        [harness.track_slots[r] for r in rows], dtype=torch.int64)
                pre = batch.seq_lens.tolist()
                with harness._track_interval_scope():
                    res = step(batch, *args, **kwargs)
                if harness.chain_commit:
                    return res
                out = res.next_token_ids.view(len(rows), -1)
                for j, row in enumerate(rows):
                    acc = int(res.accept_lens[j])
                    consumed = list(w.draft_model_runner.contexts[row]) + out[j, :acc - 1].tolist()
                    states = target.trace(consumed)["states"]
                    slot = int(rtp.req_index_to_mamba_index_mapping[row])
                    harness._assert_state(rtp, slot, states[len(consumed)],
                                          f"request row {row} after {len(consumed)} tokens")
                    harness.state_checks += 1
                    crossing = (pre[j] + acc) // TRACK_INTERVAL * TRACK_INTERVAL
                    if harness.track and crossing > pre[j]:
                        harness._assert_state(rtp, harness.track_slots[row], states[crossing],
                                              f"track slot of row {row} at {crossing} tokens")
                        harness.track_checks += 1
                return res

            w.forward_batch_generation = checked

        def _track_interval_scope(self):
            """TRACK_INTERVAL where SGLang's commit reads the track grid: 0.5.19+ ask
            ``spec_utils.mamba_track_grid(page_size)`` (answered in ``_lossless``); 0.5.18 reads
            the runtime context's ``mamba_track_interval`` itself, 0.5.14 - 0.5.15.post1 the
            global ServerArgs' field, overridden here for the step (a function it never calls
            would leave the crossing at the default 256)."""
            import contextlib

            from sglang.srt.speculative import spec_utils

            if not self.track or hasattr(spec_utils, "mamba_track_grid"):
                return contextlib.nullcontext()
            from sglang.srt.speculative.ddtree_v2_plugin import runtime_override, runtime_settings

            settings = runtime_settings("exec")  # 0.5.14 - 0.5.15.post1: the global ServerArgs
            return runtime_override(getattr(settings, "mamba", settings),
                                    mamba_track_interval=TRACK_INTERVAL)

        def _assert_state(self, rtp, slot, want, what):
            got = self.kind.pool_state(rtp.mamba_pool, slot)
            for name, g, e in zip(("conv", "ssm"), got, want):
                assert self.torch.allclose(g, e, atol=STATE_ATOL, rtol=0), (
                    f"{name} state of {what}: max error {(g - e).abs().max():.3g}")

    return vp, HybridHarness


# ---------------------------------------------------------------------------------------------


def _lossless(kind_name):
    vp, HybridHarness = make_harness()
    h = HybridHarness(kind_name)
    torch = h.torch
    TinyHybrid = _tiny_hybrid_class(vp)
    target = TinyHybrid(torch, h.kind, seed=1)
    draft = target.perturbed(0.03, seed=2)  # agrees often, not always: off-chain accepts
    gen = torch.Generator().manual_seed(3)
    # Lengths at which some request's last step accepted more tokens than it still wanted.
    plens, max_new = [4, 9, 13], MAX_NEW[kind_name]
    prompts = [torch.randint(0, target.vocab, (m,), generator=gen).tolist() for m in plens]
    h.budget, h.topk = 10, 3
    if kind_name == "gdn":  # the interval-crossing commit too (once: the kinds share it)
        from sglang.srt.speculative import spec_utils

        h.track = True
        if hasattr(spec_utils, "mamba_track_grid"):  # 0.5.19+ (0.5.18: _track_interval_scope)
            spec_utils.mamba_track_grid = lambda page_size: TRACK_INTERVAL
    # Two widths: three running requests verify budget 6 / top-2 (width 7), fewer budget 10 /
    # top-3 (width 11); the pools and the recurrent backend are built for the largest entry
    # (h.budget, h.topk), as resolution declares them.
    schedule = HYBRID_SCHEDULES[kind_name]
    reqs, steps, accepts, w = vp.run_decode(h, target, draft, prompts, max_new, budget=None,
                                            topk=None, block=5, via_forward=True,
                                            schedule=schedule)
    widths = {entry.budget + 1 for entry in w.ddtree_entries}
    assert h.widths == widths and h.topks == {entry.topk for entry in w.ddtree_entries}, (
        "the recurrent commit did not run at every entry", h.widths, h.topks)
    assert h.track_checks >= 1 or not h.track, "no step crossed a track interval"
    # Tokens == greedy (checked per request by the loop), the state after every step checked.
    assert h.state_checks >= steps, (h.state_checks, steps)
    # Not vacuous: deep paths, off-chain accepts, a request finished mid-path, and steps whose
    # accepted node is not the chain step accept_len - 1 (where the control must go wrong).
    assert max(accepts) >= 2, accepts
    assert int(w._ddtree_offchain) >= 1, "no off-chain accept: the tree never mattered"
    assert any(c > 0 for c in w.cut), w.cut
    assert h.off_node_commits >= 1, "every accepted node was the chain step: no control"
    greedy = [list(r.output_ids) for r in reqs]

    # Negative control, same target, same draft: commit the chain step (DFlash's
    # accept_len - 1) instead of the accepted node. The tokens must leave plain greedy.
    h2 = HybridHarness(kind_name)
    h2.budget, h2.topk, h2.chain_commit = 10, 3, True
    reqs2, _, _, _ = vp.run_decode(h2, target, draft, prompts, max_new, budget=None, topk=None,
                                   block=5, via_forward=True, check=False, schedule=schedule)
    wrong = [list(r.output_ids) for r in reqs2]
    assert wrong != greedy, "committing accept_len - 1 left the tokens greedy: the test is blind"
    first = min(next(i for i, (a, b) in enumerate(zip(g, x)) if a != b)
                for g, x in zip(greedy, wrong) if g != x)
    return {"steps": steps, "state_checks": h.state_checks, "off_node": h.off_node_commits,
            "track_checks": h.track_checks,
            "offchain_steps": int(w._ddtree_offchain), "mid_path_cuts": sum(c > 0 for c in w.cut),
            "control_requests_off_greedy": sum(g != x for g, x in zip(greedy, wrong)),
            "control_first_wrong_token": first}


MAX_NEW = {"gdn": [6, 17, 11], "kda": [6, 17, 11], "mamba2": [14, 15, 12]}
# The budget schedules of the lossless runs (three running requests: the second entry, fewer:
# the first); the largest entry is what the pools hold (10, 3) and the backend is built under
# (top-K 3: its tree path on). GDN at two widths with the chain (11, and 5 at top-K 1: a chain
# through the tree path), KDA at two widths (11, 7); Mamba2 at one width and two top-Ks, since
# its mixer strides the intermediate states by the step's width (ddtree_hybrid refuses several
# widths; case_mamba2_widths shows why).
HYBRID_SCHEDULES = {"gdn": "1:10/3,3:chain", "kda": "1:10/3,3:6/2", "mamba2": "1:10/3,3:10/2"}


def case_mamba2_widths(_):
    """Why DDTREE refuses a Mamba2 target a schedule of several widths: SGLang's MambaMixer2
    hands selective_state_update cache_steps = the step's width while the pool's intermediate
    states are laid out at the largest; the same run as mamba2_lossless at two widths (11, 7)
    commits a wrong SSM state at the narrower one (the state check fails)."""
    vp, HybridHarness = make_harness()
    h = HybridHarness("mamba2")
    torch = h.torch
    target = _tiny_hybrid_class(vp)(torch, h.kind, seed=1)
    draft = target.perturbed(0.03, seed=2)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, target.vocab, (m,), generator=gen).tolist() for m in (4, 9, 13)]
    h.budget, h.topk = 10, 3
    try:
        vp.run_decode(h, target, draft, prompts, MAX_NEW["mamba2"], budget=None, topk=None,
                      block=5, via_forward=True, schedule="1:10/3,3:6/2")
    except AssertionError as exc:
        assert "ssm state of request row" in str(exc), exc
        return {"refused_because": str(exc)[:200]}
    raise AssertionError("Mamba2 at two widths kept every state: ddtree_hybrid's refusal of "
                         "several widths is no longer needed (drop it)")


def case_gdn_lossless(_):
    return _lossless("gdn")


def case_kda_lossless(_):
    """0.5.17+: lossless as GDN. 0.5.14 - 0.5.15.post1's KDA backend has no verify path (the
    source pin kda_verify_is_the_prefill_chunk): there DDTREE refuses a KDA target by name,
    on SGLang's own config of the tiny Kimi Linear folder."""
    from sglang.srt.speculative import ddtree_hybrid as hy

    if hy._kda_has_verify_path():
        return _lossless("kda")
    try:
        _check_model("tiny-kimi-linear")
    except ValueError as exc:
        text = str(exc)
        assert "KDAAttnBackend has no tree verify path" in text and "\n" not in text, text
        return {"refused": text}
    raise AssertionError("a KDA target was accepted on a release without KDA's verify path")


def case_mamba2_lossless(_):
    return _lossless("mamba2")


def _spec_settings():
    """The process's speculative settings: the runtime Spec bag (0.5.17+), or the global
    ServerArgs (0.5.16, no bags): the plugin's own seam."""
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_settings

    return runtime_settings("spec")


def _spec_override(**fields):
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_override

    return runtime_override(_spec_settings(), **fields)


def _kda_verify_flag() -> str:
    """The flag that picks KDA's verify kernel: its own from 0.5.17, the decode backend's before."""
    from sglang.srt.server_args import ServerArgs

    models = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "models")
    args = ServerArgs(model_path=os.path.join(models, "tiny-llama"), device="cuda",
                      skip_tokenizer_init=True, disable_radix_cache=True)
    return ("--linear-attn-verify-backend" if hasattr(args, "linear_attn_verify_backend")
            else "--linear-attn-decode-backend")


def case_draft_scope(_):
    """DDTreeWorkerV2.init_attention_backends / init_cuda_graphs build the DFlash draft's
    backends under speculative_eagle_topk = 1 while the resolved spec keeps K for the target,
    and a hybrid target whose recurrent backend was built without the tree path is refused."""
    vp = _probe_module()
    h = vp.Harness()
    torch = h.torch
    import copy
    import importlib

    from sglang.srt.speculative.ddtree_worker_v2 import DDTreeWorkerV2

    target = vp.TinyTarget(torch, seed=1)
    rtp, kv, alloc = h.pools(target, 2)
    w = h.worker(target, 10, 3, 5, rtp, kv, alloc)
    seen, widths = {}, {}
    target_settings = _spec_settings()
    own_copy = not hasattr(importlib.import_module("sglang.srt.runtime_context"), "get_spec")
    if not own_copy:
        def draft_settings():  # 0.5.17+: the draft's backends read the runtime Spec bag
            return _spec_settings()
    else:
        # 0.5.14 - 0.5.16: the draft runner reads its own ServerArgs, the copy
        # DFlashWorkerV2 makes of the target's (B + 1 wide, top-K K as resolved).
        w.draft_model_runner.server_args = copy.copy(target_settings)

        def draft_settings():
            # (the target's K stays K while the draft's is 1)
            seen["target_during_draft"] = _spec_settings().speculative_eagle_topk
            widths["draft"] = w.draft_model_runner.server_args.speculative_num_draft_tokens
            return w.draft_model_runner.server_args

    class DraftWorker:  # stand-in: records what the draft's backends would be built under
        def init_attention_backends(self):
            seen["backends"] = draft_settings().speculative_eagle_topk

        def init_cuda_graphs(self, capture_decode_cuda_graph=False):
            seen["graphs"] = draft_settings().speculative_eagle_topk

    w._draft_worker = DraftWorker()
    w.draft_parallel_layout = type("Layout", (), {"tp_group": None})()

    class Linear:  # a hybrid target backend: only its tree switch is read
        topk = 3

    w.model_runner.attn_backend = type("Hybrid", (), {"linear_attn_backend": Linear()})()
    from sglang.srt.speculative import dflash_worker_v2 as dfw

    # DFlash's init_cuda_graphs captures on a GPU: a recorder stands in for it (what is
    # checked is the scope DDTREE's override calls it under). Its pipeline/TP scopes need
    # torch.distributed groups: one-process stand-ins.
    import contextlib

    dfw.draft_pp_context = contextlib.nullcontext
    dfw.draft_tp_context = lambda layout: contextlib.nullcontext()
    dfw.DFlashWorkerV2.init_cuda_graphs = lambda self: seen.__setitem__(
        "graphs", draft_settings().speculative_eagle_topk)
    with _spec_override(speculative_eagle_topk=3, speculative_algorithm="DDTREE",
                        speculative_num_draft_tokens=11):
        if own_copy:  # the copy, made after resolution
            w.draft_model_runner.server_args = copy.copy(target_settings)
        DDTreeWorkerV2.init_attention_backends(w)  # DFlash's real one, draft worker stand-in
        DDTreeWorkerV2.init_cuda_graphs(w)
        after = target_settings.speculative_eagle_topk
        if own_copy:  # the draft copy is back to the target's width and K after the scope
            copy_after = (w.draft_model_runner.server_args.speculative_eagle_topk,
                          w.draft_model_runner.server_args.speculative_num_draft_tokens)
            assert copy_after == (3, 11), copy_after
    target_k = seen.pop("target_during_draft", 3)
    assert seen == {"backends": 1, "graphs": 1}, seen
    assert target_k == 3, target_k
    assert after == 3, after  # the target's K is untouched
    # 0.5.14 - 0.5.15.post1: the draft's backends see its block (5), not the target's 11.
    assert widths.get("draft", 5) == 5, widths
    Linear.topk = 1
    try:
        DDTreeWorkerV2.init_attention_backends(w)  # top-K 3, the target's backend a chain's
    except RuntimeError as exc:
        assert "no tree path" in str(exc), exc
    else:
        raise AssertionError("a hybrid target backend without the tree path was accepted")
    w.ddtree_topk = 1  # top-K 1: the tree is a chain, the chain path serves it
    DDTreeWorkerV2.init_attention_backends(w)
    return {"draft_topk": seen.get("backends"), "graphs_topk": seen.get("graphs")}


def _reset_context():
    """Nothing published, as at argument resolution: the runtime context's reset (0.5.17+);
    0.5.14 - 0.5.15.post1 publish nothing there to reset (their parallel fields ask the
    process groups, none here)."""
    from sglang.srt import runtime_context

    reset = getattr(runtime_context, "reset_context", None)
    if reset is not None:
        reset()


def case_memory(_):
    """The recurrent term of max_running_requests on SGLang's own config classes: a real-size
    Qwen3-Next (SGLang's Qwen3NextConfig defaults: 80B-A3B) at TP 1/2/4 and budgets 64 / 256 on
    an H200 (141 GiB, --mem-fraction-static 0.85), and the refusal with its numbers."""
    from sglang.srt.configs import Qwen3NextConfig
    from sglang.srt.speculative import ddtree_hybrid as hy

    # As at argument resolution (where the plugin computes it): nothing published, no process
    # groups (the other cases publish a CPU topology).
    _reset_context()

    # Qwen3-Next-80B-A3B: 48 layers, every 4th full attention, 36 GDN layers of 16 key / 32
    # value heads of dim 128 (the class defaults, with the attention interval of its config.json).
    config = Qwen3NextConfig(num_hidden_layers=48, full_attention_interval=4)
    h200 = 141 * (1 << 30)
    table = {}
    for tp in (1, 2, 4):
        per_slot = hy.per_slot_state_bytes(config, tp)
        for budget in (64, 256):
            cost = hy.recurrent_verify_cost(per_slot, budget, radix_cache=True)
            cap = hy.recurrent_request_cap(cost, hy.state_budget_bytes(h200, 0.85))
            table[f"tp{tp}-b{budget}"] = {"per_slot_mb": round(per_slot / 1e6, 2),
                                          "per_request_gb": round(cost.bytes_per_request / 1e9, 2),
                                          "cap": cap}
    try:
        hy.running_requests_for(48, hy.recurrent_verify_cost(
            hy.per_slot_state_bytes(config, 4), 64, radix_cache=True),
            hy.state_budget_bytes(h200, 0.85), default=48, what="the recurrent share")
    except ValueError as exc:
        table["refusal"] = str(exc)
    else:
        raise AssertionError("48 requests at budget 64 were accepted")
    return table


def _resolved_fields(args) -> dict:
    """SGLang's own resolution of ``args``: ``resolve_once`` / ``resolved_dict`` from 0.5.19 on;
    0.5.18 resolved at construction and keeps the results in the fields."""
    if callable(getattr(args, "resolve_once", None)):
        args.resolve_once()
        return args.resolved_dict()
    import dataclasses

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}


_CHECK_BASE = {"model_path": "/m", "mamba_backend": "triton", "linear_attn_backend": "triton",
               "linear_attn_decode_backend": None, "linear_attn_prefill_backend": None,
               "linear_attn_verify_backend": None, "enable_linear_replayssm_spec": False,
               "page_size": 1, "disable_radix_cache": True,
               "mamba_radix_cache_strategy": "no_buffer", "mamba_track_interval": 256}


def _check_model(name, budget=64, **settings):
    """ddtree_hybrid.check on SGLang's own ModelConfig of the tiny config folder ``name``."""
    import types

    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative import ddtree_hybrid as hy
    from sglang.srt.speculative import ddtree_v2_plugin

    models = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "models")
    args = ServerArgs(model_path=os.path.join(models, name), device="cuda",
                      skip_tokenizer_init=True, disable_radix_cache=True)
    _resolved_fields(args)
    # The view has the fields this release's ServerArgs has (0.5.16 and older: no verify
    # backend of its own), as SGLang's resolved view does.
    base = {k: v for k, v in _CHECK_BASE.items() if hasattr(args, k)}
    return hy.check(types.SimpleNamespace(**{**base, **settings}),
                    ddtree_v2_plugin.model_config(args), budget)


def case_refusals(_):
    """ddtree_hybrid.check on SGLang's own ModelConfig of the tiny config folders, with the
    settings a CPU resolution cannot reach (SGLang refuses them first here: no FlashInfer Mamba,
    no extra buffer without a GPU platform): each a one-line refusal naming the config class,
    the reason and what to use instead; the served kinds and a pure-attention target pass."""
    import logging

    logging.disable(logging.WARNING)
    from sglang.srt.speculative import ddtree_hybrid as hy

    _reset_context()
    check = _check_model
    assert check("tiny-llama") is None
    kda = hy._kda_has_verify_path()  # 0.5.14 - 0.5.15.post1: KDA refused (case_kda_lossless)
    served = {name: check(name).kind.name
              for name in ("tiny-qwen3-next", "tiny-nemotron-h") + ("tiny-kimi-linear",) * kda}
    assert served == {"tiny-qwen3-next": "gdn", "tiny-nemotron-h": "mamba2",
                      **({"tiny-kimi-linear": "kda"} if kda else {})}, served
    refusals = {}
    old_gdn = () if hy._gdn_routes_trees_to_triton() else (
        # 0.5.14 - 0.5.15.post1: a FlashInfer decode or prefill backend takes GDN's verify
        ("gdn-flashinfer-decode", "tiny-qwen3-next", {"linear_attn_decode_backend": "flashinfer"},
         "(Qwen3NextConfig, Gated DeltaNet): --linear-attn-decode-backend flashinfer routes this "
         "SGLang's GDN verify to FlashInfer, whose kernel refuses retrieve_parent_token"),
        ("gdn-flashinfer-base", "tiny-qwen3-next", {"linear_attn_backend": "flashinfer"},
         "--linear-attn-backend flashinfer routes this SGLang's GDN verify to FlashInfer"),
        ("gdn-flashinfer-both", "tiny-qwen3-next", {"linear_attn_decode_backend": "flashinfer",
                                                    "linear_attn_prefill_backend": "flashinfer"},
         "--linear-attn-decode-backend flashinfer and --linear-attn-prefill-backend flashinfer "
         "route this SGLang's GDN verify to FlashInfer"),
    )
    kda_cases = () if not kda else (
        ("kda-flashinfer-decode", "tiny-kimi-linear", {"linear_attn_decode_backend": "flashinfer"},
         "(KimiLinearConfig, Kimi Delta Attention): the KDA verify backend flashinfer has no "
         "tree path proven here (FlashInfer's recurrent_kda is chain-only); use "
         + _kda_verify_flag() + " triton"),)
    for name, model_name, settings, want in old_gdn + kda_cases + (
        ("mamba2-flashinfer", "tiny-nemotron-h", {"mamba_backend": "flashinfer"},
         "(NemotronHConfig, Mamba2): --mamba-backend flashinfer has no tree path (its "
         "selective_state_update refuses retrieve_parent_token); use --mamba-backend triton."),
        ("track-interval", "tiny-qwen3-next", {"disable_radix_cache": False,
                                               "mamba_radix_cache_strategy": "extra_buffer",
                                               "mamba_track_interval": 64},
         "--mamba-track-interval 64 is below the verify width 65 (--speculative-ddtree-budget 64 "
         "+ 1); use --mamba-track-interval >= 65 or --mamba-radix-cache-strategy no_buffer."),
    ):
        try:
            check(model_name, **settings)
        except ValueError as exc:
            refusals[name] = str(exc)
        else:
            raise AssertionError(f"{name} was accepted")
        assert want in refusals[name] and "\n" not in refusals[name], refusals[name]
    # The same interval passes at a budget whose verify width fits it.
    assert check("tiny-qwen3-next", budget=63, disable_radix_cache=False,
                 mamba_radix_cache_strategy="extra_buffer", mamba_track_interval=64) is not None
    return refusals


def case_memory_resolution(_):
    """The terms in SGLang's own argument resolution (ddtree_v2_plugin): a hybrid target's
    max_running_requests is the smaller of the budget x vocab rule every family shares
    (ddtree_utils.size_running_batch) and the recurrent term (ddtree_hybrid), derived when
    unset and refused with the numbers of the term that binds when too large.
    STAND-IN: the device's memory size (no GPU here): 16 MiB. Budget 64, vocab 512: 665.6 kB
    of verify logits per request against half of what --mem-fraction-static leaves; the tiny
    config's states (14.6 kB per slot, 66 slots per request without the radix cache) against
    the mamba share 0.9 / 1.9 of the static pool. At --mem-fraction-static 0.8 the logits fit
    2 and the states 6; at 0.5 the logits fit 6 and the states 4."""
    import logging

    logging.disable(logging.WARNING)
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative import ddtree_v2_plugin as plugin

    _reset_context()
    plugin._device_memory_mib = lambda device: 16.0
    models = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "models")

    def resolve(fraction, **kwargs):
        args = ServerArgs(model_path=os.path.join(models, "tiny-qwen3-next"),
                          speculative_algorithm="DDTREE",
                          speculative_draft_model_path=os.path.join(models, "tiny-dflash-draft"),
                          device="cuda", skip_tokenizer_init=True, disable_radix_cache=True,
                          mem_fraction_static=fraction, **kwargs)
        return _resolved_fields(args)["max_running_requests"]

    def refusal(fraction, wanted):
        try:
            resolve(fraction, max_running_requests=wanted)
        except ValueError as exc:
            assert "\n" not in str(exc), str(exc)
            return str(exc)
        raise AssertionError(f"{wanted} requests were accepted at {fraction}")

    by_logits = resolve(0.8)
    assert by_logits == 2, by_logits  # the logits bind (the states alone would give 6)
    by_states = resolve(0.5)
    assert by_states == 4, by_states  # the states bind (the logits alone would give 6)
    assert resolve(0.5, max_running_requests=4) == 4
    states_refusal = refusal(0.5, 5)  # within the logits' 6, past the states' 4
    assert ("--max-running-requests 5 cannot fit DDTREE's recurrent verify states"
            in states_refusal and "fits 4" in states_refusal), states_refusal
    logits_refusal = refusal(0.8, 48)
    assert ("--max-running-requests 48 cannot fit DDTREE's verify: budget 64 x vocab 512"
            in logits_refusal and "fits 2" in logits_refusal), logits_refusal
    return {"derived_logits_bind": by_logits, "derived_states_bind": by_states,
            "states_refusal": states_refusal, "logits_refusal": logits_refusal}


def main(argv):
    results = {}
    for case in argv:
        try:
            got = getattr(sys.modules[__name__], "case_" + case)(None)
            results[case] = {"ok": True, "facts": got}
        except Exception:
            results[case] = {"ok": False, "error": traceback.format_exc()}
    print(TAG + json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
