"""The DDTree lineage against EAGLE's CUDA tree ABI (payload/ddtree_lineage.py), torch only.

What the v2 worker hands SGLang's tree verify is checked against the CUDA kernels' own rules,
transcribed in the NAMED STAND-INS of tests/v2_kernel_standins.py (host checks raise
``HostCheckError`` where the CUDA host code raises; the kernels raise ``OutOfRangeAccess``
where the CUDA kernel would read or write outside a request's row or loop forever); the source
lines those transcriptions rely on are pinned by tests/integration/test_v2_kernel_contract.py.

- Every configuration the v2 plugin accepts (``abi_problem`` is None) passes the CUDA host
  check with the worker's shapes; the refused ones get one line naming the three flags and a
  combination that the same check accepts.
- The lineage through the CUDA builder is the DDTree layout (links, positions, mask rows),
  for random full trees, and for drafts with NaN / -inf log-probs (``finite_logprobs``: the
  tree stays full, no node takes the parent-not-found path).
- The width the worker used before (B + 2) is refused by the CUDA host check.
- Padding nodes: why the v2 path never carries them (the twin encoding is greedy-safe, but
  target-only sampling over-accepts a twin), and that an unlinked node is the CUDA
  out-of-row path.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddtree_testkit import payload
import torch

REPO = Path(__file__).resolve().parent.parent.parent

dl = payload("ddtree_lineage")  # payload/ddtree_lineage.py, as SGLang imports it
du = payload("ddtree_utils")  # payload/ddtree_utils.py, as SGLang imports it
import v2_kernel_standins as ks  # noqa: E402

FLAGS = ("--speculative-ddtree-budget", "--speculative-ddtree-topk",
         "--speculative-dflash-block-size")


def _build_inputs(layout, cand, seq_lens, mode=ks.QLEN_ONLY, device="cpu"):
    """What build_eagle_verify_input hands the CUDA builder for this layout."""
    bs, n = layout.tokens.shape
    parent_list, sel, draft_tokens = dl.eagle_lineage(layout, cand)
    k, depth = int(cand.shape[2]), dl.lineage_depth(n - 1, int(cand.shape[2]), cand.shape[1])
    if mode == ks.FULL_MASK:
        mask = torch.ones(int(seq_lens.sum()) * n + n * n * bs, dtype=torch.bool)
    else:
        mask = torch.ones(n * n * bs, dtype=torch.bool)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
    positions = torch.empty(bs * n, dtype=torch.long)
    args = (parent_list, sel, seq_lens, mask, positions, retrieve[0], retrieve[1], retrieve[2],
            k, depth, n, mode)
    return args, draft_tokens


def _cuda_build(layout, cand, seq_lens, mode=ks.QLEN_ONLY):
    args, draft_tokens = _build_inputs(layout, cand, seq_lens, mode)
    ks.build_tree_kernel_efficient_cpu(*args)
    return args[3], args[4], (args[5], args[6], args[7]), draft_tokens


def _random_full_tree(gen, *, bs=3, depth, k, budget, vocab=40, nonfinite=False):
    logits = torch.randint(0, 3, (bs, depth, vocab), generator=gen).float()  # many ties
    logprobs, tokens = du.topk_logprobs(logits, k)
    if nonfinite:  # a broken draft: NaN and -inf entries the CUDA builder must never see raw
        logprobs[0] = float("nan")
        logprobs[1:, :, 1:] = float("-inf")
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    layout = du.build_ddtree(dl.finite_logprobs(logprobs), tokens, roots, budget)
    return layout, tokens


# ---------------------------------------------------------------------------------------------
# The configurations


def _accepted_grid():
    """(budget, topk, block) the v2 plugin accepts: 2 <= block <= budget + 1, topk <= budget,
    and no abi_problem (a sample of the space, every budget up to 64 and the large ones)."""
    budgets = list(range(1, 65)) + [100, 127, 128, 255, 256, 511, 512, 1000, 1023]
    for budget in budgets:
        for topk in sorted({1, 2, 3, 4, 5, 6, 7, 8, 10, 16, 32, 64, budget} & set(range(1, budget + 1))):
            for block in sorted({2, 3, 4, 5, 8, 9, 16, 17, 32, budget + 1} & set(range(2, budget + 2))):
                yield budget, topk, block


def _host_check_shapes(budget, topk, block, bs=2, mode=ks.QLEN_ONLY):
    """The CUDA host check (transcribed) on meta tensors shaped exactly as the worker's."""
    n, depth = budget + 1, dl.lineage_depth(budget, topk, block - 1)
    meta = dict(device="meta", dtype=torch.int64)
    mask_numel = bs * n * n if mode == ks.QLEN_ONLY else bs * n * (64 + n)
    retrieve = torch.empty((3, bs, n), **meta)
    ks.check_build_tree_host(
        torch.empty((bs, dl.parent_width(budget, topk, block - 1)), **meta),
        torch.empty((bs, budget), **meta), torch.empty((bs,), **meta),
        torch.empty((mask_numel,), device="meta", dtype=torch.bool),
        torch.empty((bs * n,), **meta), retrieve[0], retrieve[1], retrieve[2], topk, depth, n,
        mode)
    return depth


