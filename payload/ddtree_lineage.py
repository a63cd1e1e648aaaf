"""DDTree on SGLang's v2 worker: the pure tensor glue between DDTree and EAGLE's tree verify.

Installed as ``sglang/srt/speculative/ddtree_lineage.py`` (an ``add`` entry of the v2 family);
imported directly by the tests. torch only, no SGLang import: everything here runs on any
device, batched, with no host sync (no ``.item()``, ``.tolist()``, ``.cpu()``, no loop over
requests), so it is safe on the overlap scheduler's decode step and inside a CUDA graph.

Three jobs:

- ``sharded_topk_logprobs``: the draft's per-position top-K log-probabilities when the LM head
  is split over tensor-parallel ranks (each rank holds a contiguous vocabulary shard): local
  top-K and local log-sum-exp, gathered, then the global top-K and the global normaliser.
- ``eagle_lineage``: a ``ddtree_utils.DDTreeLayout`` expressed in EAGLE's candidate-lineage ABI,
  the ``(parent_list, top_scores_index, draft_tokens)`` triple that SGLang's
  ``build_eagle_verify_input`` / ``build_tree_kernel_efficient`` turn into the verify mask,
  positions and retrieve arrays. UNO (0.5.20+) uses the same route.
- ``decode_reserve``: the per-request KV over-allocation one DDTree decode step needs.

The lineage ABI, as SGLang's tree builder reads it (``build_tree_kernel_efficient`` in
``sglang/kernels/ops/speculative/spec_tree.py``): node i (1..n-1) of a request carries a
candidate id ``c_i = top_scores_index[b, i-1]``; its parent group is ``g = c_i // topk``;
group 0 means "child of the root", else the parent is the node whose candidate id equals
``parent_list[b, g]``. A node whose parent id matches no node is not linked (never visited by
the verify walk). Children are linked in ascending node order; a node's depth is the length
of its parent chain. Our encoding: group of a node = its own tree index, so
``c_i = parent_i * K + rank_i`` (rank_i < K: the token's rank in the parent's top-K list,
unique among siblings) and ``parent_list[b, g] = c_g``. Padding nodes (``valid`` False) get a
group whose ``parent_list`` entry is -1, which no candidate id equals: unlinked, as in
``ddtree_utils``.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

__all__ = [
    "verify_width",
    "decode_reserve",
    "sharded_topk_logprobs",
    "eagle_lineage",
]


def verify_width(budget: int) -> int:
    """The target's verify width per request: the root (bonus) plus ``budget`` draft nodes."""
    if budget < 1:
        raise ValueError(f"DDTree budget must be >= 1, got {budget}")
    return int(budget) + 1


def decode_reserve(budget: int, draft_block: int) -> int:
    """KV slots per request that ``prepare_for_decode`` must keep allocated past the committed
    length the scheduler sees.

    On the overlap scheduler the host's committed length lags the device's by one step, and
    one step commits at most ``draft_block`` tokens (the accepted path has at most
    ``draft_block - 1`` draft nodes plus the bonus). The step then writes a window of
    ``max(budget + 1, draft_block)`` slots from the true committed length (the tree verify
    writes budget + 1, the draft block writes draft_block). DFlash reserves
    ``2 * num_draft_tokens``, which for DDTree (num_draft_tokens = budget + 1) is
    2 * budget + 2: at budget 64 and block 16 that is 130 slots where 81 suffice.
    """
    if draft_block < 2:
        raise ValueError(f"DFlash draft block must be >= 2, got {draft_block}")
    return int(draft_block) + max(verify_width(budget), int(draft_block))


