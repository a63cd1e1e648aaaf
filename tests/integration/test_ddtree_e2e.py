"""Lossless end to end on a real transformer.

Target: a tiny randomly initialised transformers LlamaForCausalLM (built from a config, nothing
downloaded, float32, CPU). DDTree decoding (draft marginals -> build_ddtree -> ONE tree-verify
forward with a 4D tree mask and explicit position ids over the DynamicCache -> greedy_accept ->
keep only the accepted path's KV) must emit exactly the tokens of plain greedy decoding.

Stand-in (named as such): the draft. DFlash's block-diffusion draft needs a trained checkpoint;
here a perturbed copy of the target, run along its own greedy chain, supplies the per-depth
marginals (see ddtree_testkit.ddtree_support.draft_marginals). The target, the tree verify and the cache
handling are the real thing.
"""

from __future__ import annotations

import pytest
import torch

from ddtree_testkit.ddtree_support import ddtree_decode, greedy_decode, perturbed_copy, tiny_llama

NUM_TOKENS = 64
DEPTH = 8  # draft depths per step (DFlash block 9)
SEEDS = [0, 1, 2]


@pytest.fixture(scope="module")
def models():
    out = {}
    for seed in SEEDS:
        target = tiny_llama(seed)
        prompt = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(seed))
        baseline = greedy_decode(target, prompt.tolist(), NUM_TOKENS)
        # Guard on the comparison itself: greedy argmaxes separated by clear logit gaps, so an
        # equality below is about the algorithm, not float luck (float32 noise here ~1e-5).
        assert baseline.min_gap > 1e-3, (seed, baseline.min_gap)
        assert baseline.target_forwards == NUM_TOKENS
        out[seed] = (target, prompt.tolist(), baseline)
    return out


@pytest.mark.parametrize("budget", [1, 4, 16, 64])
@pytest.mark.parametrize("seed", SEEDS)
def test_ddtree_decoding_equals_greedy(models, seed, budget):
    target, prompt, baseline = models[seed]
    draft = perturbed_copy(target, scale=0.03, seed=seed + 100)
    result = ddtree_decode(target, draft, prompt, NUM_TOKENS, budget, DEPTH)
    assert result.tokens == baseline.tokens
    assert result.min_gap > 1e-3  # the accepted path's argmaxes were not near-ties either
    assert result.target_forwards <= baseline.target_forwards
    assert max(result.accept_lengths) >= 1  # the draft is good enough to be accepted at times


def test_perfect_draft_needs_far_fewer_target_forwards(models):
    # Draft == target: every step accepts a deep path. Budget 64, depth 8 measured here:
    # 14-15 target forwards for 64 tokens (greedy: 64), i.e. ~3.6-3.9 accepted per step.
    for seed in SEEDS:
        target, prompt, baseline = models[seed]
        result = ddtree_decode(target, target, prompt, NUM_TOKENS, 64, DEPTH)
        assert result.tokens == baseline.tokens
        assert result.target_forwards * 3 <= baseline.target_forwards, result.target_forwards
        chain = ddtree_decode(target, target, prompt, NUM_TOKENS, 1, DEPTH)
        assert chain.tokens == baseline.tokens
        assert result.target_forwards < chain.target_forwards  # the tree beats the chain head


def test_tree_verify_logits_equal_sequential_decoding():
    # The verify forward itself: one tree forward gives, at every node, the logits of decoding
    # that node's root-to-node path sequentially (the property the mask + positions encode).
    from ddtree_testkit import ddtree_support as sup

    du = sup.ddtree_utils
    from transformers import DynamicCache

    target = tiny_llama(3)
    prompt = list(range(5, 15))
    gen = torch.Generator().manual_seed(3)
    logprobs, tokens = du.topk_logprobs(torch.randn(1, 4, 96, generator=gen), 3)
    layout = du.build_ddtree(logprobs, tokens, torch.tensor([7]), 10)
    n = layout.num_nodes
    with torch.no_grad():
        cache = DynamicCache()
        target(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
        allowed = torch.cat([torch.ones(1, n, len(prompt), dtype=torch.bool), layout.tree_mask], 2)
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        tree_logits = target(
            input_ids=layout.tokens,
            position_ids=du.positions(layout, torch.tensor([len(prompt)])).view(1, n),
            attention_mask=mask[:, None],
            past_key_values=cache,
            use_cache=True,
        ).logits[0]
        for i in range(n):
            path, j = [], i
            while j != -1:
                path.append(int(layout.tokens[0, j]))
                j = int(layout.parents[0, j])
            seq_logits = target(input_ids=torch.tensor([prompt + path[::-1]])).logits[0, -1]
            assert torch.allclose(tree_logits[i], seq_logits, atol=1e-4), i
    # Not vacuous: the tree has branching (a sibling pair) and depth > 1.
    assert (layout.retrieve_next_sibling >= 0).any() and layout.depths.max() > 1
