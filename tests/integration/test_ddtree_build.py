"""DDTree builders: the vectorised builder equals the reference heap, and every layout is a
well-formed SGLang verify tree.

Thousands of random requests go through as large batches (one request = one input), with
exact ties, tiny vocabularies, budgets beyond what the depth allows, B = 1, per-depth caps and
-inf log-probs.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from ddtree_testkit.ddtree_support import DEVICE, ddtree_utils as du, layout_mismatch, quantised_logits

CASES = [
    # (bs, depth L, vocab V, top-k, budget B, max_per_depth, logits kind)
    (1000, 4, 5, 5, 8, None, "ties"),
    (1000, 3, 3, 3, 30, None, "ties"),  # 3 + 9 + 27 = 39 prefixes: B close to the cap
    (500, 3, 2, 2, 40, None, "ties"),  # only 14 prefixes: 26 padding nodes
    (1000, 6, 4, 4, 1, None, "ties"),  # B = 1: DFlash's chain head
    (500, 15, 64, 16, 64, None, "normal"),
    (200, 15, 300, 256, 256, None, "peaked"),
    (500, 5, 6, 6, 20, 3, "ties"),  # cap on nodes per depth
    (500, 8, 10, 10, 12, 1, "normal"),  # cap 1: a chain of the best path, length min(B, L)
    (500, 2, 1, 1, 5, None, "normal"),  # V = 1: a 2-node chain and 3 padding nodes
]


def _logits(kind: str, bs: int, depth: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "ties":
        return quantised_logits(bs, depth, vocab, levels=3, generator=gen)
    if kind == "peaked":
        return torch.randn(bs, depth, vocab, generator=gen) * 4.0
    return torch.randn(bs, depth, vocab, generator=gen)


def _build_both(logprobs, tokens, roots, budget, cap):
    fast = du.build_ddtree(logprobs.to(DEVICE), tokens.to(DEVICE), roots.to(DEVICE), budget, cap)
    ref = du.build_ddtree_reference(logprobs, tokens, roots, budget, cap)
    return fast, ref


@pytest.mark.parametrize("bs,depth,vocab,k,budget,cap,kind", CASES)
def test_vectorised_builder_equals_reference_heap(bs, depth, vocab, k, budget, cap, kind):
    params = (bs, depth, vocab, k, budget, cap, kind)
    gen = torch.Generator().manual_seed(zlib.crc32(repr(params).encode()))
    logprobs, tokens = du.topk_logprobs(_logits(kind, bs, depth, vocab, gen), k)
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    fast, ref = _build_both(logprobs, tokens, roots, budget, cap)
    assert fast.tokens.device.type == DEVICE.type  # stays on the input's device
    assert layout_mismatch(fast, ref) is None, layout_mismatch(fast, ref)
    assert torch.allclose(du.tree_objective(fast).cpu(), du.tree_objective(ref))
    _check_well_formed(ref, cap)


def test_minus_inf_logprobs_are_never_nodes():
    # A vocabulary mask (e.g. grammar or padded vocab) gives -inf log-probs: such tokens must
    # not become nodes, whatever the budget; both builders turn the shortfall into padding.
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(300, 4, 6, generator=gen)
    logits[torch.rand(300, 4, 6, generator=gen) < 0.4] = float("-inf")
    logits[:, :, 0] = torch.randn(300, 4, generator=gen)  # keep one finite token per depth
    logprobs, tokens = du.topk_logprobs(logits, 6)
    fast, ref = _build_both(logprobs, tokens, torch.zeros(300, dtype=torch.long), 50, None)
    assert layout_mismatch(fast, ref) is None, layout_mismatch(fast, ref)
    finite = torch.isfinite(ref.scores)
    assert torch.equal(finite, ref.valid)
    chosen = torch.zeros(300, dtype=torch.long)
    for b in range(300):  # number of finite-probability prefixes = the valid draft nodes
        per_depth = torch.isfinite(logprobs[b]).sum(dim=1).tolist()
        total, width = 0, 1
        for count in per_depth:
            width *= count
            total += width
        chosen[b] = min(total, 50)
    assert torch.equal(ref.valid[:, 1:].sum(dim=1), chosen)


def test_unsorted_candidates_give_the_same_tree():
    # Per-shard top-k lists gathered under tensor parallelism are not sorted globally.
    gen = torch.Generator().manual_seed(8)
    logprobs, tokens = du.topk_logprobs(torch.randn(200, 6, 40, generator=gen), 12)
    shuffle = torch.rand(200, 6, 12, generator=gen).argsort(dim=-1)
    roots = torch.zeros(200, dtype=torch.long)
    want = du.build_ddtree_reference(logprobs, tokens, roots, 30)
    mixed = (logprobs.gather(-1, shuffle), tokens.gather(-1, shuffle))
    assert layout_mismatch(du.build_ddtree(*mixed, roots, 30), want) is None
    assert layout_mismatch(du.build_ddtree_reference(*mixed, roots, 30), want) is None


def _check_well_formed(layout, cap) -> None:
    """Structural invariants SGLang's kernels and our walk rely on, checked per request."""
    bs, n = layout.tokens.shape
    assert layout.retrieve_index.tolist() == torch.arange(bs * n).reshape(bs, n).tolist()
    for b in range(bs):
        parents = layout.parents[b].tolist()
        depths = layout.depths[b].tolist()
        valid = layout.valid[b].tolist()
        tokens = layout.tokens[b].tolist()
        scores = layout.scores[b].tolist()
        mask = layout.tree_mask[b]
        assert parents[0] == -1 and depths[0] == 0 and valid[0]
        n_valid = sum(valid)
        assert valid == [True] * n_valid + [False] * (n - n_valid)  # padding at the end
        children = {i: [] for i in range(n)}
        for i in range(1, n):
            if not valid[i]:
                assert (parents[i], depths[i]) == (0, 1)
                assert mask[i].nonzero().flatten().tolist() == [0, i]
                continue
            p = parents[i]
            assert 0 <= p < i and valid[p]
            assert depths[i] == depths[p] + 1 <= layout.max_depth
            assert scores[i] <= scores[p]
            children[p].append(i)
            ancestors, j = set(), i
            while j != -1:
                ancestors.add(j)
                j = parents[j]
            assert set(mask[i].nonzero().flatten().tolist()) == ancestors
        assert scores == sorted(scores, reverse=True)  # best first
        for p, kids in children.items():
            assert layout.retrieve_next_token[b, p].item() == (kids[0] if kids else -1)
            kid_tokens = [tokens[c] for c in kids]
            assert len(set(kid_tokens)) == len(kid_tokens)  # siblings differ: one match at most
            for a, nxt in zip(kids, kids[1:] + [-1]):
                assert layout.retrieve_next_sibling[b, a].item() == nxt
        for i in range(n_valid, n):  # padding is linked to nothing
            assert layout.retrieve_next_token[b, i].item() == -1
            assert layout.retrieve_next_sibling[b, i].item() == -1
        if cap is not None:
            for d in range(1, layout.max_depth + 1):
                assert sum(1 for i in range(1, n_valid) if depths[i] == d) <= cap


