"""DDTree on SGLang's v2 speculative worker (0.5.20 - 0.5.23), overlap scheduler kept on.

Installed as ``sglang/srt/speculative/ddtree_worker_v2.py``; ``ddtree_v2_plugin`` makes
``create_worker`` return ``DDTreeWorkerV2`` for ``--speculative-algorithm DDTREE``.

One decode step, all on the device (no ``.item()``, ``.tolist()``, ``.cpu()``, no loop over
requests), so the overlap scheduler's CPU work for the next batch runs alongside:

1. Draft: the DFlash block ``[bonus, MASK x (block - 1)]`` through the draft model, exactly as
   ``DFlashWorkerV2`` runs it (same buffers, KV window, draft CUDA graph). Its head keeps the
   top-K log-probabilities per position instead of the argmax (``_DDTreeTopKHead``: per-shard
   top-K + log-sum-exp under tensor parallelism, folded into the draft CUDA graph through
   ``capture_tail_hooks`` when the graph runs, eager otherwise).
2. Tree: ``ddtree_utils.build_ddtree`` (the one DDTree algorithm of this repository) selects
   the ``budget`` best prefixes of ``ddtree_lineage.finite_logprobs`` (always a full tree);
   ``ddtree_lineage.eagle_lineage`` expresses the tree in EAGLE's candidate-lineage ABI exactly
   as the CUDA tree builder reads it (``ddtree_lineage``'s docstring: widths, depth, strides).
3. Verify + accept: SGLang's own EAGLE tree verify, ``build_eagle_verify_input`` +
   ``run_eagle_verify(..., finalize_tree_path=True)``: tree mask, positions, CUDA-graph
   replay with a mask, greedy walk or target-only tree sampling, and the accepted path's KV
   and hidden states moved to the front of each request's window.
4. Commit: the accepted path now sits at the front, in chain order, so DFlash's chain-shaped
   draft-KV writer (``_append_target_hidden_to_draft_kv_by_loc`` with ``commit_lens``) hands the
   draft the target hidden states of exactly the committed tokens.

Widths: the target verifies ``budget + 1`` tokens per request (``speculative_num_draft_tokens``
after the plugin's resolution); the draft runs its own block (``speculative_dflash_block_size``).
The draft runner sizes itself by the block through the plugin's
``get_num_tokens_per_req_for_target_verify``; ``__init__`` then re-derives what
``DFlashWorkerV2.__init__`` took from ``speculative_num_draft_tokens`` (B + 1 here) for the
block (``_ddtree_set_draft_block``).

Budget schedule (``--speculative-ddtree-budget-schedule``): each decode step picks the entry of
the batch it runs (``ddtree_schedule.pick`` on the batch size, the same batch hunk 0005 reserved
KV for) and builds, verifies and commits that entry's tree; every other number of the step (the
verify width, EAGLE's depth, the off-chain count, the per-entry counters) comes from that entry's
state (``_DDTreeWidth``). The draft block is the same at every width. Attention metadata is per
step in eager mode (the backends read the width from the verify input); CUDA graphs are per
width: at start-up each entry gets a target attention backend and graph runner of its own,
captured for the graph batch sizes its batches pad to (``_ddtree_build_verify_states``, built as
SGLang's EAGLE adaptive runtime states are), and the step swaps them in.

Not supported (refused at start-up by the plugin's resolution, one line each): DFlash heads that
are not per-position marginals (selector, Domino, LiLiCorr), the compact draft window
(``--speculative-draft-window-size``), data-parallel attention. Grammar-constrained requests go
through EAGLE's grammar handling of the verify tree, with the scheduler's grammar barrier passed
on (tests/integration/test_v2_worker.py drives one under the overlap schedule).

Hybrid targets (Mamba2 / GDN / KDA, ``ddtree_hybrid``): the target's hybrid backend, built with
``speculative_eagle_topk = K > 1``, runs its tree-aware recurrent kernels, and
``run_eagle_verify`` commits each request's last accepted node's state through
``spec_utils.commit_mamba_states_after_verify``; the DFlash draft's backends and graphs are built
under ``speculative_eagle_topk = 1`` (``init_attention_backends`` / ``init_cuda_graphs``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
from typing import Optional, Tuple

import torch

from sglang.srt.speculative import dflash_worker_v2 as _dfw
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative import ddtree_schedule
from sglang.srt.speculative.ddtree_lineage import (
    decode_reserve,
    eagle_lineage,
    finite_logprobs,
    lineage_depth,
    sharded_topk_logprobs,
    verify_width,
)
from sglang.srt.speculative.ddtree_utils import build_ddtree

logger = logging.getLogger(__name__)


def _tp_all_gather(tp_group):
    """x [T, m] -> [world, T, m] over the tensor-parallel group (None on one rank)."""
    if tp_group is None or int(tp_group.world_size) == 1:
        return None

    def gather(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(
            (int(tp_group.world_size) * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device
        )
        tp_group.all_gather_into_tensor(out, x.contiguous())
        return out.view(int(tp_group.world_size), *x.shape)

    return gather


class _DDTreeTopKHead:
    """The DFlash draft's head for DDTree: top-K log-probabilities at block positions 1..B-1,
    over the target's LM head (DFlash has none of its own). Called with the draft's hidden
    states, eagerly or as a capture-tail hook inside the draft CUDA graph; results land in
    static buffers (fixed addresses, replay-safe)."""

    def __init__(self, *, weight, block_size, k, num_org, org_vocab_start, max_bs, tp_group):
        self.weight = weight
        self.block_size = int(block_size)
        self.num_org = int(num_org)
        self.org_vocab_start = int(org_vocab_start)
        self.gather = _tp_all_gather(tp_group)
        # One rank: K is capped by the vocabulary; several: every rank gathers exactly K
        # (sharded_topk_logprobs pads a narrow shard).
        self.k = min(int(k), self.num_org) if self.gather is None else int(k)
        rows = int(max_bs) * (self.block_size - 1)
        self.logprobs = torch.empty((rows, self.k), dtype=torch.float32, device=weight.device)
        self.tokens = torch.empty((rows, self.k), dtype=torch.int64, device=weight.device)

    def __call__(self, hidden_states, input_ids=None):
        bs = hidden_states.shape[0] // self.block_size
        hs = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(
            -1, hidden_states.shape[-1]
        )
        if hs.dtype != self.weight.dtype:
            hs = hs.to(self.weight.dtype)
        logits = torch.matmul(hs, self.weight[: self.num_org].T)
        values, ids = sharded_topk_logprobs(
            logits, self.k, vocab_start=self.org_vocab_start, all_gather=self.gather
        )
        rows = hs.shape[0]
        self.logprobs[:rows].copy_(values)
        self.tokens[:rows].copy_(ids)

    def read(self, bs: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(logprobs, tokens) [bs, block - 1, K] of the last call."""
        rows = bs * (self.block_size - 1)
        shape = (bs, self.block_size - 1, self.k)
        return self.logprobs[:rows].view(shape), self.tokens[:rows].view(shape)


