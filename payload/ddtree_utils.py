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
- Nodes are ordered best first: by path log-probability (descending), ties broken by depth
  (ascending) then by the ranks along the path (lexicographic). So a parent's index is always
  smaller than its children's, siblings are ordered by rank, and both builders produce the
  identical layout.
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
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

__all__ = [
    "DDTreeLayout",
    "Acceptance",
    "KVPlan",
    "topk_logprobs",
    "build_ddtree",
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


def topk_logprobs(logits: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-K log-probabilities per draft position.

    logits [bs, L, V] -> (logprobs [bs, L, K] float32 sorted descending, tokens [bs, L, K]
    int64), K = min(k, V). Keeping K = min(budget, V) loses nothing (the paper's Lemma 1).
    Under tensor parallelism the caller gathers per-shard top-k and a global logsumexp and
    passes normalised top-K log-probs to the builder directly.
    """
    raise NotImplementedError


def build_ddtree(
    logprobs: torch.Tensor,
    tokens: torch.Tensor,
    root_tokens: torch.Tensor,
    budget: int,
    max_per_depth: Optional[int] = None,
    pad_token_id: int = 0,
) -> DDTreeLayout:
    """Batched, vectorised builder (the hot path): no per-request loop, no host sync.

    logprobs [bs, L, K] (sorted descending along K, e.g. from ``topk_logprobs``), tokens
    [bs, L, K] int64, root_tokens [bs] int64, budget B >= 1 draft nodes, max_per_depth: optional
    cap on the number of nodes at any one depth. Selects the B prefixes of highest path
    probability (optimal for the expected acceptance length, the paper's Prop. 1-2).
    """
    raise NotImplementedError


def build_ddtree_reference(
    logprobs: torch.Tensor,
    tokens: torch.Tensor,
    root_tokens: torch.Tensor,
    budget: int,
    max_per_depth: Optional[int] = None,
    pad_token_id: int = 0,
) -> DDTreeLayout:
    """Readable reference: the paper's best-first heap, one request at a time, on the CPU.

    Same inputs and the identical layout as ``build_ddtree``.
    """
    raise NotImplementedError


def tree_objective(layout: DDTreeLayout) -> torch.Tensor:
    """[bs] float64: sum over draft nodes of the path probability (Prop. 1: E[accepted])."""
    raise NotImplementedError


def chain_objective(logprobs: torch.Tensor, length: int) -> torch.Tensor:
    """[bs] float64: the same objective for DFlash's argmax chain of ``length`` nodes."""
    raise NotImplementedError


def flat_mask_for_sglang(
    layout: DDTreeLayout, prefix_lens: torch.Tensor, total_prefix_len: Optional[int] = None
) -> torch.Tensor:
    """The FULL custom mask SGLang's FlashInfer/Triton verify path reads (True = may attend).

    For request b: n rows x (prefix_lens[b] + n) columns, the prefix fully visible, then the
    tree mask; flattened row-major and concatenated over the batch. ``total_prefix_len`` (the
    host-side sum of prefix_lens, e.g. ``seq_lens_sum``) avoids a device-to-host sync.
    """
    raise NotImplementedError


def positions(layout: DDTreeLayout, seq_lens: torch.Tensor) -> torch.Tensor:
    """[bs*n] int64 position ids of the verify tokens: seq_lens[b] + depth."""
    raise NotImplementedError


def greedy_accept(layout: DDTreeLayout, target_tokens: torch.Tensor) -> Acceptance:
    """Greedy tree verify: target_tokens [bs, n] = the target's argmax at every node.

    From the root, move to the child whose token equals the target's token at the current node
    (children tried in sibling order) until none does; the target token at the last accepted
    node is the bonus. Semantics of SGLang's ``verify_tree_greedy`` with S = max_depth + 1.
    """
    raise NotImplementedError


def sample_accept(
    layout: DDTreeLayout,
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    coins: Optional[torch.Tensor] = None,
    final_coins: Optional[torch.Tensor] = None,
) -> Acceptance:
    """Lossless tree verify for sampling with a deterministic (one-hot) draft.

    target_probs [bs, n, V]: the target's (temperature / top-k / top-p adjusted) distribution
    at every node. At the current node with residual p (initially the node's distribution),
    children are tried in sibling order: child token x is accepted with probability
    p(x) / (remaining mass); on rejection p(x) := 0. If no child is accepted the bonus is drawn
    from the residual; at a leaf, from the node's full distribution. Uses one uniform per
    depth (coins [bs, max_depth + 1]) plus one for the final draw (final_coins [bs]); drawn
    from ``generator`` when not given.
    """
    raise NotImplementedError


def kv_bookkeeping(out_cache_loc: torch.Tensor, acceptance: Acceptance) -> KVPlan:
    """Split the verify KV slots out_cache_loc [bs*n] into kept (path order) and freed.

    keep_slots[b, :keep_counts[b]] are the slots the request's next positions
    seq_len .. seq_len + accept_length map to (req_to_token must be rewritten with them: the
    tree wrote node i at seq_len + i, the path needs node at depth k at seq_len + k).
    """
    raise NotImplementedError


def next_context_indices(acceptance: Acceptance) -> Tuple[torch.Tensor, torch.Tensor]:
    """Hidden states that form the next draft context: (padded [bs, S] flat indices into the
    verify batch, root first, -1 pad; mask [bs, S] bool of the valid entries)."""
    raise NotImplementedError


def last_accepted_node(acceptance: Acceptance) -> torch.Tensor:
    """[bs] tree index of the last accepted node: the recurrent (mamba) state to commit."""
    return acceptance.last_node