def sharded_topk_logprobs(
    local_logits: torch.Tensor,
    k: int,
    vocab_start: int = 0,
    all_gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-K log-probabilities over a vocabulary split into contiguous shards.

    local_logits [T, V_local]: this rank's logits (the shard starting at ``vocab_start``).
    all_gather: maps a local [T, m] tensor to the ranks' tensors stacked [world, T, m] (None:
    one rank, the shard is the whole vocabulary). Returns (logprobs [T, K'] float32 sorted
    descending, tokens [T, K'] int64 global ids): K' = min(k, V_local) on one rank, k over
    several (padded with -inf log-probs if the whole vocabulary is smaller than k).

    Exact: the global top-K is among the union of the shards' top-K, and the global
    normaliser is the log-sum-exp of the shards' log-sum-exps. Ties between equal logits go to
    the lower token id (shards are ordered by rank, ids ascending within a shard; stable sorts).
    """
    if k < 1:
        raise ValueError(f"top-k must be >= 1, got {k}")
    logits = local_logits.float()
    kk = min(int(k), logits.shape[-1])
    values, ids = torch.topk(logits, kk, dim=-1, largest=True, sorted=True)
    ids = ids.long() + int(vocab_start)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [T, 1]
    if all_gather is None:
        return values - lse, ids
    if kk < k:
        # A shard narrower than K (the last rank of an uneven split): pad to K so every rank
        # gathers the same shape; -inf candidates are never picked over real ones.
        pad = int(k) - kk
        values = torch.cat([values, values.new_full((values.shape[0], pad), float("-inf"))], 1)
        ids = torch.cat([ids, ids.new_full((ids.shape[0], pad), int(vocab_start))], 1)
        kk = int(k)
    world_values = all_gather(values)  # [W, T, kk]
    world_ids = all_gather(ids)
    world_lse = all_gather(lse)  # [W, T, 1]
    total_lse = torch.logsumexp(world_lse, dim=0)  # [T, 1]
    w, t, _ = world_values.shape
    cand_values = world_values.permute(1, 0, 2).reshape(t, w * kk)
    cand_ids = world_ids.permute(1, 0, 2).reshape(t, w * kk)
    kk_total = min(int(k), w * kk)
    # Candidates are rank-major with ids ascending between ranks; a stable descending sort
    # keeps equal values in that order, i.e. lower id first (what a full-vocab topk does on
    # ties in practice, and what the one-rank path gives).
    top_values, order = torch.sort(cand_values, dim=-1, descending=True, stable=True)
    top_ids = cand_ids.gather(-1, order[:, :kk_total])
    return top_values[:, :kk_total] - total_lse, top_ids


def _token_ranks(layout, cand_tokens: torch.Tensor) -> torch.Tensor:
    """[bs, n] rank of every node's token in its depth's candidate list (0 for the root and
    for padding). cand_tokens [bs, L, K]: the candidate tokens the tree was built from."""
    bs, n = layout.tokens.shape
    depth_limit, k = cand_tokens.shape[1], cand_tokens.shape[2]
    depth0 = (layout.depths - 1).clamp(min=0, max=depth_limit - 1)  # [bs, n]
    per_node = cand_tokens.long().gather(
        1, depth0.unsqueeze(2).expand(bs, n, k)
    )  # [bs, n, K]: the candidate list of each node's depth
    hit = per_node == layout.tokens.unsqueeze(2)
    # First match (a depth's candidate list never repeats a token).
    rank = torch.where(hit, torch.arange(k, device=hit.device), k).amin(dim=2)
    linked = layout.valid & (torch.arange(n, device=hit.device) > 0)
    return torch.where(linked, rank, 0)


def eagle_lineage(
    layout, cand_tokens: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A DDTree layout in EAGLE's candidate-lineage ABI (see the module docstring).

    layout: ``ddtree_utils.DDTreeLayout`` (n = budget + 1 nodes per request, parent index <
    child index, siblings in index order). cand_tokens [bs, L, K]: the per-depth candidate
    tokens it was built from (sorted by log-prob, as the builder sorts them). Returns
    ``parent_list [bs, n + 1]``, ``top_scores_index [bs, n - 1]`` and ``draft_tokens
    [bs, n - 1]`` (all int64) for ``build_eagle_verify_input(..., topk=K, num_steps=L,
    num_draft_tokens=n)``; the root token goes in as the draft input's ``bonus_tokens``.
    Device-only, no host sync.
    """
    bs, n = layout.tokens.shape
    k = int(cand_tokens.shape[2])
    device = layout.tokens.device
    idx = torch.arange(n, device=device).expand(bs, n)
    linked = layout.valid & (idx > 0)
    rank = _token_ranks(layout, cand_tokens)
    # Padding nodes hang off group n, whose parent_list entry (-1) matches nothing.
    group = torch.where(linked, layout.parents.clamp(min=0), n)
    cand_id = group * k + rank  # [bs, n]; node 0's entry is unused
    parent_list = torch.cat(
        [torch.where(linked | (idx == 0), cand_id, -1), torch.full((bs, 1), -1, device=device,
                                                                   dtype=torch.long)],
        dim=1,
    )
    # Group 0 stands for the root: its entry is never read (a group-0 child needs no lookup).
    parent_list[:, 0] = -1
    return parent_list, cand_id[:, 1:].contiguous(), layout.tokens[:, 1:].contiguous()
