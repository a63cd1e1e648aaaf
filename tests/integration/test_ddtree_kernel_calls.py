"""The v1 families' calls into sgl-kernel, held to the CUDA kernels' host checks (torch only).

``ddtree_utils.greedy_accept(..., backend="sgl_kernel")`` (what the v1 verify runs on a GPU)
hands ``sgl_kernel.verify_tree_greedy`` its tensors; here that op is the NAMED STAND-IN of
tests/v2_kernel_standins.py (the CUDA host checks of tree.cuh / sgl-kernel's
``verify_tree_greedy``, then the kernel's flat indexing, raising where CUDA would read out of
range), installed as ``sgl_kernel`` for the call. The v1 sampling call
(``tree_speculative_sampling_target_only`` from the patched ``dflash_info``) is held to the
same checks on the real 0.5.12 / 0.5.13 releases by scripts/ddtree_verify_probe.py
(``sampling_kernel_call_passes_cuda_host_checks``, run by tests/integration/test_ddtree_verify_input.py).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from ddtree_testkit import payload
import torch

REPO = Path(__file__).resolve().parent.parent.parent

du = payload("ddtree_utils")  # payload/ddtree_utils.py, as SGLang imports it
import v2_kernel_standins as ks  # noqa: E402


@pytest.fixture
def cuda_standin(monkeypatch):
    module = types.ModuleType("sgl_kernel")
    module.verify_tree_greedy = ks.verify_tree_greedy_cpu
    monkeypatch.setitem(sys.modules, "sgl_kernel", module)
    return module


@pytest.mark.parametrize("seed", range(12))
def test_v1_greedy_kernel_call_passes_the_cuda_host_checks(cuda_standin, seed):
    gen = torch.Generator().manual_seed(seed)
    bs, depth, vocab = 3, int(torch.randint(1, 6, (1,), generator=gen)), 20
    logits = torch.randn(bs, depth, vocab, generator=gen) * 3
    if seed % 3 == 0:  # v1 trees may carry padding (never linked): the walk never meets it
        logits[:, :, 2:] = float("-inf")
    lp, tok = du.topk_logprobs(logits, 4)
    layout = du.build_ddtree(lp, tok, torch.randint(0, vocab, (bs,), generator=gen), 12)
    nxt = layout.retrieve_next_token.clamp(min=0)
    target = torch.where(torch.rand(layout.tokens.shape, generator=gen) < 0.7,
                         layout.tokens.gather(1, nxt),
                         torch.randint(0, vocab, layout.tokens.shape, generator=gen))
    got = du.greedy_accept(layout, target, backend="sgl_kernel")
    ref = du.greedy_accept(layout, target)
    assert torch.equal(got.accept_index, ref.accept_index)
    assert torch.equal(got.accept_length, ref.accept_length)
    assert torch.equal(got.bonus, ref.bonus)


def test_the_standin_refuses_what_the_cuda_host_check_refuses(cuda_standin):
    lp, tok = du.topk_logprobs(torch.randn(1, 2, 8), 2)
    layout = du.build_ddtree(lp, tok, torch.tensor([1]), 4)
    target = torch.zeros_like(layout.tokens)
    # A target of the wrong dtype (int32, as an argmax cast would give) is refused.
    with pytest.raises(ks.HostCheckError, match="target_predict: dtype"):
        ks.verify_tree_greedy_cpu(
            torch.zeros(5, dtype=torch.int32), torch.full((1, 3), -1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32), layout.tokens, layout.retrieve_index,
            layout.retrieve_next_token, layout.retrieve_next_sibling, target.int())
