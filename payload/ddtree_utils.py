"""DDTree: optimal draft trees from block-diffusion (DFlash) drafts, and tree verification.

Installed into SGLang as ``sglang/srt/speculative/ddtree_utils.py``; also imported directly by
the tests (it depends on torch only at import time; SGLang's CUDA kernels are used lazily when
present and the tensors live on CUDA).

Conventions (one request = one row of the batch):

- The draft gives, per request, L per-position distributions: ``logprobs[:, d-1]`` is the
  distribution of the token at depth d (d = 1..L) after the root. For DFlash's block
  ``[bonus, MASK x (B-1)]`` that is the draft output at block positions 1..B-1, so L = B-1.
- A tree of budget B has n = B + 1 verify tokens per request. Node 0 is the root (the bonus
  token of the previous step, depth 0, parent -1); nodes 1..B are draft nodes.
- Nodes are ordered best first: by path log-probability (float32, accumulated as parent +
  log-prob; descending), exact ties broken by depth, then by the parent's index, then by the
  token's rank (all ascending). So a parent's index is always smaller than its children's,
  siblings are ordered by rank, and both builders produce the identical layout.
- Padding: when B exceeds the number of prefixes the draft allows (sum over d of K^d, or fewer
  when some log-probs are -inf), the remaining nodes are padding (``valid`` False), at the end
  of the node order: token ``pad_token_id`` (0 by default), depth 1, parent 0 (the root), and
  NOT linked into ``retrieve_next_token`` / ``retrieve_next_sibling``, so no verify walk (ours or
  SGLang's ``verify_tree_greedy`` / ``tree_speculative_sampling_target_only``) ever visits or
  accepts them. Their tree-mask row sees the root and themselves; their KV slots are freed.
- Flat indices follow SGLang: the node i of request b is b * n + i (``retrieve_index``).
"""

from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Tuple

import torch

__all__ = [
    "DDTreeLayout",
    "Acceptance",
    "KVPlan",
    "topk_logprobs",
    "build_ddtree",
    "build_ddtree_from_logits",
    "build_ddtree_reference",
    "tree_objective",
    "chain_objective",
    "flat_mask_for_sglang",
    "positions",
    "greedy_accept",
    "sample_accept",
    "kv_bookkeeping",
    "next_context_indices",
    "last_accepted_node",
    "offchain_accepted",
    "joint_filter_probs",
    "final_logit_transform",
    "verify_bytes_per_request",
    "verify_request_cap",
    "RunningBatch",
    "size_running_batch",
]


@dataclass
class DDTreeLayout:
    """The verify layout of a batch of draft trees (n = budget + 1 nodes per request).

    All tensors are on the device of the builder's input.
    """

    tokens: torch.Tensor  # [bs, n] int64; tokens[:, 0] = root (bonus) token
    depths: torch.Tensor  # [bs, n] int64; root 0; position offset of each node
    parents: torch.Tensor  # [bs, n] int64; root -1; parent index < child index
    tree_mask: torch.Tensor  # [bs, n, n] bool; row i: True at i and at its ancestors
    retrieve_index: torch.Tensor  # [bs, n] int64; b * n + i
    retrieve_next_token: torch.Tensor  # [bs, n] int64; first child or -1
    retrieve_next_sibling: torch.Tensor  # [bs, n] int64; next sibling or -1
    valid: torch.Tensor  # [bs, n] bool; False for padding nodes (never accepted)
    scores: torch.Tensor  # [bs, n] float32; path log-probability (root 0, padding -inf)
    max_depth: int  # L: static bound on any node's depth (host int, no sync to read)
    # [bs, n, L + 1] int64: entry t = the ancestor t levels up (t = 0: the node), -1 past the
    # root. Built once with the tree; the greedy walk reads it (None: recomputed there).
    ancestors: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        """n = budget + 1 (the verify width per request)."""
        return self.tokens.shape[1]


@dataclass
class Acceptance:
    """Outcome of verifying a batch of trees (same conventions as SGLang's tree verify)."""

    accept_index: torch.Tensor  # [bs, S] int64 flat indices b*n+i, path order, root first, -1 pad
    accept_length: torch.Tensor  # [bs] int64; accepted DRAFT nodes (root excluded)
    bonus: torch.Tensor  # [bs] int64; target token emitted after the last accepted node
    last_node: torch.Tensor  # [bs] int64; tree index (0..n-1) of the last accepted node
    predicts: torch.Tensor  # [bs*n] int64; like SGLang: at accepted flat index, the emitted token


@dataclass
class KVPlan:
    """Which verify KV slots survive a tree verify."""

    keep_slots: torch.Tensor  # [bs, S] slots of the accepted path, root first, -1 padded
    keep_counts: torch.Tensor  # [bs] int64; accept_length + 1
    keep_mask: torch.Tensor  # [bs*n] bool; True where out_cache_loc's slot is kept
    free_slots: torch.Tensor  # [num_free] slots to free (data-dependent size: one host sync)


# --------------------------------------------------------------------------------------------
# Draft distributions
# --------------------------------------------------------------------------------------------