def test_every_accepted_configuration_passes_the_cuda_host_check():
    accepted = refused = 0
    for budget, topk, block in _accepted_grid():
        if dl.abi_problem(budget, topk, block) is not None:
            refused += 1
            continue
        accepted += 1
        depth = _host_check_shapes(budget, topk, block, mode=ks.QLEN_ONLY)
        # EAGLE's accept_index is [bs, depth + 1] and is compacted into an n-wide row.
        assert block - 1 <= depth <= budget, (budget, topk, block, depth)
    assert accepted > 5_000 and refused > 1_000, (accepted, refused)


def test_the_default_configuration():
    assert dl.abi_problem(64, 8, 16) is None
    assert dl.lineage_depth(64, 8, 15) == 15 and dl.parent_width(64, 8, 15) == 113
    for mode in (ks.QLEN_ONLY, ks.FULL_MASK):
        assert _host_check_shapes(64, 8, 16, mode=mode) == 15


def test_the_width_the_worker_used_before_is_refused_by_the_cuda_host_check():
    # Before: parent_list [bs, B + 2] with depth = L. At the default, 66 != 8 * 14 + 1 = 113.
    gen = torch.Generator().manual_seed(0)
    layout, cand = _random_full_tree(gen, depth=15, k=8, budget=64)
    args, _ = _build_inputs(layout, cand, torch.zeros(3, dtype=torch.long))
    old = torch.cat([args[0][:, :65], torch.full((3, 1), -1)], 1)  # B + 2 = 66 columns
    with pytest.raises(ks.HostCheckError, match="parent_width 66 != topk"):
        ks.build_tree_kernel_efficient_cpu(old, *args[1:9], 15, *args[10:])
    # ...and so is the 1025-wide verify of budget 1024 (one CUDA thread per node).
    with pytest.raises(ks.HostCheckError, match="draft_token_num 1025"):
        _host_check_shapes(1024, 8, 16)


@pytest.mark.parametrize("budget, topk, block, why", [
    (1024, 8, 16, "verify width of 1025, over the 1024"),
    (64, 2, 6, "exceeds the 62 distinct draft prefixes"),
    (16, 1, 8, "exceeds the 7 distinct draft prefixes"),
    (1023, 1, 16, "exceeds the 15 distinct draft prefixes"),
    (8, 9, 4, "exceeds the vocabulary (6 tokens)"),
])
def test_unrepresentable_configurations_are_refused_in_one_line(budget, topk, block, why):
    vocab = 6 if "vocabulary" in why else None
    msg = dl.abi_problem(budget, topk, block, vocab_size=vocab)
    assert msg is not None and why in msg and "\n" not in msg, msg
    for flag in FLAGS:
        assert flag in msg, (flag, msg)
    # The combination it suggests is one the ABI carries.
    b, k, blk = (int(re.search(re.escape(f) + r" (\d+)", msg.split("e.g.")[1]).group(1))
                 for f in FLAGS)
    assert dl.abi_problem(b, k, blk, vocab_size=vocab) is None, msg
    assert 2 <= blk <= b + 1 and 1 <= k <= b
    _host_check_shapes(b, k, blk)