class _DDTreeWidth:
    """One schedule entry's verify state: its tree (budget, top-K), EAGLE's widths for it, and
    the target attention backend + CUDA-graph runner that verify at its width (None: the
    target's own, the only ones in eager mode)."""

    def __init__(self, index: int, entry):
        self.index = int(index)
        self.threshold, self.budget, self.topk = entry.threshold, entry.budget, entry.topk
        self.width = verify_width(self.budget)
        self.text = entry.text()
        self.attn_backend = None
        self.graph_runner = None


# ---------------------------------------------------------------------------------------------
# Seams: one per API difference between the releases the v2 families cover (0.5.19 - 0.5.23;
# docs/patches-v2.md, "Families before 0.5.20"). Each follows DFlashWorkerV2 of the release
# it runs in, found by what the release has, never by its version number.


def _plan_kv_locs(target_runner, **plan):
    """The draft block's KV-location plan: 0.5.20+ translate virtual KV ids through the
    runner's ``kv_index_translator.plan`` (a KVLocPlan, bound to the ForwardBatch); 0.5.19's
    translator has no ``plan`` (ForwardBatch.init_new rebinds write locations itself) and its
    DFlashWorkerV2 writes the draft KV at the target's cache locations directly (None)."""
    plan_fn = getattr(getattr(target_runner, "kv_index_translator", None), "plan", None)
    return None if plan_fn is None else plan_fn(**plan)


def _token_count_fields(tokens: int, device) -> dict:
    """ForwardBatch's non-padded token counts as DFlashWorkerV2 of this release fills them:
    0.5.20+ carry ``num_token_non_padded`` (when enabled) and its global host twin; 0.5.19's
    draft block carries neither."""
    enabled = getattr(_dfw, "enable_num_token_non_padded", None)
    if enabled is None:
        return {}
    return {
        "num_token_non_padded": (torch.full((), tokens, dtype=torch.int32, device=device)
                                 if enabled() else None),
        "global_num_token_non_padded_cpu": tokens,
    }


def _graph_flag(batch) -> dict:
    """The scheduler's decode-graph verdict, on the draft block's ForwardBatch where the
    release carries it (0.5.19+ ``can_run_decode_cuda_graph``); 0.5.18's ForwardBatch has no
    such field (its runner decides alone)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(_dfw.ForwardBatch)}
    if "can_run_decode_cuda_graph" not in names:
        return {}
    return {"can_run_decode_cuda_graph": batch.can_run_decode_cuda_graph}


def _draft_tp_scope(worker):
    """The draft's TP scope: 0.5.20+ run the draft under ``draft_tp_context`` (its own
    parallel layout); 0.5.19's draft runs in the target's TP group (no scope)."""
    scope = getattr(_dfw, "draft_tp_context", None)
    if scope is None:
        return contextlib.nullcontext()
    return scope(worker.draft_parallel_layout)


def _unwrap_lora(layer):
    """The layer under a LoRA wrapper: 0.5.19+ ``unwrap_lora_layer``; 0.5.18's DFlash reads
    the target's layers as they are (no unwrap)."""
    unwrap = getattr(_dfw, "unwrap_lora_layer", None)
    return layer if unwrap is None else unwrap(layer)


def _draft_embedding(worker, target_model):
    """The embedding the draft block's noise is read from: 0.5.19+ resolve it from the draft
    and the target (``_resolve_dflash_embedding_module``); 0.5.18 takes the target's input
    embeddings."""
    resolve = getattr(_dfw, "_resolve_dflash_embedding_module", None)
    if resolve is None:
        return target_model.get_input_embeddings()
    return _unwrap_lora(resolve(worker.draft_model, target_model))


def _is_dense_head_weight(weight) -> bool:
    """DFlash's own test for a plain dense lm_head weight (public from 0.5.19 on, private in
    0.5.18); 0.5.14 - 0.5.17 have no such function and ask ``torch.is_floating_point`` of the
    weight inline in their sampler builder (a quantized head stays eager), which is asked here."""
    test = getattr(_dfw, "is_dense_head_weight", None) or getattr(_dfw, "_is_dense_head_weight",
                                                                   None)
    if test is None:
        return weight is not None and bool(torch.is_floating_point(weight))
    return bool(test(weight))


def _spec():
    """The speculative settings of this process (the plugin's seam: the runtime Spec bag,
    or the global ServerArgs on 0.5.14 - 0.5.15.post1)."""
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_settings

    return runtime_settings("spec")


def _draft_block_layout(block: int, device):
    """(position offsets [block], the draft block's spec info) as DFlashWorkerV2.__init__ of
    this release builds them for its block: ``draft_worker_common`` (0.5.18+), else inline as
    0.5.14 - 0.5.15.post1 do (an arange, and a mask-free DFlashVerifyInput of the block)."""
    try:
        from sglang.srt.speculative.draft_worker_common import (
            build_block_pos_offsets,
            make_draft_block_spec_info,
        )
    except ImportError:
        offsets = torch.arange(int(block), device=device, dtype=torch.int64)
        info = _dfw.DFlashVerifyInput(
            draft_token=torch.empty((0,), dtype=torch.long, device=device),
            positions=torch.empty((0,), dtype=torch.int64, device=device),
            draft_token_num=int(block),
            custom_mask=None,
            capture_hidden_mode=_dfw.CaptureHiddenMode.NULL,
        )
        return offsets, info
    return (build_block_pos_offsets(length=int(block), device=device),
            make_draft_block_spec_info(draft_token_num=int(block), device=device))


