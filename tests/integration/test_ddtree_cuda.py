"""GPU-only properties of the hot path (run by scripts/gpu_check_ddtree.sh with
DDTREE_TEST_DEVICE=cuda; skipped on CPU): no host synchronisation inside the builder and the
verify walk, and the whole step captured in a CUDA graph replays to the eager result."""

from __future__ import annotations

import pytest
import torch

from ddtree_testkit.ddtree_support import DEVICE, ddtree_utils as du, layout_mismatch

pytestmark = pytest.mark.skipif(DEVICE.type != "cuda", reason="needs DDTREE_TEST_DEVICE=cuda")


def _inputs(bs, depth, vocab, k, seed):
    gen = torch.Generator().manual_seed(seed)
    logprobs, tokens = du.topk_logprobs(torch.randn(bs, depth, vocab, generator=gen) * 3, k)
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    target = torch.randint(0, vocab, (bs, 1), generator=gen)
    return logprobs.to(DEVICE), tokens.to(DEVICE), roots.to(DEVICE), target


def test_hot_path_has_no_host_sync():
    logprobs, tokens, roots, _ = _inputs(32, 15, 1000, 256, 0)
    layout = du.build_ddtree(logprobs, tokens, roots, 256)  # warm-up: fills the caches
    target = layout.tokens.roll(-1, dims=1)
    seq_lens = torch.full((32,), 100, device=DEVICE)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
    try:
        layout = du.build_ddtree(logprobs, tokens, roots, 256)
        du.greedy_accept(layout, target)
        du.sample_accept(layout, torch.rand(32, 257, 1000, device=DEVICE).softmax(-1))
        du.positions(layout, seq_lens)
        du.flat_mask_for_sglang(layout, seq_lens, total_prefix_len=3200)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_builder_and_walk_replay_from_a_cuda_graph():
    bs, budget = 16, 64
    logprobs, tokens, roots, _ = _inputs(bs, 15, 500, budget, 1)
    static = [logprobs.clone(), tokens.clone(), roots.clone()]
    target = torch.zeros(bs, budget + 1, dtype=torch.long, device=DEVICE)

    def step():
        layout = du.build_ddtree(*static, budget)
        return layout, du.greedy_accept(layout, target)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_layout, graph_acc = step()

    for seed in (2, 3):  # new inputs copied into the static buffers, then replay
        new = _inputs(bs, 15, 500, budget, seed)
        for buf, value in zip(static, new[:3]):
            buf.copy_(value)
        eager_layout = du.build_ddtree(*new[:3], budget)
        target.copy_(eager_layout.tokens.roll(-1, dims=1))  # deep acceptance along node order
        graph.replay()
        eager_acc = du.greedy_accept(eager_layout, target)
        assert layout_mismatch(graph_layout, eager_layout) is None
        assert torch.equal(graph_acc.accept_index, eager_acc.accept_index)
        assert torch.equal(graph_acc.bonus, eager_acc.bonus)


def test_cuda_layout_equals_cpu_reference():
    logprobs, tokens, roots, _ = _inputs(256, 15, 2000, 128, 4)
    fast = du.build_ddtree(logprobs, tokens, roots, 128)
    ref = du.build_ddtree_reference(logprobs.cpu(), tokens.cpu(), roots.cpu(), 128)
    assert layout_mismatch(fast, ref) is None, layout_mismatch(fast, ref)