def test_the_boundaries_of_the_refusals():
    # A draft of exactly the budget's prefixes fills it; one node more needs padding.
    assert dl.abi_problem(62, 2, 6) is None and dl.abi_problem(63, 2, 6) is not None
    assert dl.abi_problem(15, 1, 16) is None and dl.abi_problem(16, 1, 16) is not None
    # The largest verify width the CUDA builder takes, and one more.
    assert dl.abi_problem(1023, 8, 16) is None and dl.abi_problem(1024, 8, 16) is not None
    assert dl.abi_problem(8, 6, 4, vocab_size=6) is None
    assert dl.abi_problem(8, 7, 4, vocab_size=6) is not None


def test_a_top1_tree_is_the_chain_eagle_may_build_without_the_lineage():
    # K = 1 and B = L: n == D + 1, so on CUDA with a QLEN_ONLY mask EAGLE takes its chain
    # builder (build_chain_tree), which ignores the lineage and reads the draft tokens as a
    # chain. That is right only because such a DDTree is the chain in depth order.
    gen = torch.Generator().manual_seed(6)
    for depth in (1, 4, 15):
        layout, cand = _random_full_tree(gen, depth=depth, k=1, budget=depth)
        assert dl.lineage_depth(depth, 1, depth) + 1 == depth + 1 == layout.num_nodes
        assert layout.parents[0].tolist() == list(range(-1, depth))
        assert torch.equal(layout.tokens[:, 1:], cand[:, :, 0])


def test_capacity_counts_distinct_prefixes_up_to_the_budget():
    assert dl.tree_capacity(2, 5, 64) == 2 + 4 + 8 + 16 + 32
    assert dl.tree_capacity(1, 7, 16) == 7
    assert dl.tree_capacity(8, 15, 64) == 64
    # Exactly what build_ddtree fills with finite log-probs (no padding at capacity).
    gen = torch.Generator().manual_seed(1)
    lp, tok = du.topk_logprobs(torch.randn(2, 5, 30, generator=gen), 2)
    full = du.build_ddtree(lp, tok, torch.zeros(2, dtype=torch.long), 62)
    over = du.build_ddtree(lp, tok, torch.zeros(2, dtype=torch.long), 63)
    assert bool(full.valid.all()) and int((~over.valid).sum()) == 2


# ---------------------------------------------------------------------------------------------
# The lineage through the CUDA builder


@pytest.mark.parametrize("seed", range(30))
def test_lineage_through_the_cuda_builder_is_the_ddtree_layout(seed):
    gen = torch.Generator().manual_seed(seed)
    while True:
        depth = int(torch.randint(1, 6, (1,), generator=gen))
        k = int(torch.randint(1, 5, (1,), generator=gen))
        budget = int(torch.randint(depth, 30, (1,), generator=gen))
        k = min(k, budget)
        if dl.abi_problem(budget, k, depth + 1) is None:
            break
    layout, cand = _random_full_tree(gen, depth=depth, k=k, budget=budget,
                                     nonfinite=seed % 3 == 0)
    assert bool(layout.valid.all())  # finite_logprobs: never a padding node
    bs, n = layout.tokens.shape
    seq_lens = torch.randint(0, 6, (bs,), generator=gen)
    for mode in (ks.FULL_MASK, ks.QLEN_ONLY):
        mask, pos, retrieve, draft_tokens = _cuda_build(layout, cand, seq_lens, mode)
        assert torch.equal(retrieve[0], layout.retrieve_index)
        assert torch.equal(retrieve[1], layout.retrieve_next_token)
        assert torch.equal(retrieve[2], layout.retrieve_next_sibling)
        assert torch.equal(draft_tokens, layout.tokens[:, 1:])
        assert torch.equal(pos, du.positions(layout, seq_lens).reshape(-1))
        if mode == ks.FULL_MASK:
            ref = du.flat_mask_for_sglang(layout, seq_lens, int(seq_lens.sum()))
            rows = (seq_lens + n).repeat_interleave(n)
            starts = rows.cumsum(0) - rows
            for r in range(bs * n):  # the kernel writes the tree block; SGLang fills the prefix
                s = int(starts[r])
                tree = slice(s + int(rows[r]) - n, s + int(rows[r]))
                assert torch.equal(mask[tree], ref[tree]), r
        else:
            assert torch.equal(mask.view(bs, n, n), layout.tree_mask)