def _set_draft_model_block(model, block: int) -> None:
    """The draft model adopts the resolved block: ``set_block_size`` (0.5.19+, which also
    re-sizes its convolutions); 0.5.14 - 0.5.18 models keep the block as a plain attribute
    read from their config."""
    setter = getattr(model, "set_block_size", None)
    if setter is not None:
        setter(int(block))
    else:
        model.block_size = int(block)


def _bonus_of(draft_input):
    """The bonus (root) tokens the DFlash draft input carries: ``bonus_tokens`` (0.5.15+), or
    ``verified_id`` (0.5.14)."""
    bonus = getattr(draft_input, "bonus_tokens", None)
    return draft_input.verified_id if bonus is None else bonus


def _reserved_lens(draft_input):
    """(host lengths [bs], their sum) the allocator reserved for this step when the scheduler
    keeps no host copy of seq_lens: ``nxt_kv_lens_cpu`` (0.5.18+), ``reserved_seq_lens_cpu``
    (0.5.14 - 0.5.15.post1)."""
    for name in ("nxt_kv_lens", "reserved_seq_lens"):
        lens = getattr(draft_input, f"{name}_cpu", None)
        if lens is not None:
            return lens, int(getattr(draft_input, f"{name}_sum"))
    raise RuntimeError("DDTREE: the draft input carries no reserved host lengths.")


def _planning_lens(draft_input):
    """0.5.14's host planning lengths (committed + one block, kept through filter and merge by
    its draft input), or None: 0.5.14's scheduler leaves ``seq_lens_cpu`` as the lagging
    committed view under overlap and its DFlash plans the draft and the verify from these."""
    lens = getattr(draft_input, "planning_seq_lens_cpu", None)
    return None if lens is None else (lens, int(draft_input.planning_seq_lens_sum))


def _draft_host_bound(batch, draft_input, block: int, *, out) -> int:
    """Write the draft block's host planning lengths into ``out`` (no device read); return
    their sum. 0.5.15+: the committed prefix (exact there) + one block. 0.5.14: the planning
    lengths its own DFlash passes (the committed prefix lags the device by up to one block
    there). With no host copy of seq_lens: the allocator's reservation."""
    planning = _planning_lens(draft_input)
    if planning is not None:
        out.copy_(planning[0])
        return planning[1]
    if batch.seq_lens_cpu is not None:
        out.copy_(batch.seq_lens_cpu)
        out.add_(block)
        return int(out.sum())
    reserved, total = _reserved_lens(draft_input)
    out.copy_(reserved)
    return total


def _verify_host_view(batch, draft_input) -> None:
    """0.5.14: EAGLE's verify plans the target forward from ``batch.seq_lens_cpu``, the lagging
    committed view under overlap (an under-estimate of the device prefix); give it the planning
    lengths 0.5.14's DFlash verifies with. ``batch`` is the worker's own shallow copy."""
    planning = _planning_lens(draft_input)
    if planning is not None:
        batch.seq_lens_cpu, batch.seq_lens_sum = planning


def _next_decode_input(worker, bonus, new_seq_lens, draft_input):
    """DFlash's next draft input after a decode step. 0.5.15+: bonus and lengths. 0.5.14 names
    the bonus ``verified_id``, carries the allocator's reservation on (the next prepare starts
    from it) and a ``verify_done`` event (the next prepare waits on it when no plan stream runs),
    as its DFlashWorkerV2 does."""
    import inspect

    params = inspect.signature(worker._make_next_draft_input_decode).parameters
    if "bonus_tokens" in params:
        return worker._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens)
    nxt = worker._make_next_draft_input_decode(
        verified_id=bonus, new_seq_lens=new_seq_lens,
        cur_allocated_seq_lens_cpu=getattr(draft_input, "reserved_seq_lens_cpu", None))
    if hasattr(nxt, "verify_done"):
        done = torch.get_device_module(bonus.device).Event()
        done.record()
        nxt.verify_done = done
    return nxt


def _base_forward(worker, batch, on_publish, grammar_barrier, pp_proxy_tensors):
    """DFlashWorkerV2.forward_batch_generation with what this release's takes: 0.5.14 -
    0.5.15.post1 take (batch, on_publish) only."""
    import inspect

    base = super(DDTreeWorkerV2, worker).forward_batch_generation
    params = inspect.signature(base).parameters
    extra = {name: value for name, value in (("grammar_barrier", grammar_barrier),
                                             ("pp_proxy_tensors", pp_proxy_tensors))
             if name in params}
    return base(batch, on_publish, **extra)


def _decode_graph_sizes(configured: bool = False):
    """The decode CUDA-graph batch sizes: the exec bag's (0.5.18+), else the global ServerArgs'
    ``cuda_graph_config.decode.bs`` (0.5.14 - 0.5.15.post1). ``configured``: the configured
    list (the draft head's buffers) rather than the captured one."""
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_settings

    graph = getattr(runtime_settings("exec"), "graph", None)
    if graph is None:  # a ServerArgs
        return list(runtime_settings("exec").cuda_graph_config.decode.bs or ())
    if configured:
        return list(graph.cuda_graph_config.decode.bs)
    return list(graph.cuda_graph_bs_decode or ())


@contextlib.contextmanager
def _decode_graph_sizes_scope(sizes):
    """A context in which decode graphs are captured for ``sizes`` only: the exec bag's
    override (0.5.18+), else the global ServerArgs' graph config replaced and restored."""
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_override, runtime_settings

    settings = runtime_settings("exec")
    graph = getattr(settings, "graph", None)
    if graph is not None:
        with graph.override(cuda_graph_bs_decode=sizes):
            yield
        return
    scoped = copy.deepcopy(settings.cuda_graph_config)
    scoped.decode.bs = list(sizes)
    with runtime_override(settings, cuda_graph_config=scoped):  # (0.5.16: an audited write)
        yield


