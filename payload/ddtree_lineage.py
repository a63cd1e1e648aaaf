"""DDTree on SGLang's v2 worker: the pure tensor glue between DDTree and EAGLE's tree verify.

Installed as ``sglang/srt/speculative/ddtree_lineage.py`` (an ``add`` entry of the v2 family);
imported directly by the tests. torch only, no SGLang import: everything here runs on any
device, batched, with no host sync (no ``.item()``, ``.tolist()``, ``.cpu()``, no loop over
requests), so it is safe on the overlap scheduler's decode step and inside a CUDA graph.

Jobs:

- ``sharded_topk_logprobs``: the draft's per-position top-K log-probabilities when the LM head
  is split over tensor-parallel ranks (each rank holds a contiguous vocabulary shard): local
  top-K and local log-sum-exp, gathered, then the global top-K and the global normaliser.
- ``finite_logprobs``: NaN / -inf draft log-probs raised to a finite floor, so that
  ``ddtree_utils.build_ddtree`` always fills the budget with real nodes (no padding).
- ``eagle_lineage`` + ``lineage_depth``: a ``ddtree_utils.DDTreeLayout`` expressed in EAGLE's
  candidate-lineage ABI, the ``(parent_list, top_scores_index, draft_tokens)`` triple and the
  ``depth`` (``num_steps``) that SGLang's ``build_eagle_verify_input`` /
  ``build_tree_kernel_efficient`` turn into the verify mask, positions and retrieve arrays.
  UNO (0.5.20+) uses the same route.
- ``abi_problem``: the one-line refusal of a configuration this ABI cannot carry.
- ``decode_reserve``: the per-request KV over-allocation one DDTree decode step needs.

The ABI, exactly as the CUDA kernels read it
---------------------------------------------

Read from the 0.5.21 - 0.5.23 wheels' JIT sources (``sglang/kernels/jit/csrc/speculative/
tree.cuh``, ``include/sgl_kernel/speculative/eagle.cuh``) and, for 0.5.20, sgl-kernel 0.4.7's
``csrc/speculative/eagle_utils.cu`` (same kernel, no host checks at all);
``tests/integration/test_v2_kernel_contract.py`` pins the lines. With B the budget, n = B + 1 the verify
width, K = ``cand_tokens.shape[2]`` the per-depth top-K, L = ``cand_tokens.shape[1]`` the draft
depth (block - 1) and D = ``lineage_depth(B, K, L)``, the worker hands
``build_tree_kernel_efficient(parent_list, selected_index=top_scores_index, verified_seq_len,
tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling, topk=K,
depth=D, draft_token_num=n, tree_mask_mode)``:

- ``parent_list``: int64 ``[bs, K * (D - 1) + 1]``, contiguous (row stride K * (D - 1) + 1,
  column stride 1). The host check (tree.cuh:53) is ``depth == 1 || parent_width == topk *
  (depth - 1) + 1`` and the kernel (eagle.cuh:81, :115) indexes row b at
  ``b * (topk * (depth - 1) + 1)`` whatever the tensor's real stride is. Entry g (1 <= g <= B - 1)
  is the candidate id of tree node g; entry 0 and entries >= B are -1 and never read.
- ``top_scores_index`` (``selected_index``): int64 ``[bs, B]``, contiguous (stride B, 1).
  Node i (1..B) carries the candidate id ``c_i = parent_i * K + rank_i`` (rank_i < K: the
  token's rank in its depth's top-K list, so ids are unique among siblings, and the parent's
  tree index is ``c_i // K``: group 0 = the root, no lookup; group g > 0 = the node whose id
  equals ``parent_list[b, g]``, found by a forward scan, so the first one wins).
- ``draft_tokens``: int64 ``[bs, B]``; the root token goes in as the draft input's
  ``bonus_tokens`` ([bs] int64).
- ``depth`` = D = ``max(L, 1 + ceil((B - 1) / K))``: at least the tree's depth (EAGLE sizes
  ``accept_index`` ``[bs, D + 1]`` and the walks stop after D levels) and wide enough that
  ``parent_list`` can name every parent index 1..B - 1. D <= B always (EAGLE's
  ``_compact_accept_to_front`` writes D + 1 columns into an n-wide row).
- ``draft_token_num`` = n <= 1024 (tree.cuh:46; the kernel runs one thread per node).

The CUDA builder has a "parent not found" path (a candidate id that names no node): it reads
one element past the request's ``selected_index`` row, and the mask thread writes outside the
node's mask row and may loop forever (``while (true)``, no depth bound, unlike the Triton
twin). So every node must be linked: the worker builds from ``finite_logprobs`` and the plugin
refuses configurations whose draft cannot fill the budget (``tree_capacity(K, L, B) < B``), so
``build_ddtree`` never pads. A padding node handed in anyway (another caller's layout) is
encoded as a later twin of node 1 (same parent, same token, after it in sibling order):
linked, never read past a row, and never accepted by the GREEDY walk (the twin is tried first
and fails or wins for both). It is NOT safe under target-only sampling, which accumulates each
tried sibling's target mass again (sampling.cuh: ``prob_acc += target_prob_single``), so a
twin would be accepted with up to twice its probability: hence no padding on the v2 path.

The verify kernels that read the resulting retrieve arrays (``verify_tree_greedy``,
``tree_speculative_sampling_target_only``) take them as int64 ``[bs, n]`` contiguous, the
candidates as int64 ``[bs, n]``, ``accept_index`` int32 ``[bs, D + 1]``, ``accept_token_num``
int32 ``[bs]``, ``predicts`` int32 ``[bs * n]``; target/draft probabilities float32
``[bs, n, V]`` and coins float32 ``[bs, n]`` / ``[bs]`` (EAGLE's ``eagle_sample`` allocates
those; ``tests/v2_kernel_standins.py`` checks them as the CUDA host code does).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

__all__ = [
    "MAX_VERIFY_WIDTH",
    "LOGPROB_FLOOR",
    "verify_width",
    "decode_reserve",
    "tree_capacity",
    "lineage_depth",
    "parent_width",
    "abi_problem",
    "sharded_topk_logprobs",
    "finite_logprobs",
    "eagle_lineage",
]

#: The CUDA tree builder's bound on the verify width: ``CHECK_HOST(draft_token_num > 0 &&
#: draft_token_num <= 1024)`` (tree.cuh:46); it launches one thread per node.
MAX_VERIFY_WIDTH = 1024

#: What ``finite_logprobs`` turns a NaN or -inf draft log-prob into: far below any real
#: log-prob, and a path of up to 1024 of them stays finite in float32 (about -1e33).
LOGPROB_FLOOR = -1.0e30

# The three flags a refusal names (the v2 plugin's spelling).
_FLAGS = ("--speculative-ddtree-budget", "--speculative-ddtree-topk",
          "--speculative-dflash-block-size")


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


def tree_capacity(topk: int, draft_depth: int, budget: int) -> int:
    """How many distinct draft nodes a per-depth top-``topk`` draft of ``draft_depth`` positions
    can give, counted up to ``budget``: sum over d of min(topk^d, budget), capped at budget.
    Below ``budget``, ``build_ddtree`` pads the tree (nodes the ABI must not carry)."""
    total, level = 0, 1
    for _ in range(int(draft_depth)):
        level = min(level * int(topk), int(budget))
        total += level
        if total >= budget:
            return int(budget)
    return total


def lineage_depth(budget: int, topk: int, draft_depth: int) -> int:
    """D, the ``depth`` / ``num_steps`` handed to EAGLE's verify: the draft depth L, raised
    until the CUDA kernel's parent-list row, ``topk * (D - 1) + 1`` entries, can name every
    parent index 1..budget - 1. max(L, 1 + ceil((B - 1) / K)) <= B when L <= B."""
    need = 1 + (int(budget) - 1 + int(topk) - 1) // int(topk)
    return max(int(draft_depth), need)


def parent_width(budget: int, topk: int, draft_depth: int) -> int:
    """The parent-list width the CUDA kernel demands: topk * (D - 1) + 1 (tree.cuh:53)."""
    return int(topk) * (lineage_depth(budget, topk, draft_depth) - 1) + 1


def abi_problem(budget: int, topk: int, draft_block: int,
                vocab_size: Optional[int] = None) -> Optional[str]:
    """None when EAGLE's CUDA tree ABI carries every DDTree of this configuration, else the
    one-line refusal: it names the three flags and a combination that works.

    Refused: a verify width over the CUDA builder's 1024 (tree.cuh:46), a draft that cannot
    fill the budget with distinct prefixes (the tree would need padding nodes), and a top-K
    wider than the vocabulary (the draft head would return fewer candidates than the K the
    kernels are told)."""
    budget, topk, block = int(budget), int(topk), int(draft_block)
    depth = block - 1
    fix_topk = topk if vocab_size is None else min(topk, int(vocab_size))
    fix_budget = min(budget, MAX_VERIFY_WIDTH - 1, tree_capacity(fix_topk, depth, budget))
    works = (f"e.g. {_FLAGS[0]} {fix_budget} {_FLAGS[1]} {min(fix_topk, fix_budget)} "
             f"{_FLAGS[2]} {block}")
    if verify_width(budget) > MAX_VERIFY_WIDTH:
        return (f"DDTREE: {_FLAGS[0]} {budget} gives a verify width of {budget + 1}, over the "
                f"{MAX_VERIFY_WIDTH} that SGLang's CUDA tree builder takes (one thread per "
                f"node), with {_FLAGS[1]} {topk} and {_FLAGS[2]} {block}; use {works}.")
    if vocab_size is not None and topk > int(vocab_size):
        return (f"DDTREE: {_FLAGS[1]} {topk} exceeds the vocabulary ({vocab_size} tokens), "
                f"with {_FLAGS[0]} {budget} and {_FLAGS[2]} {block}; use {works}.")
    capacity = tree_capacity(topk, depth, budget)
    if capacity < budget:
        return (f"DDTREE: {_FLAGS[0]} {budget} exceeds the {capacity} distinct draft prefixes "
                f"that {_FLAGS[1]} {topk} and {_FLAGS[2]} {block} (draft depth {depth}) allow, "
                f"and EAGLE's CUDA tree verify cannot carry padding nodes; use {works}, or a "
                f"larger {_FLAGS[1]} or {_FLAGS[2]}.")
    return None


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


def finite_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    """float32 log-probs with NaN and -inf raised to ``LOGPROB_FLOOR`` (+inf, impossible for a
    normalised log-prob, to 0). ``build_ddtree`` pads for non-finite path scores; from these it
    selects exactly the budget when the draft has that many distinct prefixes (a NaN draft
    still yields a full tree of its top-K tokens, in rank order, instead of nodes the CUDA
    tree builder cannot link). Device-only, no host sync."""
    return torch.nan_to_num(logprobs.float(), nan=LOGPROB_FLOOR, posinf=0.0,
                            neginf=LOGPROB_FLOOR)


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
    child index, siblings in index order, padding after every real node). cand_tokens
    [bs, L, K]: the per-depth candidate tokens it was built from (sorted by log-prob, as the
    builder sorts them). Returns ``parent_list [bs, K * (D - 1) + 1]``, ``top_scores_index
    [bs, n - 1]`` and ``draft_tokens [bs, n - 1]`` (all int64, contiguous) for
    ``build_eagle_verify_input(..., topk=K, num_steps=D, num_draft_tokens=n)`` with
    ``D = lineage_depth(n - 1, K, L)``; the root token goes in as the draft input's
    ``bonus_tokens``. Device-only, no host sync.
    """
    bs, n = layout.tokens.shape
    k = int(cand_tokens.shape[2])
    width = parent_width(n - 1, k, int(cand_tokens.shape[1]))
    device = layout.tokens.device
    idx = torch.arange(n, device=device).expand(bs, n)
    linked = layout.valid & (idx > 0)
    rank = _token_ranks(layout, cand_tokens)
    cand_id = layout.parents.clamp(min=0) * k + rank  # [bs, n]; node 0's entry is unused
    tokens = layout.tokens
    if n > 1:
        # Padding (never from the v2 worker): a later twin of node 1, the root's first child.
        pad = (idx > 0) & ~linked
        cand_id = torch.where(pad, cand_id[:, 1:2], cand_id)
        tokens = torch.where(pad, tokens[:, 1:2], tokens)
    # Entry g names node g; only parents (g <= n - 2 < width) are ever looked up, and group 0
    # stands for the root (never read). The rest of the row stays -1.
    parent_list = torch.full((bs, width), -1, dtype=torch.long, device=device)
    named = min(n - 1, width)
    if named > 1:
        parent_list[:, 1:named] = cand_id[:, 1:named]
    return parent_list, cand_id[:, 1:].contiguous(), tokens[:, 1:].long().contiguous()