def test_budget_one_is_dflash_chain_head():
    gen = torch.Generator().manual_seed(3)
    logprobs, tokens = du.topk_logprobs(torch.randn(64, 15, 50, generator=gen), 4)
    roots = torch.randint(0, 50, (64,), generator=gen)
    layout = du.build_ddtree(logprobs.to(DEVICE), tokens.to(DEVICE), roots.to(DEVICE), 1)
    assert layout.tokens.cpu().tolist() == torch.stack([roots, tokens[:, 0, 0]], 1).tolist()
    assert layout.depths.cpu().tolist() == [[0, 1]] * 64
    assert layout.parents.cpu().tolist() == [[-1, 0]] * 64
    assert torch.allclose(du.tree_objective(layout).cpu(), du.chain_objective(logprobs, 1))


def test_top1_input_gives_the_dflash_chain():
    # With K = 1 the only tree is DFlash's argmax chain: depth i at node i, and the same
    # objective as the chain formula.
    gen = torch.Generator().manual_seed(4)
    logprobs, tokens = du.topk_logprobs(torch.randn(32, 7, 20, generator=gen), 1)
    layout = du.build_ddtree(logprobs, tokens, torch.zeros(32, dtype=torch.long), 7)
    assert layout.depths.tolist() == [list(range(8))] * 32
    assert layout.parents.tolist() == [[-1] + list(range(7))] * 32
    assert torch.equal(layout.tokens[:, 1:], tokens[:, :, 0])
    assert torch.allclose(du.tree_objective(layout), du.chain_objective(logprobs, 7))


def test_build_from_logits_equals_topk_then_build():
    logits = torch.randn(50, 6, 30, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    roots = torch.zeros(50, dtype=torch.long, device=DEVICE)
    for topk, budget in [(None, 20), (4, 20), (64, 20), (None, 100)]:
        want = du.build_ddtree(*du.topk_logprobs(logits, min(topk or budget, budget)), roots, budget)
        got = du.build_ddtree_from_logits(logits, roots, budget, topk)
        assert layout_mismatch(got, want) is None
    # topk = 4: every node's token is among its depth's 4 most likely tokens.
    got = du.build_ddtree_from_logits(logits, roots, 40, 4)
    top4 = logits.topk(4, dim=-1).indices  # [50, 6, 4]
    depth0 = (got.depths[:, 1:] - 1).clamp(min=0)
    allowed = top4.gather(1, depth0.unsqueeze(2).expand(-1, -1, 4))  # [50, 40, 4]
    hit = (allowed == got.tokens[:, 1:].unsqueeze(2)).any(dim=2)
    assert bool(hit[got.valid[:, 1:]].all())


def test_topk_logprobs_shapes_and_values():
    logits = torch.randn(3, 5, 11)
    values, tokens = du.topk_logprobs(logits, 4)
    assert values.shape == tokens.shape == (3, 5, 4)
    assert values.dtype == torch.float32 and tokens.dtype == torch.long
    full = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(full.gather(-1, tokens), values)
    assert torch.all(values[..., :-1] >= values[..., 1:])
    assert du.topk_logprobs(logits, 100)[0].shape == (3, 5, 11)  # K = min(k, V)


@pytest.mark.parametrize(
    "shape_lp,shape_tok,shape_root,budget,cap,message",
    [
        ((2, 3, 4), (2, 3, 5), (2,), 4, None, "logprobs and tokens"),
        ((2, 3, 4), (2, 3, 4), (3,), 4, None, "root_tokens"),
        ((2, 3, 4), (2, 3, 4), (2,), 0, None, "budget"),
        ((2, 3, 4), (2, 3, 4), (2,), 4, 0, "max_per_depth"),
        ((2, 0, 4), (2, 0, 4), (2,), 4, None, "depth"),
    ],
)
def test_builders_reject_bad_shapes(shape_lp, shape_tok, shape_root, budget, cap, message):
    args = (
        torch.zeros(shape_lp),
        torch.zeros(shape_tok, dtype=torch.long),
        torch.zeros(shape_root, dtype=torch.long),
        budget,
        cap,
    )
    for build in (du.build_ddtree, du.build_ddtree_reference):
        with pytest.raises(ValueError, match=message):
            build(*args)