def test_a_nan_draft_still_gives_a_full_linked_tree():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 4, 50, generator=gen)
    logits[0] = float("nan")  # fp16 overflow in a draft: every log-prob NaN
    lp, tok = du.topk_logprobs(logits, 4)
    roots = torch.tensor([3, 4])
    raw = du.build_ddtree(lp, tok, roots, 20)
    assert not bool(raw.valid[0].all())  # what build_ddtree makes of it unguarded: padding
    layout = du.build_ddtree(dl.finite_logprobs(lp), tok, roots, 20)
    assert bool(layout.valid.all())
    _cuda_build(layout, tok, torch.tensor([5, 0]))  # no OutOfRangeAccess


def test_an_unlinked_node_is_the_cuda_parent_not_found_path():
    # The encoding the worker used before: a padding node's candidate id names no node. The
    # CUDA scan then reads the next request's selected_index entry.
    gen = torch.Generator().manual_seed(2)
    layout, cand = _random_full_tree(gen, depth=3, k=2, budget=6)
    args, _ = _build_inputs(layout, cand, torch.zeros(3, dtype=torch.long))
    args[1][0, 5] = 3 * 2 + 1  # node 6: group 3, whose entry c_3 no longer matches...
    args[0][0, 3] = 10_000  # ...any node's candidate id
    with pytest.raises(ks.OutOfRangeAccess, match="parent-not-found"):
        ks.build_tree_kernel_efficient_cpu(*args)


def test_a_parent_cycle_is_the_cuda_mask_loop_that_never_ends():
    gen = torch.Generator().manual_seed(3)
    layout, cand = _random_full_tree(gen, depth=3, k=2, budget=6)
    args, _ = _build_inputs(layout, cand, torch.zeros(3, dtype=torch.long))
    sel = args[1]
    sel[0, 4] = 5 * 2  # node 5 claims group 5, i.e. itself
    args[0][0, 5] = sel[0, 4]
    with pytest.raises(ks.OutOfRangeAccess, match="never reaches the root"):
        ks.build_tree_kernel_efficient_cpu(*args)


# ---------------------------------------------------------------------------------------------
# Padding: why the v2 path carries none


def _padded_tree():
    # One candidate per depth with mass, budget 5: 2 real nodes, 3 padding nodes.
    lp = torch.tensor([[[-0.1, float("-inf")], [-0.2, float("-inf")]]])
    tok = torch.tensor([[[4, 5], [6, 7]]])
    layout = du.build_ddtree(lp, tok, torch.tensor([1]), 5)
    assert layout.valid.tolist() == [[True, True, True, False, False, False]]
    return layout, tok


def test_padding_becomes_later_twins_of_node_one_that_greedy_never_accepts():
    layout, tok = _padded_tree()
    mask, pos, retrieve, draft_tokens = _cuda_build(layout, tok, torch.tensor([3]))
    assert draft_tokens.tolist() == [[4, 6, 4, 4, 4]]  # twins carry node 1's token
    nxt, sib = retrieve[1][0].tolist(), retrieve[2][0].tolist()
    assert nxt[0] == 1 and sib[1] == 3 and sib[3] == 4 and sib[4] == 5  # after node 1
    n = 6
    for target_at_root in (4, 9):  # node 1's token (accepted: node 1, not a twin), or not
        target = torch.full((1, n), 6)
        target[0, 0] = target_at_root
        out = _greedy(retrieve, torch.cat([torch.tensor([[1]]), draft_tokens], 1), target)
        accepted = [i for i in out[1][0].tolist()[1:] if i >= 0]
        assert all(i in (1, 2) for i in accepted), accepted


def _greedy(retrieve, candidates, target, steps=3):
    bs, n = candidates.shape
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    num = torch.zeros(bs, dtype=torch.int32)
    ks.verify_tree_greedy_cpu(predicts, accept_index, num, candidates, retrieve[0],
                              retrieve[1], retrieve[2], target)
    return predicts, accept_index, num