def _draft_settings_scope(worker):
    """The settings the DFlash draft's attention backends and CUDA graphs are built under: top-K
    1 (``ddtree_hybrid.draft_spec_scope``: the draft verifies DFlash's mask-free block) and, where
    the draft runner reads the verify width from its settings, the draft block. 0.5.18+: the
    runtime Spec bag, which the draft's backends read (its widths come from the plugin's
    per-request answer). 0.5.14 - 0.5.15.post1: the draft runner reads its own ServerArgs (a
    copy DFlashWorkerV2 made), whose ``speculative_num_draft_tokens`` is the target's B + 1:
    the Triton backend's verify indptr and the DFLASH capture's ``draft_token_num`` would
    take it, so the draft block is put there too."""
    import importlib

    from sglang.srt.speculative import ddtree_hybrid
    from sglang.srt.speculative.ddtree_v2_plugin import runtime_override

    if hasattr(importlib.import_module("sglang.srt.runtime_context"), "get_spec"):
        return ddtree_hybrid.draft_spec_scope()
    return runtime_override(worker.draft_model_runner.server_args, speculative_eagle_topk=1,
                            speculative_num_draft_tokens=int(worker.block_size))


# EAGLE's tree verify, the route the worker's verify takes (the second verify seam): from 0.5.16
# on ``eagle_worker_common`` holds it as two functions; 0.5.14 - 0.5.15.post1 have it only as
# EAGLEWorkerV2's ``draft`` tail (the tree build) and its ``verify`` method.