def topk_logprobs(logits: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-K log-probabilities per draft position.

    logits [bs, L, V] -> (logprobs [bs, L, K] float32 sorted descending, tokens [bs, L, K]
    int64), K = min(k, V). Keeping K = min(budget, V) loses nothing (the paper's Lemma 1).
    Under tensor parallelism the caller gathers per-shard top-k and a global logsumexp and
    passes normalised top-K log-probs to the builder directly.
    """
    if k < 1:
        raise ValueError(f"top-k must be >= 1, got {k}")
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    kk = min(int(k), logits.shape[-1])
    values, indices = torch.topk(logprobs, kk, dim=-1, largest=True, sorted=True)
    return values, indices.long()


def _check_builder_inputs(logprobs, tokens, root_tokens, budget, max_per_depth) -> None:
    if logprobs.dim() != 3 or tokens.shape != logprobs.shape:
        raise ValueError(
            f"logprobs and tokens must both be [bs, L, K]; got {tuple(logprobs.shape)} "
            f"and {tuple(tokens.shape)}"
        )
    if root_tokens.shape != logprobs.shape[:1]:
        raise ValueError(
            f"root_tokens must be [bs]={logprobs.shape[0]}; got {tuple(root_tokens.shape)}"
        )
    if logprobs.shape[1] < 1:
        raise ValueError("the draft gives no depth (L = 0): nothing to build")
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if max_per_depth is not None and max_per_depth < 1:
        raise ValueError(f"max_per_depth must be >= 1 or None, got {max_per_depth}")


def _sorted_candidates(logprobs: torch.Tensor, tokens: torch.Tensor):
    """Candidates sorted by log-prob, descending, per depth. A no-op for ``topk_logprobs``'
    output, but per-shard top-k lists gathered under tensor parallelism arrive unsorted, and
    both builders rely on rank order. Stable, so equal log-probs keep their input order."""
    values, order = torch.sort(logprobs.float(), dim=-1, descending=True, stable=True)
    return values, tokens.long().gather(-1, order)


def _width(budget: int, max_per_depth: Optional[int]) -> int:
    # No depth can hold more than the budget, nor more than the cap.
    return budget if max_per_depth is None else min(budget, int(max_per_depth))


# --------------------------------------------------------------------------------------------
# Vectorised builder
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _candidate_pairs(width: int, k: int) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(parent slot i, rank r) pairs that can reach a depth's top-`width`, in (i, r) order.

    The i-th best prefix of depth d-1 extended with its r-th best token is beaten or tied by
    the (i+1)(r+1) extensions (i' <= i, r' <= r), all earlier in the tie order; so it can only
    be among the `width` best of depth d if (i+1)(r+1) <= width: ~width * ln(width) pairs.
    """
    parent_slots, ranks = [], []
    for i in range(width):
        for r in range(min(k, width // (i + 1))):
            parent_slots.append(i)
            ranks.append(r)
    return tuple(parent_slots), tuple(ranks)


@lru_cache(maxsize=64)
def _candidate_tensors(width: int, k: int, device: torch.device):
    # Cached per device: no host-to-device copy on later calls (and none while a CUDA graph
    # captures the builder, once a warm-up call has filled the cache).
    slots, ranks = _candidate_pairs(width, k)
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    return as_tensor(slots), as_tensor(ranks)


def build_ddtree(
    logprobs: torch.Tensor,
    tokens: torch.Tensor,
    root_tokens: torch.Tensor,
    budget: int,
    max_per_depth: Optional[int] = None,
    pad_token_id: int = 0,
) -> DDTreeLayout:
    """Batched, vectorised builder (the hot path): no per-request loop, no host sync.

    logprobs [bs, L, K] (normalised top-K log-probs, e.g. from ``topk_logprobs``), tokens
    [bs, L, K] int64, root_tokens [bs] int64, budget B >= 1 draft nodes, max_per_depth: optional
    cap on the number of nodes at any one depth. Selects the B prefixes of highest path
    probability (optimal for the expected acceptance length, the paper's Prop. 1-2).

    Per depth d it keeps the W = min(B, cap) best depth-d prefixes (sorted), generated from the
    depth d-1 list by the (i+1)(r+1) <= W candidate pairs; the tree is the B best entries of
    the L lists merged. Stable sorts over candidates laid out in (slot, rank) order give the
    same tie order as the reference heap. Python loops run over depths only.
    """
    _check_builder_inputs(logprobs, tokens, root_tokens, budget, max_per_depth)
    device = logprobs.device
    bs, depth_limit, k = logprobs.shape
    logprobs, tokens = _sorted_candidates(logprobs, tokens)
    width = _width(budget, max_per_depth)
    n = budget + 1
    neg_inf = float("-inf")

    pair_slot, pair_rank = _candidate_tensors(width, k, device)  # [C], [C]
    # Every slot i < W has the pair (i, 0), so there are always >= W candidates per depth.
    cand_logprobs = logprobs[:, :, pair_rank]  # [bs, L, C]: each pair's token log-prob

    # Depth 0: the root alone, in slot 0 (other slots do not exist: -inf).
    prev = torch.full((bs, width), neg_inf, dtype=torch.float32, device=device)
    prev[:, 0] = 0.0
    scores_per_depth, orders_per_depth = [], []
    for d in range(depth_limit):
        cand = prev[:, pair_slot] + cand_logprobs[:, d]  # [bs, C]
        values, order = torch.sort(cand, dim=1, descending=True, stable=True)
        prev = values[:, :width]  # the W best prefixes of depth d + 1 (-inf: none)
        scores_per_depth.append(prev)
        orders_per_depth.append(order[:, :width])  # their candidate pairs
    level_scores = torch.stack(scores_per_depth, dim=1)  # [bs, L, W]
    level_order = torch.stack(orders_per_depth, dim=1)  # [bs, L, W]

    # Merge the depth lists (depth-major, so ties go to the shallower node) and keep B.
    all_scores = level_scores.reshape(bs, depth_limit * width)
    if depth_limit * width < budget:
        pad = torch.full(
            (bs, budget - depth_limit * width), neg_inf, dtype=torch.float32, device=device
        )
        all_scores = torch.cat([all_scores, pad], dim=1)
    node_scores, picked = torch.sort(all_scores, dim=1, descending=True, stable=True)
    node_scores, picked = node_scores[:, :budget], picked[:, :budget]  # [bs, B]
    valid_nodes = node_scores > neg_inf
    picked = torch.where(valid_nodes, picked, torch.zeros_like(picked))
    node_depth0 = picked // width  # depth - 1

    node_pair = level_order.reshape(bs, -1).gather(1, picked)  # [bs, B]
    node_rank = pair_rank[node_pair]
    node_parent_slot = pair_slot[node_pair]
    node_tokens = tokens.reshape(bs, depth_limit * k).gather(1, node_depth0 * k + node_rank)

    # Tree index of every (depth, slot) entry that was picked, to resolve parents.
    index_of = torch.zeros(bs, depth_limit * width + 1, dtype=torch.long, device=device)
    node_index = torch.arange(1, n, device=device).expand(bs, budget)
    sink = depth_limit * width  # padding nodes write here
    index_of.scatter_(1, torch.where(valid_nodes, picked, sink), node_index)
    parent_flat = (node_depth0 - 1).clamp(min=0) * width + node_parent_slot
    node_parent = torch.where(node_depth0 > 0, index_of.gather(1, parent_flat), 0)

    root = root_tokens.long().reshape(bs, 1)
    toks = torch.cat([root, torch.where(valid_nodes, node_tokens, pad_token_id)], dim=1)
    depths = torch.cat(
        [torch.zeros_like(root), torch.where(valid_nodes, node_depth0 + 1, 1)], dim=1
    )
    parents = torch.cat([torch.full_like(root, -1), torch.where(valid_nodes, node_parent, 0)], 1)
    valid = torch.cat([torch.ones_like(root, dtype=torch.bool), valid_nodes], dim=1)
    scores = torch.cat([torch.zeros(bs, 1, device=device), node_scores], dim=1)
    return _assemble(toks, depths, parents, valid, scores, depth_limit)


def build_ddtree_from_logits(
    logits: torch.Tensor,
    root_tokens: torch.Tensor,
    budget: int,
    topk: Optional[int] = None,
    max_per_depth: Optional[int] = None,
) -> DDTreeLayout:
    """Draft logits [bs, L, V] -> layout: ``topk_logprobs`` (K = min(topk or budget, V); more
    than the budget can never be used) then ``build_ddtree``."""
    logprobs, tokens = topk_logprobs(logits, min(topk or budget, budget))
    return build_ddtree(logprobs, tokens, root_tokens, budget, max_per_depth)


def _ancestor_table(parents: torch.Tensor, depth_limit: int) -> torch.Tensor:
    """[bs, n, L + 1]: entry t is the ancestor t levels up (t = 0: the node itself), -1 past
    the root. Pointer doubling: log2(L + 1) batched gathers instead of L sequential ones."""
    bs, n = parents.shape
    table = torch.arange(n, device=parents.device).expand(bs, n).unsqueeze(2)  # [bs, n, 1]
    jump = parents  # ancestor 2^k levels up, [bs, n]
    while table.shape[2] < depth_limit + 1:
        # ancestor (t + 2^k) of i = ancestor t of (ancestor 2^k of i); -1 stays -1
        start = jump.clamp(min=0).reshape(bs, n, 1).expand(bs, n, table.shape[2])
        further = table.gather(1, start)
        further = torch.where(jump.unsqueeze(2) >= 0, further, -1)
        table = torch.cat([table, further], dim=2)
        jump = torch.where(jump >= 0, jump.gather(1, jump.clamp(min=0)), -1)  # 2^(k+1) up
    return table[:, :, : depth_limit + 1]


def _assemble(tokens, depths, parents, valid, scores, depth_limit: int) -> DDTreeLayout:
    """Tree mask, ancestor table and retrieve arrays from the parent array, batched (no
    per-request loop; log2(depth) steps for the ancestors)."""
    bs, n = tokens.shape
    device = tokens.device
    idx = torch.arange(n, device=device).expand(bs, n)
    is_child = valid & (idx > 0)  # linked draft nodes (padding is never linked)

    # First child: the smallest index among a node's children (siblings are index-ordered).
    first = torch.full((bs, n), n, dtype=torch.long, device=device)
    first.scatter_reduce_(
        1, parents.clamp(min=0), torch.where(is_child, idx, n), reduce="amin", include_self=True
    )
    next_token = torch.where(first < n, first, -1)

    # Next sibling: sort linked nodes by (parent, index); neighbours with one parent link up.
    key = torch.where(is_child, parents * n + idx, n * n + idx)
    order = key.argsort(dim=1)
    s_parent = parents.gather(1, order)
    s_linked = is_child.gather(1, order)
    same = s_linked[:, :-1] & s_linked[:, 1:] & (s_parent[:, :-1] == s_parent[:, 1:])
    next_sibling = torch.full((bs, n), -1, dtype=torch.long, device=device)
    next_sibling.scatter_(1, order[:, :-1], torch.where(same, order[:, 1:], -1))

    # Row i sees itself and its ancestors.
    ancestors = _ancestor_table(parents, depth_limit)  # [bs, n, L + 1], -1 past the root
    tree_mask = torch.zeros(bs, n, n, dtype=torch.bool, device=device)
    # Entries past the root (-1) point at the node itself, which is set anyway.
    tree_mask.scatter_(2, torch.where(ancestors >= 0, ancestors, idx.unsqueeze(2)), True)

    retrieve_index = torch.arange(bs * n, device=device).reshape(bs, n)
    return DDTreeLayout(
        tokens=tokens,
        depths=depths,
        parents=parents,
        tree_mask=tree_mask,
        retrieve_index=retrieve_index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        valid=valid,
        scores=scores,
        max_depth=depth_limit,
        ancestors=ancestors,
    )


# --------------------------------------------------------------------------------------------
# Reference builder (readable; CPU; one request at a time)
# --------------------------------------------------------------------------------------------


def _f32(x: float) -> float:
    # Round to float32 so the reference's path scores are bit-identical to the torch builder's
    # (a float32 add computed in double and rounded once is the correctly rounded float32 add).
    return struct.unpack("f", struct.pack("f", x))[0]


def _reference_one(lp, tok, budget: int, width: int):
    """Best-first heap for one request. lp, tok: L lists of K floats / ints.

    Returns the draft nodes in pop order as (token, depth, parent index, score) tuples.
    Heap key: (-score, depth, parent's tree index, rank), the same total order as the
    vectorised builder's stable sorts; parents pop before children, so indices grow downwards.
    """
    depth_limit = len(lp)
    k = min(len(lp[0]) if depth_limit else 0, width)
    nodes = []  # (token, depth, parent, score)
    per_depth = [0] * (depth_limit + 1)
    heap = []

    def push(depth: int, parent: int, rank: int, parent_score: float) -> None:
        if depth > depth_limit or rank >= k:
            return
        score = _f32(parent_score + lp[depth - 1][rank])
        if score == float("-inf"):
            return  # a -inf log-prob is a token the draft forbids; ranks after it too
        heapq.heappush(heap, (-score, depth, parent, rank))

    push(1, 0, 0, 0.0)
    while heap and len(nodes) < budget:
        neg_score, depth, parent, rank = heapq.heappop(heap)
        if per_depth[depth] >= width:
            continue  # depth full (cap): its later siblings and all descendants are out too
        per_depth[depth] += 1
        score = -neg_score
        nodes.append((tok[depth - 1][rank], depth, parent, score))
        me = len(nodes)  # tree index (root is 0)
        parent_score = 0.0 if parent == 0 else nodes[parent - 1][3]
        push(depth, parent, rank + 1, parent_score)  # next sibling
        push(depth + 1, me, 0, score)  # first child
    return nodes


def build_ddtree_reference(
    logprobs: torch.Tensor,
    tokens: torch.Tensor,
    root_tokens: torch.Tensor,
    budget: int,
    max_per_depth: Optional[int] = None,
    pad_token_id: int = 0,
) -> DDTreeLayout:
    """Readable reference: the paper's best-first heap, one request at a time, on the CPU.

    Same inputs and the identical layout as ``build_ddtree`` (the layout is derived here with
    plain loops, independently of the vectorised path).
    """
    _check_builder_inputs(logprobs, tokens, root_tokens, budget, max_per_depth)
    bs, depth_limit, _ = logprobs.shape
    width = _width(budget, max_per_depth)
    n = budget + 1
    logprobs, tokens = _sorted_candidates(logprobs.cpu(), tokens.cpu())
    lp_all = logprobs.tolist()
    tok_all = tokens.tolist()
    roots = root_tokens.long().cpu().tolist()

    out = {name: [] for name in ("tokens", "depths", "parents", "valid", "scores")}
    out.update(next_token=[], next_sibling=[], mask=[], ancestors=[])
    for b in range(bs):
        nodes = _reference_one(lp_all[b], tok_all[b], budget, width)
        pad = n - 1 - len(nodes)
        toks = [roots[b]] + [t for t, _, _, _ in nodes] + [pad_token_id] * pad
        depths = [0] + [d for _, d, _, _ in nodes] + [1] * pad
        parents = [-1] + [p for _, _, p, _ in nodes] + [0] * pad
        valid = [True] * (1 + len(nodes)) + [False] * pad
        scores = [0.0] + [s for _, _, _, s in nodes] + [float("-inf")] * pad

        children = [[] for _ in range(n)]
        for i in range(1, 1 + len(nodes)):
            children[parents[i]].append(i)  # appended in index order = sibling order
        next_token = [c[0] if c else -1 for c in children]
        next_sibling = [-1] * n
        for c in children:
            for a, b2 in zip(c, c[1:]):
                next_sibling[a] = b2
        mask, ancestors = [], []
        for i in range(n):
            row, up = [False] * n, []
            j = i
            while j != -1:
                row[j] = True
                up.append(j)
                j = parents[j]
            mask.append(row)
            ancestors.append(up + [-1] * (depth_limit + 1 - len(up)))

        for name, value in (
            ("tokens", toks), ("depths", depths), ("parents", parents), ("valid", valid),
            ("scores", scores), ("next_token", next_token), ("next_sibling", next_sibling),
            ("mask", mask), ("ancestors", ancestors),
        ):
            out[name].append(value)

    long = dict(dtype=torch.long)
    return DDTreeLayout(
        tokens=torch.tensor(out["tokens"], **long).reshape(bs, n),
        depths=torch.tensor(out["depths"], **long).reshape(bs, n),
        parents=torch.tensor(out["parents"], **long).reshape(bs, n),
        tree_mask=torch.tensor(out["mask"], dtype=torch.bool).reshape(bs, n, n),
        retrieve_index=torch.arange(bs * n).reshape(bs, n),
        retrieve_next_token=torch.tensor(out["next_token"], **long).reshape(bs, n),
        retrieve_next_sibling=torch.tensor(out["next_sibling"], **long).reshape(bs, n),
        valid=torch.tensor(out["valid"], dtype=torch.bool).reshape(bs, n),
        scores=torch.tensor(out["scores"], dtype=torch.float32).reshape(bs, n),
        max_depth=depth_limit,
        ancestors=torch.tensor(out["ancestors"], **long).reshape(bs, n, depth_limit + 1),
    )


# --------------------------------------------------------------------------------------------
# Objectives (the paper's Prop. 1: E[accepted draft tokens] under the draft's surrogate)
# --------------------------------------------------------------------------------------------


def tree_objective(layout: DDTreeLayout) -> torch.Tensor:
    """[bs] float64: sum over draft nodes of the path probability (Prop. 1: E[accepted])."""
    probs = layout.scores[:, 1:].double().exp()
    return torch.where(layout.valid[:, 1:], probs, 0.0).sum(dim=1)


def chain_objective(logprobs: torch.Tensor, length: int) -> torch.Tensor:
    """[bs] float64: the same objective for DFlash's argmax chain of ``length`` nodes."""
    head = logprobs[:, :length, 0].double()
    return head.cumsum(dim=1).exp().sum(dim=1)


# --------------------------------------------------------------------------------------------
# Verify inputs for SGLang
# --------------------------------------------------------------------------------------------


def flat_mask_for_sglang(
    layout: DDTreeLayout, prefix_lens: torch.Tensor, total_prefix_len: Optional[int] = None
) -> torch.Tensor:
    """The FULL custom mask SGLang's FlashInfer/Triton verify path reads (True = may attend).

    For request b: n rows x (prefix_lens[b] + n) columns, the prefix fully visible, then the
    tree mask; flattened row-major and concatenated over the batch. ``total_prefix_len`` (the
    host-side sum of prefix_lens, e.g. ``seq_lens_sum``) avoids a device-to-host sync.
    """
    bs, n = layout.tokens.shape
    device = layout.tokens.device
    prefix = prefix_lens.to(device=device, dtype=torch.long)
    if total_prefix_len is None:
        total_prefix_len = int(prefix.sum().item())  # host sync: pass it in on the hot path
    total = n * int(total_prefix_len) + bs * n * n
    # Everything is visible except inside each request's n x n tree block, so start from all
    # True and scatter only the tree blocks: O(bs*n*n) index work instead of O(total).
    row_len = (prefix + n).repeat_interleave(n)  # [bs*n]
    row_start = row_len.cumsum(0) - row_len  # [bs*n]
    block_start = row_start + prefix.repeat_interleave(n)  # [bs*n]: first tree column of each row
    block_cols = block_start.unsqueeze(1) + torch.arange(n, device=device)  # [bs*n, n]
    mask = torch.ones(total, dtype=torch.bool, device=device)
    mask[block_cols.reshape(-1)] = layout.tree_mask.reshape(-1)
    return mask


def positions(layout: DDTreeLayout, seq_lens: torch.Tensor) -> torch.Tensor:
    """[bs*n] int64 position ids of the verify tokens: seq_lens[b] + depth."""
    return (seq_lens.to(layout.depths.device).long().unsqueeze(1) + layout.depths).reshape(-1)


# --------------------------------------------------------------------------------------------
# Acceptance
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _sgl_kernel_importable() -> bool:
    # Cached: a failed import would otherwise be retried on every verify step.
    try:
        import sgl_kernel  # CUDA-only wheel; optional
    except Exception:
        return False
    return hasattr(sgl_kernel, "verify_tree_greedy")


def _sgl_kernel_available(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and _sgl_kernel_importable()


def _finish(layout, accept_index, accept_length, last_node, bonus_token, emitted) -> Acceptance:
    """predicts like SGLang's: at every path node's flat index, the token emitted after it."""
    bs, n = layout.tokens.shape
    ok = accept_index >= 0
    predicts = torch.zeros(bs * n + 1, dtype=torch.long, device=layout.tokens.device)
    predicts.scatter_(0, torch.where(ok, accept_index, bs * n).reshape(-1), emitted.reshape(-1))
    return Acceptance(
        accept_index=accept_index,
        accept_length=accept_length,
        bonus=bonus_token,
        last_node=last_node,
        predicts=predicts[: bs * n],
    )


def greedy_accept(
    layout: DDTreeLayout, target_tokens: torch.Tensor, backend: str = "torch"
) -> Acceptance:
    """Greedy tree verify: target_tokens [bs, n] = the target's argmax at every node.

    From the root, move to the child whose token equals the target's token at the current node
    (children tried in sibling order) until none does; the target token at the last accepted
    node is the bonus. Semantics of SGLang's ``verify_tree_greedy`` with S = max_depth + 1.
    backend: "torch" (pure torch, any device; no loop), "sgl_kernel" (SGLang's
    CUDA kernel), or "auto" (the kernel when the tensors are on CUDA and it is importable).
    """
    if backend == "auto":
        backend = "sgl_kernel" if _sgl_kernel_available(layout.tokens) else "torch"
    if backend == "sgl_kernel":
        return _greedy_accept_sgl_kernel(layout, target_tokens)
    if backend != "torch":
        raise ValueError(f"unknown backend {backend!r}")

    bs, n = layout.tokens.shape
    device = layout.tokens.device
    target = target_tokens.long()
    steps = layout.max_depth + 1
    idx = torch.arange(n, device=device).expand(bs, n)
    linked = layout.valid & (idx > 0)
    parents = layout.parents.clamp(min=0)

    # A node matches when its token is the target's token at its parent and no earlier
    # sibling carries the same token (the walk tries siblings in order and stops at the first;
    # build_ddtree's siblings never repeat a token, other layouts may).
    matches = linked & (layout.tokens == target.gather(1, parents))
    key = torch.where(linked, parents * (1 << 32) + layout.tokens, -1 - idx)
    sorted_key, order = torch.sort(key, dim=1, stable=True)
    repeat = torch.zeros(bs, n + 1, dtype=torch.bool, device=device)
    repeat.scatter_(
        1, torch.where(sorted_key[:, 1:] == sorted_key[:, :-1], order[:, 1:], n), True
    )
    matches &= ~repeat[:, :n]

    # Accepted = every node from it up to the root matched (the root always counts): the
    # walk's path, found for all nodes at once instead of one depth per step.
    ancestors = layout.ancestors
    if ancestors is None:
        ancestors = _ancestor_table(layout.parents, layout.max_depth)  # [bs, n, L + 1]
    ok = torch.cat([matches, torch.ones(bs, 1, dtype=torch.bool, device=device)], dim=1)
    ok[:, 0] = True
    anc = torch.where(ancestors >= 0, ancestors, n)
    accepted = ok.gather(1, anc.reshape(bs, -1)).reshape(anc.shape).all(dim=2)  # [bs, n]

    # At most one accepted node per depth: place it in the path at its depth.
    base = torch.arange(bs, device=device).unsqueeze(1) * n
    depth_slot = torch.where(accepted, layout.depths, steps)  # steps = a sink column
    accept_index = torch.full((bs, steps + 1), -1, dtype=torch.long, device=device)
    accept_index.scatter_(1, depth_slot, base + idx)
    accept_index = accept_index[:, :steps]
    accept_length = accepted.sum(dim=1) - 1
    last_node = accept_index.gather(1, accept_length.unsqueeze(1)).squeeze(1) - base.squeeze(1)
    bonus = target.gather(1, last_node.unsqueeze(1)).squeeze(1)
    emitted = target.gather(1, (accept_index - base).clamp(min=0))  # the token after each
    return _finish(layout, accept_index, accept_length, last_node, bonus, emitted)


def _greedy_accept_sgl_kernel(layout: DDTreeLayout, target_tokens: torch.Tensor) -> Acceptance:
    from sgl_kernel import verify_tree_greedy  # CUDA only; imported lazily

    bs, n = layout.tokens.shape
    device = layout.tokens.device
    steps = layout.max_depth + 1
    predicts = torch.zeros(bs * n, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32, device=device)
    accept_num = torch.zeros(bs, dtype=torch.int32, device=device)
    verify_tree_greedy(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=layout.tokens.contiguous(),
        retrive_index=layout.retrieve_index.contiguous(),
        retrive_next_token=layout.retrieve_next_token.contiguous(),
        retrive_next_sibling=layout.retrieve_next_sibling.contiguous(),
        target_predict=target_tokens.long().contiguous(),
    )
    accept_index = accept_index.long()
    accept_length = accept_num.long()
    last_flat = accept_index.gather(1, accept_length.unsqueeze(1)).squeeze(1)
    last_node = last_flat - torch.arange(bs, device=device) * n
    bonus = target_tokens.long().gather(1, last_node.unsqueeze(1)).squeeze(1)
    return Acceptance(accept_index, accept_length, bonus, last_node, predicts.long())


def sample_accept(
    layout: DDTreeLayout,
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    coins: Optional[torch.Tensor] = None,
    final_coins: Optional[torch.Tensor] = None,
) -> Acceptance:
    """Lossless tree verify for sampling with a deterministic (one-hot) draft.

    target_probs [bs, n, V]: the target's (temperature / top-k / top-p adjusted) distribution
    at every node. At the current node with distribution p, children are tried in sibling
    order and child token x is accepted with probability p(x) / (remaining mass), the
    rejected tokens leaving the residual; if none is accepted the bonus is drawn from the
    residual (p with the children's tokens removed, renormalised), at a leaf from p itself.
    Implemented with one uniform u per depth: the first child whose cumulative mass (in sibling
    order) exceeds u * mass(p) is accepted, which picks child x with probability p(x) / mass:
    the same law as trying the children one by one (and as SGLang's
    ``tree_speculative_sampling_target_only`` with both thresholds 1 and a one-hot draft).
    coins [bs, max_depth + 1] and final_coins [bs] are uniforms in [0, 1), drawn from
    ``generator`` when not given.
    """
    bs, n = layout.tokens.shape
    device = layout.tokens.device
    steps = layout.max_depth + 1
    probs = target_probs.float()
    vocab = probs.shape[-1]
    if coins is None:
        coins = torch.rand((bs, steps), generator=generator, device=device)
    if final_coins is None:
        final_coins = torch.rand((bs,), generator=generator, device=device)
    idx = torch.arange(n, device=device).expand(bs, n)
    base = torch.arange(bs, device=device) * n
    linked = layout.valid & (idx > 0)
    tokens = layout.tokens.clamp(0, vocab - 1)

    cur = torch.zeros(bs, dtype=torch.long, device=device)
    alive = torch.ones(bs, dtype=torch.bool, device=device)
    residual = torch.zeros(bs, vocab, device=device)
    columns = [base]
    for step in range(steps):
        p = probs.gather(1, cur.view(bs, 1, 1).expand(bs, 1, vocab)).squeeze(1)  # [bs, V]
        is_child = linked & (layout.parents == cur.unsqueeze(1))  # [bs, n]
        p_child = torch.where(is_child, p.gather(1, tokens), 0.0)  # [bs, n]
        cum = p_child.cumsum(dim=1)  # index order = sibling order
        u = coins[:, step : step + 1] * p.sum(dim=1, keepdim=True)
        hit = is_child & (u < cum)
        nxt = torch.where(hit, idx, n).amin(dim=1)
        found = alive & (nxt < n)
        stops = alive & ~found
        # Residual at the node where the walk stops: the rejected children's tokens removed.
        removed = torch.zeros(bs, vocab, device=device).scatter_add_(
            1, tokens, is_child.float()
        )
        res = torch.where(removed > 0, 0.0, p)
        # Float rounding can leave (almost) no residual mass; then fall back to p itself.
        res = torch.where(res.sum(dim=1, keepdim=True) > 0, res, p)
        residual = torch.where(stops.unsqueeze(1), res, residual)
        cur = torch.where(found, nxt, cur)
        if step + 1 < steps:
            columns.append(torch.where(found, base + nxt, -1))
        alive = found

    cdf = residual.cumsum(dim=1)
    u_final = final_coins.unsqueeze(1) * cdf[:, -1:]
    bonus = torch.searchsorted(cdf, u_final.contiguous(), right=True).squeeze(1).clamp(max=vocab - 1)
    accept_index = torch.stack(columns, dim=1)
    accept_length = (accept_index[:, 1:] >= 0).sum(dim=1)
    # Emitted token after each path node: the next path node's token, then the bonus.
    path_nodes = torch.where(accept_index >= 0, accept_index - base.unsqueeze(1), 0)
    next_tokens = torch.cat(
        [layout.tokens.gather(1, path_nodes[:, 1:]), torch.zeros_like(bonus).unsqueeze(1)], 1
    )
    pos = torch.arange(steps, device=device).expand(bs, steps)
    emitted = torch.where(pos == accept_length.unsqueeze(1), bonus.unsqueeze(1), next_tokens)
    return _finish(layout, accept_index, accept_length, cur, bonus, emitted)


# --------------------------------------------------------------------------------------------
# KV cache and draft-context bookkeeping
# --------------------------------------------------------------------------------------------


def kv_bookkeeping(out_cache_loc: torch.Tensor, acceptance: Acceptance) -> KVPlan:
    """Split the verify KV slots out_cache_loc [bs*n] into kept (path order) and freed.

    keep_slots[b, :keep_counts[b]] are the slots the request's next positions
    seq_len .. seq_len + accept_length map to (req_to_token must be rewritten with them: the
    tree wrote node i at seq_len + i, the path needs the node at depth k at seq_len + k).
    """
    accept_index = acceptance.accept_index
    total = out_cache_loc.shape[0]
    ok = accept_index >= 0
    keep_slots = torch.where(ok, out_cache_loc[accept_index.clamp(min=0)], -1)
    keep_mask = torch.zeros(total + 1, dtype=torch.bool, device=out_cache_loc.device)
    keep_mask.scatter_(0, torch.where(ok, accept_index, total).reshape(-1), True)
    keep_mask = keep_mask[:total]
    return KVPlan(
        keep_slots=keep_slots,
        keep_counts=acceptance.accept_length + 1,
        keep_mask=keep_mask,
        free_slots=out_cache_loc[~keep_mask],
    )


def next_context_indices(acceptance: Acceptance) -> Tuple[torch.Tensor, torch.Tensor]:
    """Hidden states that form the next draft context: (padded [bs, S] flat indices into the
    verify batch, root first, -1 pad; mask [bs, S] bool of the valid entries)."""
    index = acceptance.accept_index
    return index, index >= 0


def last_accepted_node(acceptance: Acceptance) -> torch.Tensor:
    """[bs] tree index of the last accepted node: the recurrent (mamba) state to commit."""
    return acceptance.last_node


def offchain_accepted(layout: DDTreeLayout, accept_index: torch.Tensor) -> torch.Tensor:
    """[bs] bool: the accepted path leaves the first-ranked chain, i.e. some accepted draft
    node is not its parent's first child (rank > 0 among its siblings).

    A linear (chain) verify can never do this, so a served DDTREE that counts such steps
    proves its verify walked a tree. accept_index [bs, S]: flat indices b*n+i, -1 padded.
    Pure tensor ops on the layout's device: no host sync.
    """
    bs, n = layout.tokens.shape
    base = torch.arange(bs, device=accept_index.device).unsqueeze(1) * n
    node = torch.where(accept_index >= 0, accept_index - base, 0)  # [bs, S]; pad -> root
    parent = layout.parents.gather(1, node).clamp(min=0)
    first_child = layout.retrieve_next_token.gather(1, parent)
    off = (accept_index >= 0) & (node > 0) & (first_child != node)
    return off.any(dim=1)


# --------------------------------------------------------------------------------------------
# Target distribution for sampling: SGLang's non-speculative sampler's joint filter
# --------------------------------------------------------------------------------------------


def joint_filter_probs(
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """probs [rows, V] (after temperature) -> the distribution SGLang's NON-speculative
    sampler draws from, renormalised.

    The three filters are applied JOINTLY to the unfiltered probs, as SGLang's sampler does
    (flashinfer's joint top-k/top-p order on CUDA, its pure-torch fallback elsewhere): a token
    survives when its rank is below top_k, AND the mass ranked strictly above it is at most
    top_p, AND (min_p > 0) its probability is at least min_p times the largest. Speculative
    verifies that renormalise after top-k and then apply top-p (and ignore min-p) sample a
    different law: p = [.4, .3, .2, .1], top_k 2, top_p .5 gives [.57, .43, 0, 0] here and
    [1, 0, 0, 0] there. The most probable token always survives.
    """
    probs = probs.float()
    sorted_p, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device).unsqueeze(0)
    above = sorted_p.cumsum(dim=-1) - sorted_p
    keep = rank < top_ks.to(probs.device, torch.long).reshape(-1, 1)
    keep &= above <= top_ps.to(probs.device, torch.float32).reshape(-1, 1)
    if min_ps is not None:
        floor = sorted_p[:, :1] * min_ps.to(probs.device, torch.float32).reshape(-1, 1)
        keep &= sorted_p >= floor
    keep[:, 0] = True
    kept = torch.where(keep, sorted_p, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, order, kept)
    return out / out.sum(dim=-1, keepdim=True)


# --------------------------------------------------------------------------------------------
# Draft logits as the model's LM head defines them
# --------------------------------------------------------------------------------------------


def final_logit_transform(
    logits: torch.Tensor, logit_scale: Optional[float] = None, softcap: Optional[float] = None
) -> torch.Tensor:
    """Apply the LM head's logit scale, then the final soft-capping (cap * tanh(x / cap)),
    as SGLang's LogitsProcessor does for Gemma-2 / Cohere / Granite style heads. Both are
    monotone per row, so the top-k set is unchanged, but the log-probs (the tree's path
    scores) are not: without them the tree is built from the wrong distribution."""
    if logit_scale is not None and float(logit_scale) != 1.0:
        logits = logits * float(logit_scale)
    if softcap is not None and float(softcap) > 0:
        logits = torch.tanh(logits / float(softcap)) * float(softcap)
    return logits


# --------------------------------------------------------------------------------------------
# Memory: how many requests a verify step can carry
# --------------------------------------------------------------------------------------------

#: float32 [rows, vocab] tensors a tree verify holds at once per row: the verify logits,
#: and for sampling the probabilities, the filtered copy, the sorted copy and the kernel's
#: draft-probability buffer.
VERIFY_VOCAB_COPIES = 5
#: Share of the memory SGLang leaves free (outside mem_fraction_static) that the verify's
#: vocab-sized tensors may use; the rest stays for the verify forward's activations and the
#: draft step.
VERIFY_FREE_SHARE = 0.5


def verify_bytes_per_request(budget: int, vocab_size: int) -> int:
    """Bytes of vocab-sized float32 tensors one request adds to a tree verify step:
    (budget + 1) rows x vocab x 4 bytes x VERIFY_VOCAB_COPIES."""
    return (int(budget) + 1) * int(vocab_size) * 4 * VERIFY_VOCAB_COPIES


def verify_request_cap(budget: int, vocab_size: int, free_bytes: float) -> int:
    """The most requests one verify step can carry: VERIFY_FREE_SHARE of ``free_bytes`` (the
    memory SGLang plans to leave outside its static pools) divided by
    ``verify_bytes_per_request``. 0 means not even one request fits."""
    usable = max(0.0, float(free_bytes)) * VERIFY_FREE_SHARE
    return int(usable // verify_bytes_per_request(budget, vocab_size))


#: Without an explicit --max-running-requests, DFlash serves 48 requests (both workers).
DEFAULT_MAX_RUNNING_REQUESTS = 48


@dataclass(frozen=True)
class RunningBatch:
    """``size_running_batch``'s decision: the max_running_requests to set, and the line to log."""

    max_running_requests: int
    log: str


def size_running_batch(
    budget: int,
    vocab_size: int,
    device_memory_mib: Optional[float],
    mem_fraction_static: Optional[float],
    wanted: Optional[int],
) -> Optional[RunningBatch]:
    """max_running_requests from budget x vocab against the memory SGLang leaves free (outside
    mem_fraction_static), the one rule of every DDTree family (v1's ``ddtree_args``, v2's
    plugin): derived when the operator set none (``wanted`` None: min(48, cap), returned with
    its log line), refused in one ``ValueError`` line when the operator's is above the cap or
    when not even one request fits. None: nothing to change (no memory plan to size against,
    or an explicit value that fits)."""
    if device_memory_mib is None or mem_fraction_static is None:
        return None  # no memory plan to size against (SGLang itself then guesses)
    vocab = int(vocab_size)
    free_bytes = float(device_memory_mib) * (1 << 20) * (1.0 - float(mem_fraction_static))
    cap = verify_request_cap(budget, vocab, free_bytes)
    per_request_mb = verify_bytes_per_request(budget, vocab) / 1e6
    usable_mb = free_bytes * VERIFY_FREE_SHARE / 1e6
    if cap < 1:
        raise ValueError(
            f"DDTREE budget {budget} with vocab {vocab} needs {per_request_mb:.0f} MB of "
            f"verify buffers per request, more than the {usable_mb:.0f} MB available "
            f"(half of the memory left outside --mem-fraction-static "
            f"{mem_fraction_static}): lower --speculative-ddtree-budget or "
            "--mem-fraction-static."
        )
    if wanted is None:
        value = min(DEFAULT_MAX_RUNNING_REQUESTS, cap)
        return RunningBatch(value, (
            f"DDTREE: max_running_requests = {value} (budget {budget} x vocab {vocab} needs "
            f"{per_request_mb:.0f} MB of verify buffers per request; {usable_mb:.0f} MB "
            f"available fits {cap})."))
    if int(wanted) > cap:
        raise ValueError(
            f"--max-running-requests {wanted} cannot fit DDTREE's verify: budget {budget} x "
            f"vocab {vocab} needs {per_request_mb:.0f} MB per request, {usable_mb:.0f} MB "
            f"available (half of the memory left outside --mem-fraction-static "
            f"{mem_fraction_static}) fits {cap}: use --max-running-requests <= {cap} "
            "or a smaller --speculative-ddtree-budget."
        )
    return None