def test_target_only_sampling_over_accepts_a_twin():
    """The reason the v2 path has no padding at all: the CUDA sampling walk adds each tried
    sibling's target mass again, so a twin of a rejected token is accepted for coins in
    [p, 2p), where the lossless law (ddtree_utils.sample_accept) rejects it."""
    layout, tok = _padded_tree()
    _, _, retrieve, draft_tokens = _cuda_build(layout, tok, torch.tensor([3]))
    n, vocab = 6, 10
    candidates = torch.cat([torch.tensor([[1]]), draft_tokens], 1)
    probs = torch.full((1, n, vocab), 0.1)  # p(token 4) = 0.1 everywhere
    for coin, twin_accepted in ((0.05, False), (0.15, True)):
        predicts = torch.zeros(n, dtype=torch.int32)
        accept_index = torch.full((1, 3), -1, dtype=torch.int32)
        num = torch.zeros(1, dtype=torch.int32)
        ks.tree_speculative_sampling_target_only(
            predicts, accept_index, num, candidates, retrieve[0], retrieve[1], retrieve[2],
            torch.full((1, n), coin), torch.tensor([0.5]), probs.clone(), torch.zeros_like(probs))
        first = int(accept_index[0, 1])
        assert (first in (3, 4, 5)) == twin_accepted, (coin, accept_index)
        ref = du.sample_accept(layout, probs.double(), coins=torch.full((1, 3), coin),
                               final_coins=torch.tensor([0.5]))
        assert int(ref.accept_index[0, 1]) in (-1, 1), ref.accept_index  # never a padding node


# ---------------------------------------------------------------------------------------------
# The verify kernels' host checks, on what EAGLE's eagle_sample allocates


def test_greedy_and_sampling_host_checks_take_eagles_dtypes_and_refuse_others():
    gen = torch.Generator().manual_seed(4)
    layout, cand = _random_full_tree(gen, depth=3, k=2, budget=6)
    _, _, retrieve, draft_tokens = _cuda_build(layout, cand, torch.zeros(3, dtype=torch.long))
    bs, n = layout.tokens.shape
    candidates = torch.cat([layout.tokens[:, :1], draft_tokens], 1)
    target = torch.randint(0, 40, (bs, n), generator=gen)
    depth = dl.lineage_depth(n - 1, 2, 3)
    ok = dict(predicts=torch.zeros(bs * n, dtype=torch.int32),
              accept_index=torch.full((bs, depth + 1), -1, dtype=torch.int32),
              accept_token_num=torch.empty(bs, dtype=torch.int32))
    ks.verify_tree_greedy_cpu(**ok, candidates=candidates, retrive_index=retrieve[0],
                              retrive_next_token=retrieve[1], retrive_next_sibling=retrieve[2],
                              target_predict=target)
    for name, bad in (("accept_index", ok["accept_index"].long()),
                      ("predicts", ok["predicts"].long())):
        with pytest.raises(ks.HostCheckError, match=name):
            ks.verify_tree_greedy_cpu(**{**ok, name: bad}, candidates=candidates,
                                      retrive_index=retrieve[0], retrive_next_token=retrieve[1],
                                      retrive_next_sibling=retrieve[2], target_predict=target)
    probs = torch.softmax(torch.randn(bs, n, 40, generator=gen), -1)
    sampling = dict(candidates=candidates, retrive_index=retrieve[0],
                    retrive_next_token=retrieve[1], retrive_next_sibling=retrieve[2],
                    uniform_samples=torch.rand(bs, n, generator=gen),
                    uniform_samples_for_final_sampling=torch.rand(bs, generator=gen),
                    target_probs=probs, draft_probs=torch.zeros_like(probs))
    ks.tree_speculative_sampling_target_only(**ok, **sampling)
    with pytest.raises(ks.HostCheckError, match="target_probs: dtype"):
        ks.tree_speculative_sampling_target_only(
            **ok, **{**sampling, "target_probs": probs.double(),
                     "draft_probs": torch.zeros_like(probs.double())})
    with pytest.raises(ks.HostCheckError, match="uniform_samples: size"):
        ks.tree_speculative_sampling_target_only(
            **ok, **{**sampling, "uniform_samples": torch.rand(bs, n + 1)})