def _eagle_verify_input(batch, roots, parent_list, top_scores_index, draft_tokens, *,
                        target_worker, topk, num_steps, num_draft_tokens, device):
    """EAGLE's verify input for the DDTree lineage: ``build_eagle_verify_input`` (0.5.16+), or
    what ``EAGLEWorkerV2.draft`` of 0.5.14 - 0.5.15.post1 does after its draft forward: the
    CUDA tree builder writing straight into the target backend's verify buffers (full mask)."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput

    try:
        from sglang.srt.speculative.eagle_utils import default_tree_mask_mode
        from sglang.srt.speculative.eagle_worker_common import build_eagle_verify_input
    except ImportError:
        pass
    else:
        return build_eagle_verify_input(
            batch, EagleDraftInput(bonus_tokens=roots), parent_list, top_scores_index,
            draft_tokens, None, target_worker=target_worker, topk=topk, num_steps=num_steps,
            num_draft_tokens=num_draft_tokens, tree_mask_mode=default_tree_mask_mode(),
            device=device)
    from sglang.srt.speculative.eagle_utils import TreeMaskMode, build_tree_kernel_efficient

    if batch.forward_mode.is_idle():
        return EagleVerifyInput.create_idle_input(topk, num_steps, num_draft_tokens)
    backend = target_worker.model_runner.attn_backend
    tree_mask_buf, position_buf = backend.get_verify_buffers_to_fill_after_draft()
    seq_lens_sum = batch.seq_lens_sum
    if seq_lens_sum is None:  # only sizes an unallocated mask: an upper bound, no host read
        seq_lens_sum = 0 if tree_mask_buf is not None else (
            batch.seq_lens.shape[0] * backend.max_context_len)
    (tree_mask, position, retrieve_index, retrieve_next_token, retrieve_next_sibling,
     verify_tokens) = build_tree_kernel_efficient(
        roots, parent_list, top_scores_index, draft_tokens, batch.seq_lens, seq_lens_sum,
        topk, num_steps, num_draft_tokens, TreeMaskMode.FULL_MASK, tree_mask_buf, position_buf)
    return EagleVerifyInput(
        draft_token=verify_tokens, custom_mask=tree_mask, positions=position,
        retrieve_index=retrieve_index, retrieve_next_token=retrieve_next_token,
        retrieve_next_sibling=retrieve_next_sibling, retrieve_cum_len=None,
        spec_steps=num_steps, topk=topk, draft_token_num=num_draft_tokens,
        capture_hidden_mode=None, seq_lens_sum=None, seq_lens_cpu=None, draft_probs=None)


class _EagleVerifyHost:
    """What ``EAGLEWorkerV2.verify`` of 0.5.14 - 0.5.15.post1 reads from its worker, for one
    DDTree verify: the target, the pools, the device, no plan stream, and the tree's widths
    (EAGLE's step count is the lineage depth, its draft-token count the verify width). The
    method and its two compaction helpers are SGLang's own, bound to this object."""

    def __init__(self, worker, *, topk, num_steps, num_draft_tokens):
        import types

        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        self._target_worker = self.target_worker = worker.target_worker
        self.req_to_token_pool = worker.model_runner.req_to_token_pool
        self.token_to_kv_pool_allocator = worker.model_runner.token_to_kv_pool_allocator
        self.device = worker.device
        self.plan_stream, self.plan_stream_ctx = None, contextlib.nullcontext()
        self.topk, self.speculative_num_steps = int(topk), int(num_steps)
        self.speculative_num_draft_tokens = int(num_draft_tokens)
        for name in ("verify", "_finalize_accept_tree_path", "_compact_accept_to_front"):
            setattr(self, name, types.MethodType(getattr(EAGLEWorkerV2, name), self))


def _eagle_verify(worker, batch, *, topk, num_steps, num_draft_tokens, grammar_barrier):
    """EAGLE's verify of ``batch.spec_info`` with the accepted path moved to the front:
    ``run_eagle_verify(finalize_tree_path=True)`` (0.5.16+), or ``EAGLEWorkerV2.verify`` of
    0.5.14 - 0.5.15.post1 (which compacts for top-K > 1 itself; its grammar mask is built on the
    host for constrained batches, and it takes no grammar barrier)."""
    try:
        from sglang.srt.speculative.eagle_worker_common import run_eagle_verify
    except ImportError:
        host = _EagleVerifyHost(worker, topk=topk, num_steps=num_steps,
                                num_draft_tokens=num_draft_tokens)
        return host.verify(batch)
    return run_eagle_verify(
        batch, target_worker=worker.target_worker,
        req_to_token_pool=worker.model_runner.req_to_token_pool,
        token_to_kv_pool_allocator=worker.model_runner.token_to_kv_pool_allocator,
        plan_stream=worker.plan_stream, plan_stream_ctx=worker.plan_stream_ctx, topk=topk,
        num_draft_tokens=num_draft_tokens, device=worker.device, metadata_ready_pre_pad=False,
        finalize_tree_path=True, **_grammar_barrier_arg(run_eagle_verify, grammar_barrier),
        **_verify_depth(run_eagle_verify, num_steps))


@functools.lru_cache(maxsize=8)
def _verify_params(run_verify) -> frozenset:
    """The parameter names of this release's ``run_eagle_verify`` (read once per function)."""
    return frozenset(inspect.signature(inspect.unwrap(run_verify)).parameters)


def _grammar_barrier_arg(run_verify, grammar_barrier) -> dict:
    """The scheduler's grammar barrier where ``run_eagle_verify`` takes one (0.5.17+: the
    grammar mask is built against it); 0.5.16's takes none (its scheduler hands none: the
    mask is built on the host from the requests' grammars, which ``generate_token_bitmask``
    puts on the verify input itself)."""
    return {"grammar_barrier": grammar_barrier} if "grammar_barrier" in _verify_params(run_verify) else {}


def _verify_depth(run_verify, depth: int) -> dict:
    """The tree depth for ``run_eagle_verify`` where the release asks for it: 0.5.17 takes
    ``num_steps`` (its spec-v2 logprobs read depth + 1 accepted slots per request, the width
    of ``accept_index``), given the depth the verify input was built with (its
    ``spec_steps``); 0.5.18+ read it from the verify input themselves."""
    return {"num_steps": int(depth)} if "num_steps" in _verify_params(run_verify) else {}


class DDTreeWorkerV2(DFlashWorkerV2):
    """DFlash draft, DDTree tree, EAGLE tree verify; see the module docstring."""

    # Contract with the toolkit's import/cli smoke levels and matrix --import: this class
    # really tree-verifies (a DDTREE resolving to a class without it is silently linear).
    DDTREE_TREE_VERIFY = True

    def __init__(self, server_args, *args, **kwargs):
        """``server_args`` and then whatever this release's scheduler hands DFlashWorkerV2
        (``draft_worker_kwargs``: 0.5.20+ ``gpu_id, nccl_port, target_worker``; 0.5.18 -
        0.5.19 also ``ps``; 0.5.14 - 0.5.15.post1 the ranks one by one), passed on as given."""
        from sglang.srt.speculative.ddtree_v2_plugin import (
            ddtree_budget,
            ddtree_draft_block,
            ddtree_schedule,
            ddtree_topk,
        )

        spec = _spec()
        # The largest budget / top-K / width (what the target's buffers and graphs are sized
        # by) and the schedule's entries (one entry (1, B, K) for a single budget).
        self.ddtree_budget = ddtree_budget(spec)
        self.ddtree_topk = ddtree_topk(spec)
        self.ddtree_entries = ddtree_schedule(spec)
        draft_block = ddtree_draft_block(spec)
        self.ddtree_verify_width = verify_width(self.ddtree_budget)
        # The draft runner sizes itself by the block already (the plugin's
        # get_num_tokens_per_req_for_target_verify answers the block for the draft worker),
        # but DFlashWorkerV2.__init__ takes its block from speculative_num_draft_tokens,
        # which is B + 1 here. (Not overridden around __init__: the plugin's helpers refuse a
        # Spec whose width is not B + 1, and the draft runner calls them while it builds.)
        super().__init__(server_args, *args, **kwargs)
        self._ddtree_set_draft_block(draft_block)
        # (Selector / Domino / LiLiCorr drafts, the compact draft window and DP attention are
        # refused by the plugin's resolution, before any model loads: tests/test_v2_server_args.)
        self._init_ddtree_state()

    def _ddtree_set_draft_block(self, block: int) -> None:
        """Everything DFlashWorkerV2.__init__ derived from its block, for the draft block."""
        self.block_size = int(block)
        _set_draft_model_block(self.draft_model, self.block_size)
        # What the scheduler-side code reads as this worker's verify width.
        self.speculative_num_draft_tokens = int(self.ddtree_verify_width)
        self._block_pos_offsets, self._draft_block_spec_info = _draft_block_layout(
            self.block_size, self.device)
        self._draft_block_ids_buf = None  # re-sized by _ensure_draft_block_buffers

    def _init_ddtree_state(self) -> None:
        """Per-worker DDTree state (also used by the CPU tests, which build the worker
        without loading models)."""
        # Depths the draft gives: block positions 1..block-1.
        self.ddtree_depth = int(self.block_size) - 1
        self.ddtree_reserve = decode_reserve(self.ddtree_budget, int(self.block_size))
        self._ddtree_head: Optional[_DDTreeTopKHead] = None
        # EAGLE's verify can prepare on a separate plan stream; DDTree prepares on the forward
        # stream (set here: DFlashWorkerV2.__getattr__ would otherwise ask the draft worker).
        self.plan_stream = None
        self.plan_stream_ctx = contextlib.nullcontext()
        # Verify steps in which some request accepted an off-chain node (rank > 0 somewhere
        # on its path): a device counter, read only when the internal state is asked for.
        self._ddtree_offchain = torch.zeros((), dtype=torch.int64, device=self.device)
        self._ddtree_steps = torch.zeros((), dtype=torch.int64, device=self.device)
        # One verify state per schedule entry, and per entry (steps, request-steps, committed
        # tokens) on the device, read only for /server_info.
        self._ddtree_widths = [_DDTreeWidth(i, entry) for i, entry in enumerate(self.ddtree_entries)]
        self._ddtree_active: Optional[_DDTreeWidth] = None
        self._ddtree_counts = torch.zeros((len(self._ddtree_widths), 3), dtype=torch.int64,
                                          device=self.device)

    # ---------------------------------------------------------------------------------
    # Start-up: the draft's backends without the tree path, the target's with it (hybrid).

    def init_attention_backends(self):
        from sglang.srt.speculative import ddtree_hybrid

        with _draft_settings_scope(self):
            super().init_attention_backends()
        # The target's backends were built first, under the resolved K: with K > 1 a hybrid
        # target's recurrent backend must have its tree path on, or the verify would walk the
        # tree as a chain. (K = 1: the tree is a chain, which the chain path serves.)
        tree_on = ddtree_hybrid.target_tree_path_on(self.target_worker.model_runner.attn_backend)
        if tree_on is False and self.ddtree_topk > 1:
            raise RuntimeError(
                f"DDTREE: top-K {self.ddtree_topk}, but the target's hybrid linear-attention "
                "backend was built with speculative_eagle_topk <= 1 (no tree path): refusing to "
                "verify a tree as a chain."
            )

    def init_cuda_graphs(self):
        with _draft_settings_scope(self):
            super().init_cuda_graphs()
        self._ddtree_build_verify_states()

    def _ddtree_build_verify_states(self) -> None:
        """CUDA graphs per schedule width (GPU start-up; not driven on CPU). The target was
        built at the largest width, its graphs captured for every graph batch size; every
        other entry gets, as EAGLE's adaptive runtime states are built, a target attention
        backend of its own (fresh workspace: a graph runner writes its buffers' addresses into
        its graphs) and a graph runner captured at its width for the graph batch sizes its
        running batches pad to. Top-K stays the largest entry's, so hybrid targets keep their
        recurrent tree path at every width (a top-K 1 chain is a tree it verifies)."""
        import time

        from sglang.srt.model_executor.cuda_graph_config import (
            Backend,
            Phase,
            check_cuda_graph_backend,
        )
        from sglang.srt.model_executor.runner import DecodeCudaGraphRunner
        from sglang.srt.speculative.ddtree_v2_plugin import runtime_override

        runner = self.target_worker.model_runner
        largest = self._ddtree_largest()
        if len(self._ddtree_widths) == 1 or check_cuda_graph_backend(Phase.DECODE,
                                                                     Backend.DISABLED):
            return  # one width, or eager: one backend reads every step's width
        captured = sorted(int(b) for b in _decode_graph_sizes())
        # Batches above the largest graph run eagerly whatever their width.
        spans = ddtree_schedule.ranges(self.ddtree_entries, captured[-1] if captured else 0)
        original = (runner.attn_backend, runner.decode_cuda_graph_runner)
        for state, (lo, hi) in zip(self._ddtree_widths, spans):
            if state is largest:
                state.attn_backend, state.graph_runner = original
                continue
            pads = sorted({next((c for c in captured if c >= b), None) for b in range(lo, hi + 1)}
                          - {None})
            state.attn_backend, state.graph_runner = original[0], None
            if not pads:
                continue  # its batches are above every graph: eager, the target's backend
            tic = time.perf_counter()
            with runtime_override(_spec(), speculative_num_draft_tokens=state.width,
                                  speculative_ddtree_budget=state.budget), \
                    _decode_graph_sizes_scope(pads):
                backup = runner.init_new_workspace
                try:
                    state.attn_backend = runner._get_attention_backend(init_new_workspace=True)
                finally:
                    runner.init_new_workspace = backup
                state.graph_runner = DecodeCudaGraphRunner(
                    runner, attn_backend=state.attn_backend, speculative_num_steps=1,
                    speculative_num_draft_tokens=state.width)
            logger.info("DDTREE verify state %s (width %d): graphs for batch sizes %s in %.1f s.",
                        state.text, state.width, pads, time.perf_counter() - tic)
        runner.attn_backend, runner.decode_cuda_graph_runner = original
        self._ddtree_active = largest

    def _ddtree_largest(self) -> "_DDTreeWidth":
        """The entry whose width the target was built with (the largest budget)."""
        return max(self._ddtree_widths, key=lambda state: (state.width, state.topk))

    def _defer_target_verify_gather(self):
        """DFlash defers the target-verify vocab gather (TP > 1) and finishes it in its own
        accept; EAGLE's verify, which DDTree uses, reads full logits. Keep the gather on."""
        return None

    # ---------------------------------------------------------------------------------
    # Start-up: the draft graph folds the top-K head in (instead of DFlash's argmax head).

    def _maybe_build_draft_sampler(self):
        """Replaces DFlash's in-graph argmax head with the top-K head (dense LM head only;
        otherwise the head runs eagerly after the draft forward, same numbers)."""
        from sglang.srt.runtime_context import get_parallel

        head = self._build_ddtree_head(max_bs=max(_decode_graph_sizes(configured=True)))
        if head is None:
            return None
        self._ddtree_head = head
        if get_parallel().tp_rank == 0:
            logger.info("DDTREE draft top-%d head folded into the draft cuda graph.", head.k)
        return head

    def _build_ddtree_head(self, max_bs: int) -> Optional[_DDTreeTopKHead]:
        from sglang.srt.runtime_context import get_parallel

        lm_head = _unwrap_lora(getattr(self._target_worker.model_runner.model, "lm_head", None))
        weight = getattr(lm_head, "weight", None)
        if weight is None or not _is_dense_head_weight(weight):
            return None
        tp_group = get_parallel().tp_group
        shard = getattr(lm_head, "shard_indices", None)
        if shard is None:
            if int(tp_group.world_size) != 1:
                return None
            num_org, start = int(weight.shape[0]), 0
        else:
            if int(shard.num_added_elements) != 0:
                return None
            num_org, start = int(shard.num_org_elements), int(shard.org_vocab_start_index)
        return _DDTreeTopKHead(
            weight=weight,
            block_size=int(self.block_size),
            k=self.ddtree_topk,
            num_org=num_org,
            org_vocab_start=start,
            max_bs=max_bs,
            tp_group=tp_group if int(tp_group.world_size) > 1 else None,
        )

    # ---------------------------------------------------------------------------------
    # Decode

    def forward_batch_generation(
        self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ):
        # Prefill (target prefill + prompt KV into the draft) and idle batches are DFlash's.
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            return _base_forward(self, batch, on_publish, grammar_barrier, pp_proxy_tensors)
        draft_input = batch.spec_info
        state = self._ddtree_select(batch)
        window = self._ddtree_draft(batch, draft_input)
        logprobs, tokens = window["logprobs"], window["tokens"]
        # Grammar-constrained requests: EAGLE's verify masks the target's logits over the tree
        # (GrammarTree.from_device), as it does for EAGLE trees; the draft stays unconstrained.
        return self._ddtree_verify_and_commit(
            batch, draft_input, logprobs, tokens, window, on_publish, grammar_barrier, state
        )

    def _ddtree_select(self, batch) -> "_DDTreeWidth":
        """This step's schedule entry: the one of the batch it runs (its size, on the host:
        the same batch prepare_for_decode reserved the entry's KV window for, hunk 0005), its
        verify state made the target's. Under overlap the batch a step runs is the batch that
        was planned for it, so a width change between planning and running cannot happen."""
        state = self._ddtree_widths[ddtree_schedule.pick(self.ddtree_entries,
                                                         len(batch.seq_lens))]
        if state is not self._ddtree_active:
            if state.attn_backend is not None:  # per-width CUDA graphs (GPU start-up)
                runner = self.target_worker.model_runner
                runner.attn_backend = state.attn_backend
                runner.decode_cuda_graph_runner = state.graph_runner
            self._ddtree_active = state
        return state

    def _ddtree_draft(self, batch, draft_input) -> dict:
        """The DFlash draft block (as DFlashWorkerV2 runs it, plain head only), then the
        top-K head. Returns the block window (cache locs, positions, KV plan) and the
        per-depth top-K log-probs / tokens [bs, block - 1, K]."""
        dfw = _dfw
        bs = len(batch.seq_lens)
        device = self.device
        block = int(self.block_size)
        if batch.seq_lens.is_cuda:  # carried over from the previous overlap iteration
            batch.seq_lens.record_stream(torch.get_device_module(device).current_stream())
        target_model = self.target_worker.model_runner.model
        embed_module = _draft_embedding(self, target_model)
        self._ensure_draft_block_buffers(bs)
        block_ids = self._draft_block_ids_buf[:bs]
        positions_2d = self._draft_block_positions_buf[:bs]
        cache_loc_2d = self._draft_verify_out_cache_loc_buf[:bs]
        prefix_lens = batch.seq_lens
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        block_ids.fill_(int(self._mask_token_id))
        block_ids[:, 0].copy_(_bonus_of(draft_input))
        torch.add(prefix_lens.unsqueeze(1), self._block_pos_offsets, out=positions_2d)
        cache_loc_2d.copy_(
            dfw.assign_extend_cache_locs_func(
                req_pool_indices=batch.req_pool_indices,
                req_to_token=req_to_token,
                start_offset=prefix_lens,
                end_offset=prefix_lens + block,
                batch_size=bs,
                draft_token_num=block,
                device=device,
            ).view(bs, block)
        )
        full_embed = getattr(self, "_full_embed_gpu", None)  # 0.5.19+: DFlash's gathered table
        if full_embed is not None:
            noise = torch.nn.functional.embedding(block_ids, full_embed)
        else:
            noise = embed_module(block_ids)
        if getattr(self, "_noise_embed_scale", 1.0) != 1.0:  # 0.5.18+
            noise = noise * self._noise_embed_scale
        positions = positions_2d.reshape(-1)
        cache_loc = cache_loc_2d.reshape(-1)
        kv_loc_plan = _plan_kv_locs(
            self.target_worker.model_runner,
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=(
                batch.seq_lens_cpu
                if batch.seq_lens_cpu is not None
                else _reserved_lens(draft_input)[0]
            ),
            write_virtual=cache_loc,
            read_extent=block,
        )
        seq_lens_cpu = self._draft_seq_lens_cpu_buf[:bs]
        seq_lens_sum = _draft_host_bound(batch, draft_input, block, out=seq_lens_cpu)
        forward_batch = dfw.ForwardBatch(
            forward_mode=dfw.ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=cache_loc,
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            positions=positions,
            input_embeds=noise.view(-1, noise.shape[-1]),
            spec_algorithm=dfw.SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=dfw.CaptureHiddenMode.NULL,
            **_graph_flag(batch),
            **_token_count_fields(bs * block, device),
        )
        if kv_loc_plan is not None:
            kv_loc_plan.bind(forward_batch, self.draft_model_runner.kv_index_translator)
        with torch.inference_mode(), _draft_tp_scope(self):
            draft_out = self.draft_model_runner.forward(forward_batch)
            if self._ddtree_head is not None and draft_out.can_run_graph:
                logprobs, tokens = self._ddtree_head.read(bs)  # filled inside the graph
            else:
                hidden = draft_out.logits_output.hidden_states
                if hidden is None:
                    raise RuntimeError("DDTREE: the DFlash draft returned no hidden states.")
                head = self._ddtree_head or self._build_ddtree_head(max_bs=bs)
                if head is None or head.logprobs.shape[0] < bs * (block - 1):
                    head = self._build_ddtree_head(max_bs=bs)
                if head is None:
                    raise RuntimeError(
                        "DDTREE needs a dense target lm_head (quantized or added-vocab heads "
                        "are not supported for the draft's top-K)."
                    )
                head(hidden)
                logprobs, tokens = head.read(bs)
        return {
            "logprobs": logprobs,
            "tokens": tokens,
            "cache_loc_2d": cache_loc_2d,
            "positions_2d": positions_2d,
            "kv_loc_plan": kv_loc_plan,
        }

    def _ddtree_build(self, roots, logprobs, tokens, state=None):
        """The entry's tree (its budget, all real nodes: finite_logprobs, and the plugin refused
        drafts that cannot fill a budget) from the draft's top-K sliced to the entry's K (the
        head keeps the largest K, sorted), + its EAGLE lineage. Device-only."""
        state = state or self._ddtree_largest()
        k = min(int(state.topk), int(tokens.shape[2]))
        logprobs, tokens = logprobs[..., :k], tokens[..., :k]
        layout = build_ddtree(finite_logprobs(logprobs), tokens, roots, state.budget)
        parent_list, top_scores_index, draft_tokens = eagle_lineage(layout, tokens)
        return layout, parent_list, top_scores_index, draft_tokens

    def _ddtree_verify_and_commit(
        self, batch, draft_input, logprobs, tokens, window, on_publish, grammar_barrier=None,
        state=None,
    ):
        from sglang.srt.managers.utils import GenerationBatchResult

        bs = len(batch.seq_lens)
        state = state or self._ddtree_select(batch)
        n = state.width
        roots = _bonus_of(draft_input).view(-1).to(torch.int64)
        layout, parent_list, top_scores_index, draft_tokens = self._ddtree_build(
            roots, logprobs, tokens, state
        )
        k = min(int(state.topk), int(tokens.shape[2]))
        # EAGLE's verify rebinds the batch's input ids, cache locs, spec_info and forward
        # mode; a shallow copy keeps the scheduler's batch as it was (UNO does the same).
        batch = copy.copy(batch)
        _verify_host_view(batch, draft_input)
        # The CUDA builder's parent-list stride is k * (depth - 1) + 1 (ddtree_lineage).
        num_steps = lineage_depth(state.budget, k, int(tokens.shape[1]))
        batch.spec_info = _eagle_verify_input(
            batch, roots, parent_list, top_scores_index, draft_tokens,
            target_worker=self.target_worker, topk=k, num_steps=num_steps, num_draft_tokens=n,
            device=self.device)
        result = _eagle_verify(self, batch, topk=k, num_steps=num_steps, num_draft_tokens=n,
                               grammar_barrier=grammar_barrier)
        accept_lens = result.accept_lens  # committed tokens per request (root + accepted)
        new_seq_lens = result.new_seq_lens
        accept_index = getattr(result, "accept_index", None)  # 0.5.20+; 0.5.19 returns none
        self._ddtree_count_offchain(
            accept_index, parent_list, top_scores_index, k,
            accepted=None if accept_index is not None else self._ddtree_offchain_by_tokens(
                result.next_token_ids, accept_lens, tokens[..., :k], n))
        counts = self._ddtree_counts[state.index]  # (steps, request-steps, committed tokens)
        counts[0] += 1
        counts[1] += bs
        counts[2] += accept_lens.sum()
        if on_publish is not None:
            on_publish(new_seq_lens)

        # Draft KV: the accepted path is at the front of each request's window now, in
        # chain order, so the first accept_lens rows of the block window are committed.
        logits_output = result.logits_output
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify requires target hidden states, but got None.")
        width = min(n, int(self.block_size))
        # (Rows past bs * n are TP/EP alignment padding.)
        hidden = hidden[: bs * n].view(bs, n, -1)[:, :width]
        cache_loc_2d = (window["cache_loc_2d"] if window["kv_loc_plan"] is None
                        else self._draft_write_ids(window["kv_loc_plan"]).view(bs, -1))[:, :width]
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden.reshape(-1, hidden.shape[-1]),
            cache_loc=cache_loc_2d.reshape(-1),
            cache_loc_2d=cache_loc_2d,
            positions=window["positions_2d"][:, :width].reshape(-1),
            commit_lens=accept_lens,
        )
        logits_output.hidden_states = None  # not copied to the host under overlap

        next_draft_input = _next_decode_input(
            self, result.next_draft_input.bonus_tokens.to(torch.int64), new_seq_lens, draft_input)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=result.next_token_ids,  # [bs * n], accepted tokens at the front
            accept_lens=accept_lens,
            can_run_cuda_graph=result.can_run_cuda_graph,
            next_draft_input=next_draft_input,
            speculative_num_draft_tokens=n,
            new_seq_lens=new_seq_lens,
            routed_experts_output=result.routed_experts_output,
            indexer_topk_output=result.indexer_topk_output,
            extra_keep_alive_refs=result.extra_keep_alive_refs,
        )

    def _ddtree_count_offchain(self, accept_index, parent_list, top_scores_index, k,
                               accepted=None) -> None:
        """Device-side: +1 when some request's accepted path holds a node of rank > 0.
        ``accepted``: (accepted, rank > 0) per path position where the release returns no
        accept_index (``_ddtree_offchain_by_tokens``)."""
        if accepted is None:
            bs, n = top_scores_index.shape[0], top_scores_index.shape[1] + 1
            node = (accept_index.to(torch.int64) - (torch.arange(bs, device=accept_index.device)
                                                    * n).unsqueeze(1))
            ok = (accept_index >= 0) & (node > 0)
            ranks = top_scores_index.gather(1, (node - 1).clamp(min=0, max=n - 2)) % k
        else:
            ok, ranks = accepted
        self._ddtree_offchain += (ok & (ranks > 0)).any().to(torch.int64)
        self._ddtree_steps += 1

    @staticmethod
    def _ddtree_offchain_by_tokens(next_token_ids, accept_lens, tokens, n):
        """(accepted, rank > 0) per draft depth where ``run_eagle_verify`` returns no
        accept_index (0.5.19): the node of rank r at depth d carries the draft's token
        ``tokens[b, d - 1, r]`` and the K tokens of one depth are distinct, so an accepted node
        is off the first-ranked chain exactly when its token (the front of ``next_token_ids``
        after the path compaction, ``accept_lens - 1`` drafts per request: the bonus is the
        target's) is not its depth's rank-0 token. Device-only, [bs, depth] each."""
        bs, depth = tokens.shape[0], tokens.shape[1]
        front = next_token_ids[: bs * n].view(bs, n)[:, :depth].to(torch.int64)  # [bs, depth]
        accepted = (torch.arange(depth, device=front.device).unsqueeze(0)
                    < (accept_lens.to(torch.int64) - 1).unsqueeze(1))
        return accepted, (front != tokens[:, :, 0].to(torch.int64)).to(torch.int64)

    # ---------------------------------------------------------------------------------
    # Reporting (/server_info internal_states; read on request, never in the decode step)

    def ddtree_internal_state(self) -> dict:
        report = {
            "ddtree_verify_width": int(self.ddtree_verify_width),
            "ddtree_worker_class": type(self).__name__,
            "ddtree_offchain_accepts": int(self._ddtree_offchain.item()),
        }
        if len(self._ddtree_widths) > 1:
            # Per schedule entry: its tree, the decode steps that ran it, and the mean tokens a
            # request committed per step there (the bonus token and the accepted drafts).
            counts = self._ddtree_counts.tolist()
            report["ddtree_schedule"] = [
                {"threshold": state.threshold, "budget": state.budget, "topk": state.topk,
                 "verify_width": state.width, "steps": steps,
                 "mean_accept_length": round(committed / rows, 4) if rows else None}
                for state, (steps, rows, committed) in zip(self._ddtree_widths, counts)]
        return report


def add_ddtree_report(result, scheduler, *args, **kwargs):
    """AFTER hook for ``Scheduler.get_internal_state`` (the same method from 0.5.20 to 0.5.23;
    from 0.5.22 it delegates to ``InternalState``): merges the DDTree report of the contract
    (``ddtree_verify_width``, ``ddtree_worker_class``, ``ddtree_offchain_accepts``) into the
    scheduler's ``internal_state`` when its speculative worker is a DDTree worker."""
    worker = getattr(scheduler, "draft_worker", None)
    report = getattr(worker, "ddtree_internal_state", None)
    state = getattr(result, "internal_state", None)
    if callable(report) and isinstance(state, dict):
        state.update(report())
    return result


__all__ = ["DDTreeWorkerV2", "add_ddtree_report"]
