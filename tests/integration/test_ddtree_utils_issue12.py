"""The pure functions issue 12 added to payload/ddtree_utils.py, tested directly (the patched
SGLang tests in test_series_sglang.py / test_ddtree_verify_input.py drive them through the
real glue): the verify-memory arithmetic, the non-speculative sampler's joint filter, the
off-chain test and the LM head's final logit transform. Expectations are computed here by
hand or by brute force, not by the functions under test."""

from __future__ import annotations

import math

import pytest
import torch

from ddtree_testkit.ddtree_support import DEVICE, ddtree_utils as du


# --- verify memory ------------------------------------------------------------------------


def test_verify_bytes_per_request_is_rows_x_vocab_x_float32_x_copies():
    # Qwen3's vocab at budget 64: 65 rows x 151,936 x 4 bytes x 5 copies.
    assert du.verify_bytes_per_request(64, 151_936) == 65 * 151_936 * 4 * 5 == 197_516_800
    assert du.verify_bytes_per_request(1024, 151_936) == 1025 * 151_936 * 20


@pytest.mark.parametrize("budget, expected", [(64, 38), (256, 9), (1024, 2)])
def test_verify_request_cap_uses_half_the_free_memory(budget, expected):
    free = 14 * 2**30  # 14 GiB outside mem_fraction_static
    cap = du.verify_request_cap(budget, 151_936, free)
    assert cap == expected == math.floor(free / 2 / ((budget + 1) * 151_936 * 20))


def test_verify_request_cap_zero_when_one_request_does_not_fit_and_never_negative():
    per = du.verify_bytes_per_request(64, 1000)
    assert du.verify_request_cap(64, 1000, 2 * per) == 1
    assert du.verify_request_cap(64, 1000, 2 * per - 1) == 0
    assert du.verify_request_cap(64, 1000, -5.0) == 0


# --- the sampler's joint filter --------------------------------------------------------------


def _brute_joint(p, top_k, top_p, min_p):
    order = sorted(range(len(p)), key=lambda t: -p[t])
    keep = [t for i, t in enumerate(order)
            if i < top_k and sum(p[u] for u in order[:i]) <= top_p and p[t] >= min_p * p[order[0]]]
    total = sum(p[t] for t in keep)
    return [p[t] / total if t in keep else 0.0 for t in range(len(p))]


def test_joint_filter_issue_example_keeps_two_tokens():
    got = du.joint_filter_probs(torch.tensor([[0.4, 0.3, 0.2, 0.1]]), torch.tensor([2]),
                                torch.tensor([0.5]))
    assert torch.allclose(got, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]))


def test_joint_filter_matches_brute_force_on_random_rows():
    gen = torch.Generator().manual_seed(3)
    rows, vocab = 200, 7
    probs = torch.softmax(torch.randn(rows, vocab, generator=gen) * 2, dim=-1)
    top_ks = torch.randint(1, vocab + 3, (rows,), generator=gen)
    top_ps = torch.rand(rows, generator=gen)
    min_ps = torch.rand(rows, generator=gen) * 0.6
    got = du.joint_filter_probs(probs.to(DEVICE), top_ks.to(DEVICE), top_ps.to(DEVICE),
                                min_ps.to(DEVICE)).cpu()
    for r in range(rows):
        want = _brute_joint(probs[r].tolist(), int(top_ks[r]), float(top_ps[r]), float(min_ps[r]))
        assert torch.allclose(got[r], torch.tensor(want), atol=1e-6), r
    assert torch.allclose(got.sum(-1), torch.ones(rows))


def test_joint_filter_without_min_p_and_top_p_zero_keeps_the_argmax():
    probs = torch.tensor([[0.1, 0.6, 0.3]])
    got = du.joint_filter_probs(probs, torch.tensor([3]), torch.tensor([0.0]))
    assert got.tolist() == [[0.0, 1.0, 0.0]]


# --- off-chain accepts -----------------------------------------------------------------------


def _tree():
    # root 0 -> children 1 (rank 0), 2 (rank 1); 1 -> 3 (rank 0), 4 (rank 1); 2 -> 5.
    logprobs = torch.log(torch.tensor([[[0.6, 0.4], [0.7, 0.3]]]))
    tokens = torch.tensor([[[5, 6], [7, 8]]])
    return du.build_ddtree(logprobs.to(DEVICE), tokens.to(DEVICE),
                           torch.tensor([1], device=DEVICE), 5)


@pytest.mark.parametrize("path_tokens, offchain", [
    ([5, 7], False),  # first child, first grandchild: the first-ranked chain
    ([5, 8], True),   # the second grandchild
    ([6], True),      # the root's second child
    ([], False),      # nothing accepted
])
def test_offchain_accepted_by_path(path_tokens, offchain):
    layout = _tree()
    tokens = layout.tokens[0].tolist()
    parents = layout.parents[0].tolist()
    # Walk the path by tokens to its tree indices (brute force from the parent array).
    path, node = [0], 0
    for tok in path_tokens:
        node = next(i for i in range(1, len(tokens)) if parents[i] == node and tokens[i] == tok)
        path.append(node)
    accept_index = torch.full((1, layout.max_depth + 1), -1, dtype=torch.long)
    accept_index[0, : len(path)] = torch.tensor(path)
    got = du.offchain_accepted(layout, accept_index.to(DEVICE))
    assert got.tolist() == [offchain]


def test_offchain_accepted_batched_uses_flat_indices():
    layout = _tree()
    two = du.DDTreeLayout(**{k: (torch.cat([v, v]) if torch.is_tensor(v) else v)
                             for k, v in vars(layout).items()})
    n = layout.num_nodes
    second_child = int((layout.parents[0] == 0).nonzero()[1])
    accept_index = torch.full((2, layout.max_depth + 1), -1, dtype=torch.long)
    accept_index[0, :1] = 0
    accept_index[1, :2] = torch.tensor([n, n + second_child])
    assert du.offchain_accepted(two, accept_index.to(DEVICE)).tolist() == [False, True]


# --- final logit transform -------------------------------------------------------------------


def test_final_logit_transform_scale_then_softcap():
    x = torch.tensor([-40.0, -1.0, 0.0, 2.0, 40.0])
    got = du.final_logit_transform(x, logit_scale=0.5, softcap=30.0)
    want = torch.tensor([30.0 * math.tanh(v * 0.5 / 30.0) for v in x.tolist()])
    assert torch.allclose(got, want)
    assert du.final_logit_transform(x) is x  # nothing to apply
    assert torch.equal(du.final_logit_transform(x, 1.0, 0.0), x)
    # Monotone: the argmax (DFlash's chain) is unchanged, the log-probs are not.
    assert int(got.argmax()) == int(x.argmax())
    assert not torch.allclose(torch.log_softmax(got, -1), torch.log_softmax(x, -1))
