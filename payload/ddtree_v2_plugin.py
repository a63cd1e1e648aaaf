"""DDTREE on SGLang's v2 speculative worker (0.5.20 - 0.5.23): registration, server
arguments, and the split between the target's verify width and the draft block.

Installed by the ``sglang-0.5.20`` family as ``sglang/srt/speculative/ddtree_v2_plugin.py``.
The family's one-line hunk at the end of ``spec_info.py`` imports this module, so every
process that can look an algorithm name up (``launch_server``, ``sglang serve``, the
scheduler, data-parallel children, an ``Engine`` in a notebook) has DDTREE registered
before its first ``SpeculativeAlgorithm.from_string``: the lookup itself lives in the
module that registers. An entry point would need package metadata outside ``sglang/``,
which a series cannot install (every path it touches is under ``sglang/``).

Flags (new ``Spec`` fields, the family's hunk on ``arg_groups/fields/spec.py``; the same
names as the v1 families, so one launch command serves every family):

    --speculative-algorithm DDTREE
    --speculative-ddtree-budget B              draft-tree nodes per request, root excluded
                                               (default 64, 1..1024)
    --speculative-ddtree-topk K                candidate tokens kept per draft position
                                               (default min(B, 8))
    --speculative-ddtree-allow-hybrid-unsafe   run on Mamba/GDN/linear-attention targets

What resolution leaves (the worker reads these only through the helpers below):

    speculative_ddtree_budget     = B
    speculative_num_draft_tokens  = B + 1   the TARGET's verify width: CUDA-graph widths,
                                            attention metadata, KV reservation, recurrent
                                            buffers all size by it
    speculative_dflash_block_size = the DRAFT block (the flag, else the draft's config,
                                    else 16: DFlash's own resolution, reused)
    speculative_eagle_topk        = K       K > 1 also turns SGLang's tree paths on (FA3
                                            tree verify, the hybrid backend's recurrent
                                            tree kernels), as for EAGLE
    speculative_num_steps         = 1       as DFLASH (the worker gives EAGLE's verify the
                                            tree depth itself)
    disable_overlap_schedule      untouched: DDTREE keeps the overlap scheduler

Every refusal is one ``ValueError`` line naming the flags involved.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)

ALGORITHM = "DDTREE"

# The DDTree paper measured budgets up to 1024 (speedup peaks at 256-512 at batch 1);
# SGLang verifies up to 48 requests at budget + 1 tokens each, so the serving default
# is smaller. Same bounds and default as the v1 families.
DEFAULT_BUDGET = 64
MAX_BUDGET = 1024

# Default per-depth cap. K = min(B, V) is exactly optimal (the paper's Lemma 1), but
# SGLang sizes the per-request KV reservation of a topk > 1 tree by topk (with page_size
# > 1: pages * page_size * topk per request per step) and the lineage ABI of EAGLE's
# verify carries (B + 1) * K candidates; 8 keeps both small. --speculative-ddtree-topk B
# gives the paper's optimum back.
DEFAULT_MAX_TOPK = 8

# Target-verify attention backends that apply EAGLE's tree mask (speculative_eagle_topk
# > 1; with K == 1 the tree is a chain, which they verify too). trtllm_mha refuses
# topk > 1 for EAGLE; the MLA kernels and the rest do not take a tree mask.
VERIFY_ATTENTION_BACKENDS = ("flashinfer", "triton", "fa3")


# ---------------------------------------------------------------------------
# The three numbers, read from resolved server args or from the runtime ``Spec`` bag
# (``sglang.srt.runtime_context.get_spec()``): both carry the same field names.


def _int_field(args: Any, name: str) -> Optional[int]:
    value = getattr(args, name, None)
    if value is None or isinstance(value, bool):
        return None
    return int(value)


def ddtree_budget(server_args: Any) -> int:
    """B, the draft-tree nodes per request (root excluded). Raises when the args are not
    DDTREE-resolved or the verify width is not B + 1 (a linear fallback would be)."""
    budget = _int_field(server_args, "speculative_ddtree_budget")
    width = _int_field(server_args, "speculative_num_draft_tokens")
    if budget is None or width is None:
        raise ValueError(
            "DDTREE server args are not resolved (speculative_ddtree_budget="
            f"{budget!r}, speculative_num_draft_tokens={width!r}): read them after "
            "ServerArgs.resolve_once(), or from runtime_context.get_spec()."
        )
    if width != budget + 1:
        raise ValueError(
            f"DDTREE verify width speculative_num_draft_tokens={width} is not "
            f"speculative_ddtree_budget + 1 = {budget + 1}: these args were not resolved "
            "by the DDTREE plugin (a DFlash chain would verify like this)."
        )
    return budget


def ddtree_topk(server_args: Any) -> int:
    """K, the candidate tokens kept per draft position (per tree depth), 1..B."""
    budget = ddtree_budget(server_args)
    topk = _int_field(server_args, "speculative_eagle_topk")
    if topk is None or not 1 <= topk <= budget:
        raise ValueError(
            f"DDTREE per-depth top-K speculative_eagle_topk={topk!r} is not in "
            f"[1, budget={budget}]: these args were not resolved by the DDTREE plugin."
        )
    return topk


def ddtree_draft_block(server_args: Any) -> int:
    """The DFlash draft block (bonus token + block - 1 drafted positions); <= B + 1."""
    budget = ddtree_budget(server_args)
    block = _int_field(server_args, "speculative_dflash_block_size")
    if block is None or not 2 <= block <= budget + 1:
        raise ValueError(
            f"DDTREE draft block speculative_dflash_block_size={block!r} is not in "
            f"[2, budget + 1 = {budget + 1}]: these args were not resolved by the DDTREE "
            "plugin."
        )
    return block


def ddtree_verify_width(server_args: Any) -> int:
    """The target's verify width per request: B + 1."""
    return ddtree_budget(server_args) + 1


__all__ = [
    "ALGORITHM",
    "DEFAULT_BUDGET",
    "DEFAULT_MAX_TOPK",
    "MAX_BUDGET",
    "VERIFY_ATTENTION_BACKENDS",
    "ddtree_budget",
    "ddtree_draft_block",
    "ddtree_topk",
    "ddtree_verify_width",
]
