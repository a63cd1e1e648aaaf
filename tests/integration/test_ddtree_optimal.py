"""Optimality by brute force (the paper's Proposition 1 objective).

For small V, L and B, every prefix-closed tree of B draft nodes is enumerated, and the tree the
builder returns must reach the maximum of sum over nodes of the path probability
prod_{i <= depth} q_i(token_i). The same with a cap on nodes per depth.

The built tree's value is recomputed from its STRUCTURE only (tokens, parents, depths, valid)
and the draft's full distributions, never from the builder's own ``scores``: the tree is
checked to be a valid prefix-closed tree within the budget and cap, then each node's path
probability is the product of q_d(token) along its root-to-node path.
"""

from __future__ import annotations

import math

import pytest
import torch

from ddtree_testkit.ddtree_support import DEVICE, ddtree_utils as du


def _rooted_subtrees(children, max_size):
    """Every set of draft nodes that contains the root (node 0) and is closed under parents, of size
    <= max_size (root excluded from the count). Each set is produced exactly once: a node is
    added only from the candidates after the last one added, plus the new node's children."""

    def grow(chosen, candidates):
        yield chosen
        if len(chosen) == max_size:
            return
        for i, node in enumerate(candidates):
            yield from grow(chosen + [node], candidates[i + 1 :] + children[node])

    yield from grow([], list(children[0]))


def _prefix_forest(logprobs, depth_limit, k):
    """All prefixes over the top-k ranks: node ids, children lists, depth, path log-prob."""
    children, depth, score = {0: []}, {0: 0}, {0: 0.0}
    frontier = [0]
    for d in range(1, depth_limit + 1):
        nxt = []
        for parent in frontier:
            for r in range(k):
                node = len(depth)
                children[parent].append(node)
                children[node] = []
                depth[node] = d
                score[node] = score[parent] + float(logprobs[d - 1][r])
                nxt.append(node)
        frontier = nxt
    return children, depth, score


def _best_value(logprobs, depth_limit, k, budget, cap):
    children, depth, score = _prefix_forest(logprobs, depth_limit, k)
    best = -1.0
    for tree in _rooted_subtrees(children, budget):
        if cap is not None:
            per_depth = [0] * (depth_limit + 1)
            for node in tree:
                per_depth[depth[node]] += 1
            if max(per_depth) > cap:
                continue
        best = max(best, sum(math.exp(score[node]) for node in tree))
    # The DFlash chain (the rank-0 path) of min(B, L) nodes is one of the trees enumerated.
    chain = sum(math.exp(sum(float(logprobs[i][0]) for i in range(d))) for d in range(1, min(budget, depth_limit) + 1))
    return best, chain


def _structural_objective(layout, t, logprobs_by_token, budget, cap):
    """Sum over the draft nodes of request t of prod q_d(token) along the node's path, from the
    layout's structure; also checks that structure is a tree the enumeration could produce."""
    tokens = layout.tokens[t].tolist()
    parents = layout.parents[t].tolist()
    depths = layout.depths[t].tolist()
    valid = layout.valid[t].tolist()
    nodes = [i for i in range(1, len(tokens)) if valid[i]]
    assert len(nodes) <= budget and parents[0] == -1 and depths[0] == 0
    per_depth, siblings = {}, set()
    for i in nodes:
        p = parents[i]
        assert 0 <= p < i and (p == 0 or valid[p]) and depths[i] == depths[p] + 1, (t, i)
        assert (p, tokens[i]) not in siblings, "two siblings with one token"
        siblings.add((p, tokens[i]))
        per_depth[depths[i]] = per_depth.get(depths[i], 0) + 1
    if cap is not None:
        assert max(per_depth.values(), default=0) <= cap
    total = 0.0
    for i in nodes:
        logp, node = 0.0, i
        while node > 0:
            logp += float(logprobs_by_token[depths[node] - 1][tokens[node]])
            node = parents[node]
        total += math.exp(logp)
    return total


CONFIGS = [
    # (depth L, vocab V, budget B, cap)
    (3, 2, 1, None),
    (3, 2, 3, None),
    (3, 2, 5, None),
    (3, 2, 7, None),
    (2, 3, 4, None),
    (3, 3, 5, None),
    (3, 3, 6, None),
    (4, 2, 6, None),
    (4, 2, 9, None),
    (3, 3, 8, None),
    (3, 4, 7, None),
    (3, 3, 5, 2),
    (4, 2, 6, 2),
    (3, 3, 6, 1),
    (4, 3, 7, 3),
]


@pytest.mark.parametrize("depth_limit,vocab,budget,cap", CONFIGS)
def test_built_tree_maximises_expected_acceptance(depth_limit, vocab, budget, cap):
    gen = torch.Generator().manual_seed(1000 * depth_limit + 100 * vocab + 10 * budget + (cap or 0))
    trials = 12
    # Dirichlet-like marginals, some peaked, some flat: both deep and wide optima occur.
    temperature = torch.rand(trials, depth_limit, 1, generator=gen) * 3 + 0.2
    logits = torch.randn(trials, depth_limit, vocab, generator=gen) / temperature
    logprobs, tokens = du.topk_logprobs(logits, vocab)
    layout = du.build_ddtree(
        logprobs.to(DEVICE), tokens.to(DEVICE), torch.zeros(trials, dtype=torch.long).to(DEVICE),
        budget, cap,
    )
    layout = du.DDTreeLayout(**{k: (v.cpu() if torch.is_tensor(v) else v)
                                for k, v in vars(layout).items()})
    by_token = torch.log_softmax(logits.double(), dim=-1)
    beaten_chain = 0
    for t in range(trials):
        best, chain = _best_value(logprobs[t].tolist(), depth_limit, vocab, budget, cap)
        built = _structural_objective(layout, t, by_token[t], budget, cap)
        assert built == pytest.approx(best, rel=1e-5, abs=1e-7), (t, built, best)
        beaten_chain += chain < best - 1e-6
    if budget > 1 and cap != 1:
        # The enumeration is not vacuous: the chain is strictly suboptimal somewhere.
        assert beaten_chain > 0


def test_enumeration_counts_match_known_tree_counts():
    # Rooted subtrees of a full binary tree of depth 3 with exactly m nodes below the root:
    # counted independently by the recurrence over the two root subtrees.
    children, _, _ = _prefix_forest([[0.0, 0.0]] * 3, 3, 2)
    counts = [0] * 15
    for tree in _rooted_subtrees(children, 14):
        counts[len(tree)] += 1

    def poly(depth):  # generating polynomial of "subtree hanging from a node of given height"
        if depth == 0:
            return [1]
        child = poly(depth - 1)
        opt = [1] + child  # absent, or present with a subtree
        out = [0] * (2 * len(opt) - 1)
        for i, a in enumerate(opt):
            for j, b in enumerate(opt):
                out[i + j] += a * b
        return out

    assert counts == poly(3)
