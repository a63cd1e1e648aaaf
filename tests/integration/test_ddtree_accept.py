"""Tree verification (greedy and sampling), KV / context bookkeeping, and SGLang verify inputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ddtree_testkit.ddtree_support import DEVICE, ddtree_utils as du


def _random_trees(bs, depth, vocab, k, budget, seed, cap=None):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, depth, vocab, generator=gen) * 2
    logprobs, tokens = du.topk_logprobs(logits, k)
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    layout = du.build_ddtree(logprobs.to(DEVICE), tokens.to(DEVICE), roots.to(DEVICE), budget, cap)
    return layout, gen


def _targets_that_follow_the_tree(layout, vocab, gen, p_follow=0.8):
    """Target tokens per node: usually the token of one of the node's children (so paths get
    deep), otherwise a random token (which may or may not match a child)."""
    bs, n = layout.tokens.shape
    tokens, parents, valid = layout.tokens.cpu(), layout.parents.cpu(), layout.valid.cpu()
    target = torch.randint(0, vocab, (bs, n), generator=gen)
    for b in range(bs):
        kids = {}
        for i in range(1, n):
            if valid[b, i]:
                kids.setdefault(int(parents[b, i]), []).append(int(tokens[b, i]))
        for node, toks in kids.items():
            if torch.rand((), generator=gen) < p_follow:
                target[b, node] = toks[int(torch.randint(0, len(toks), (), generator=gen))]
    return target.to(DEVICE)


def _kernel_walk(layout, target):
    """Oracle: SGLang's verify_tree_greedy algorithm, walked literally on the linked lists
    (retrieve_next_token / retrieve_next_sibling), one request at a time."""
    bs, n = layout.tokens.shape
    steps = layout.max_depth + 1
    tokens = layout.tokens.cpu().tolist()
    nxt = layout.retrieve_next_token.cpu().tolist()
    sib = layout.retrieve_next_sibling.cpu().tolist()
    tgt = target.cpu().tolist()
    accept_index = [[-1] * steps for _ in range(bs)]
    accept_num, bonus, last, predicts = [], [], [], [0] * (bs * n)
    for b in range(bs):
        cur, count = 0, 0
        accept_index[b][0] = b * n
        for _ in range(1, steps):
            child = nxt[b][cur]
            while child != -1 and tokens[b][child] != tgt[b][cur]:
                child = sib[b][child]
            if child == -1:
                break
            predicts[b * n + cur] = tgt[b][cur]
            count += 1
            accept_index[b][count] = b * n + child
            cur = child
        predicts[b * n + cur] = tgt[b][cur]
        accept_num.append(count)
        bonus.append(tgt[b][cur])
        last.append(cur)
    return accept_index, accept_num, bonus, last, predicts


@pytest.mark.parametrize(
    "bs,depth,vocab,k,budget",
    [(400, 6, 8, 8, 16), (200, 15, 40, 16, 64), (300, 3, 2, 2, 40), (300, 5, 30, 4, 1)],
)
def test_greedy_accept_equals_sglang_kernel_walk(bs, depth, vocab, k, budget):
    layout, gen = _random_trees(bs, depth, vocab, k, budget, seed=bs + depth + budget)
    target = _targets_that_follow_the_tree(layout, vocab, gen)
    acc = du.greedy_accept(layout, target)
    accept_index, accept_num, bonus, last, predicts = _kernel_walk(layout, target)
    assert acc.accept_index.cpu().tolist() == accept_index
    assert acc.accept_length.cpu().tolist() == accept_num
    assert acc.bonus.cpu().tolist() == bonus
    assert acc.last_node.cpu().tolist() == last
    assert du.last_accepted_node(acc).cpu().tolist() == last
    assert acc.predicts.cpu().tolist() == predicts
    assert acc.accept_index.shape == (bs, depth + 1)  # S = max depth + 1
    if budget > 1:
        assert max(accept_num) >= 3  # deep paths were exercised, not only rejections
    # A layout without the builder's ancestor table (e.g. made elsewhere): same result.
    again = du.greedy_accept(dataclasses.replace(layout, ancestors=None), target)
    assert torch.equal(again.accept_index, acc.accept_index)
    assert torch.equal(again.bonus, acc.bonus)


def test_greedy_accept_with_repeated_sibling_tokens_takes_the_first():
    # build_ddtree never repeats a token among siblings, but a layout from elsewhere may:
    # like the kernel, the walk must then take the first such sibling and ignore the others.
    layout, gen = _random_trees(300, 5, 6, 6, 24, seed=61)
    sib = layout.retrieve_next_sibling
    has_next = sib >= 0
    later = torch.where(has_next, sib, 0)
    tokens = layout.tokens.clone()
    copy = has_next & (torch.rand(has_next.shape, generator=gen).to(DEVICE) < 0.5)
    tokens.scatter_(1, torch.where(copy, later, 0), torch.where(copy, tokens, tokens[:, :1]))
    layout.tokens = tokens
    assert (layout.tokens.gather(1, later)[has_next] == layout.tokens[has_next]).any()
    target = _targets_that_follow_the_tree(layout, 6, gen, p_follow=0.9)
    acc = du.greedy_accept(layout, target)
    accept_index, accept_num, bonus, last, predicts = _kernel_walk(layout, target)
    assert acc.accept_index.cpu().tolist() == accept_index
    assert acc.accept_length.cpu().tolist() == accept_num
    assert acc.bonus.cpu().tolist() == bonus
    assert acc.predicts.cpu().tolist() == predicts


@pytest.mark.skipif(DEVICE.type != "cuda", reason="SGLang's CUDA kernel: GPU only")
def test_greedy_accept_matches_sgl_kernel_on_cuda():
    pytest.importorskip("sgl_kernel")
    layout, gen = _random_trees(256, 15, 64, 16, 128, seed=11)
    target = _targets_that_follow_the_tree(layout, 64, gen)
    ours = du.greedy_accept(layout, target, backend="torch")
    theirs = du.greedy_accept(layout, target, backend="sgl_kernel")
    for name in ("accept_index", "accept_length", "bonus", "last_node", "predicts"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name


def test_chain_verify_equals_dflash_linear_rule():
    # K = 1 gives DFlash's chain; its greedy verify is DFlash's rule: accept while
    # draft[1:] == target[:-1] (cumulative product), bonus = target at the first mismatch.
    bs, depth = 500, 7
    gen = torch.Generator().manual_seed(5)
    logprobs, tokens = du.topk_logprobs(torch.randn(bs, depth, 6, generator=gen), 1)
    layout = du.build_ddtree(logprobs, tokens, torch.zeros(bs, dtype=torch.long), depth)
    target = torch.where(
        torch.rand(bs, depth + 1, generator=gen) < 0.8,
        torch.cat([layout.tokens[:, 1:], torch.zeros(bs, 1, dtype=torch.long)], 1),
        torch.randint(0, 6, (bs, depth + 1), generator=gen),
    )
    acc = du.greedy_accept(layout, target)
    matches = (layout.tokens[:, 1:] == target[:, :-1]).long().cumprod(dim=1)
    dflash_len = matches.sum(dim=1)
    assert torch.equal(acc.accept_length, dflash_len)
    assert torch.equal(acc.bonus, target.gather(1, dflash_len.unsqueeze(1)).squeeze(1))
    assert dflash_len.max() == depth and dflash_len.min() == 0


def test_one_hot_sampling_equals_greedy():
    # Temperature -> 0: with one-hot target distributions the sampling rule must walk exactly
    # the greedy path and emit the argmax, whatever the coins.
    vocab = 12
    layout, gen = _random_trees(300, 6, vocab, 6, 24, seed=21)
    target = _targets_that_follow_the_tree(layout, vocab, gen)
    probs = torch.nn.functional.one_hot(target, vocab).float()
    greedy = du.greedy_accept(layout, target)
    sampled = du.sample_accept(layout, probs, generator=torch.Generator(DEVICE).manual_seed(0))
    for name in ("accept_index", "accept_length", "bonus", "last_node", "predicts"):
        assert torch.equal(getattr(greedy, name), getattr(sampled, name)), name


# ---------------------------------------------------------------------------------------------
# Lossless sampling: chi-square of emitted sequences against the target's own law
# ---------------------------------------------------------------------------------------------

VOCAB, SEQ = 4, 3  # the joint law of the first 3 emitted tokens: 64 cells


def _markov_target(gen):
    """A target whose next-token law depends on the position and the previous token:
    P[t, prev] is the distribution of the token at position t + 1."""
    return (torch.randn(SEQ + 8, VOCAB, VOCAB, generator=gen) * 0.8).softmax(dim=-1)


def _speculative_samples(P, num, budget, depth, gen, root_token=1):
    """num independent sequences of SEQ tokens, emitted by DDTree + sample_accept.

    The draft's marginals are wrong and NOT uniform over the vocabulary (a fixed preference
    plus noise): a uniformly random draft would hide a missing residual correction, whose
    bias cancels on average over a uniform choice of the drafted token. Acceptances and
    rejections with residual sampling both happen; the target's distribution at a node is
    P[position of the node, token of the node]."""
    preference = torch.randn(depth, VOCAB, generator=gen) * 2.0
    coins = torch.Generator(DEVICE).manual_seed(int(torch.randint(0, 2**31, (), generator=gen)))
    P = P.to(DEVICE)
    out = torch.full((num, SEQ + depth + 1), -1, dtype=torch.long, device=DEVICE)
    count = torch.zeros(num, dtype=torch.long, device=DEVICE)
    root = torch.full((num,), root_token, dtype=torch.long, device=DEVICE)
    rows = torch.arange(num, device=DEVICE)
    while int(count.min()) < SEQ:
        draft_logits = preference + torch.randn(num, depth, VOCAB, generator=gen) * 0.5
        logprobs, cand = du.topk_logprobs(draft_logits.to(DEVICE), VOCAB)
        layout = du.build_ddtree(logprobs, cand, root, budget)
        pos = count.unsqueeze(1) + layout.depths  # position of the node's token
        target_probs = P[pos.clamp(max=P.shape[0] - 1), layout.tokens]  # [num, n, V]
        acc = du.sample_accept(layout, target_probs, generator=coins)
        path = (acc.accept_index - (rows * layout.num_nodes).unsqueeze(1)).clamp(min=0)
        new = torch.cat([layout.tokens.gather(1, path[:, 1:]), acc.bonus.unsqueeze(1)], 1)
        for j in range(new.shape[1]):  # the path's draft tokens, then the bonus
            is_draft = j < acc.accept_length
            is_bonus = j == acc.accept_length
            write = (is_draft | is_bonus) & (count < out.shape[1])
            value = torch.where(is_bonus, acc.bonus, new[:, j])
            out[rows[write], count[write]] = value[write]
            count = count + write.long()
        root = acc.bonus
    return out[:, :SEQ].cpu()


def _exact_joint(P, root_token=1):
    joint = torch.zeros((VOCAB,) * SEQ, dtype=torch.float64)
    for seq in torch.cartesian_prod(*[torch.arange(VOCAB)] * SEQ).tolist():
        p, prev = 1.0, root_token
        for t, x in enumerate(seq):
            p *= float(P[t, prev, x])
            prev = x
        joint[tuple(seq)] = p
    return joint.flatten()


def _chi_square_pvalue(counts, expected_probs):
    expected = expected_probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    df = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


@pytest.mark.parametrize("budget,depth", [(6, 3), (1, 2), (20, 4)])
def test_sampling_is_lossless_chi_square(budget, depth):
    gen = torch.Generator().manual_seed(100 + budget)
    P = _markov_target(gen)
    samples = _speculative_samples(P, 40_000, budget, depth, gen)
    cells = (samples * torch.tensor([VOCAB**2, VOCAB, 1])).sum(dim=1)
    counts = torch.bincount(cells, minlength=VOCAB**SEQ).double()
    exact = _exact_joint(P)
    assert exact.min() * 40_000 >= 5  # every cell expected often enough for the chi-square
    assert _chi_square_pvalue(counts, exact) > 1e-3
    # Power check: the same counts against a slightly different law (the target at
    # temperature 1.15) are rejected, so the test above can fail.
    tempered = P.log().div(1.15).softmax(dim=-1)
    assert _chi_square_pvalue(counts, _exact_joint(tempered)) < 1e-6


# ---------------------------------------------------------------------------------------------
# KV slots, next draft context, SGLang verify inputs
# ---------------------------------------------------------------------------------------------


def test_kv_bookkeeping_and_next_context():
    bs, vocab = 64, 10
    layout, gen = _random_trees(bs, 6, vocab, 5, 20, seed=31)
    n = layout.num_nodes
    acc = du.greedy_accept(layout, _targets_that_follow_the_tree(layout, vocab, gen))
    out_cache_loc = (torch.randperm(10_000, generator=gen)[: bs * n] + 7).to(DEVICE)
    plan = du.kv_bookkeeping(out_cache_loc, acc)
    index, ok = du.next_context_indices(acc)
    slots = out_cache_loc.cpu().tolist()
    kept_all = []
    for b in range(bs):
        length = int(acc.accept_length[b])
        path = acc.accept_index[b, : length + 1].cpu().tolist()
        assert path[0] == b * n  # root first
        assert int(plan.keep_counts[b]) == length + 1
        assert plan.keep_slots[b].cpu().tolist() == [slots[i] for i in path] + [-1] * (
            index.shape[1] - length - 1
        )
        assert index[b].cpu().tolist()[: length + 1] == path
        assert ok[b].cpu().tolist() == [True] * (length + 1) + [False] * (index.shape[1] - length - 1)
        kept_all += [slots[i] for i in path]
    assert sorted(plan.free_slots.cpu().tolist()) == sorted(set(slots) - set(kept_all))
    assert int(plan.keep_mask.sum()) + plan.free_slots.numel() == bs * n
    assert plan.keep_mask.cpu().tolist() == [s in set(kept_all) for s in slots]


def test_flat_mask_matches_per_request_construction():
    layout, gen = _random_trees(9, 5, 7, 7, 12, seed=41)
    n = layout.num_nodes
    prefix = torch.randint(0, 30, (9,), generator=gen)
    prefix[2] = 0
    flat = du.flat_mask_for_sglang(layout, prefix.to(DEVICE), int(prefix.sum()))
    assert torch.equal(flat, du.flat_mask_for_sglang(layout, prefix.to(DEVICE)))
    chunks = []
    for b in range(9):
        rows = torch.cat(
            [torch.ones(n, int(prefix[b]), dtype=torch.bool), layout.tree_mask[b].cpu()], dim=1
        )
        chunks.append(rows.flatten())
    assert flat.dtype == torch.bool
    assert torch.equal(flat.cpu(), torch.cat(chunks))


def test_chain_mask_equals_dflash_causal_mask():
    # For a chain (K = 1) the tree mask must be exactly DFlash's causal verify mask
    # (SGLang 0.5.12.post1 dflash_info.prepare_for_verify: allow = k_idx <= prefix + q_idx).
    depth = 6
    logprobs, tokens = du.topk_logprobs(torch.randn(3, depth, 9), 1)
    layout = du.build_ddtree(logprobs, tokens, torch.zeros(3, dtype=torch.long), depth)
    q_len = depth + 1
    prefix = torch.tensor([4, 0, 11])
    expected = []
    for p in prefix.tolist():
        q_idx = torch.arange(q_len).unsqueeze(1)
        k_idx = torch.arange(p + q_len).unsqueeze(0)
        expected.append((k_idx <= p + q_idx).flatten())
    assert torch.equal(du.flat_mask_for_sglang(layout, prefix), torch.cat(expected))


def test_positions_are_seq_len_plus_depth():
    layout, _ = _random_trees(4, 5, 6, 3, 10, seed=51)
    seq_lens = torch.tensor([5, 0, 17, 3])
    pos = du.positions(layout, seq_lens.to(DEVICE)).cpu()
    assert pos.shape == (4 * layout.num_nodes,)
    assert torch.equal(pos.view(4, -1), seq_lens.unsqueeze(1) + layout.depths.cpu())
