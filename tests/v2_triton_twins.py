"""SGLang's Triton kernels in Triton's CPU interpreter against the NAMED STAND-INS of
tests/v2_kernel_standins.py. Run by tests/integration/test_v2_kernel_contract.py in a process of its own
with ``TRITON_INTERPRET=1`` (the interpreter is chosen when triton first wraps its own library
functions, so the variable must be set before triton is imported):

    TRITON_INTERPRET=1 python v2_triton_twins.py CASE...   ->   one line TAG{json}

Each kernel is read from the cached 0.5.23 wheel at run time and compiled here (nothing of
SGLang is copied into this repository). Module level is stdlib-only (the test imports it for
CASES/TAG).

- ``tree_build``: the tree builder's XPU twin (``spec_tree.py``) builds the same tree as the
  CUDA stand-in from the worker's lineage (both mask modes);
- ``tree_build_old_width``: the twin ACCEPTS the B + 2 wide parent list the worker used to
  hand (it reads the tensor's real stride) while the CUDA host check refuses it;
- ``tree_build_unlinked``: the twin skips a node whose parent is not found, silently, where
  the CUDA kernel reads past the request's row (the stand-in raises);
- ``greedy``: the greedy walk's XPU twin agrees with the CUDA stand-in and the reference;
- ``cache_locs``: the cache-location writers, which ARE Triton kernels on a CUDA server
  (``cache_locs.py``, ``allocation.py``, ``eagle.py``), agree with their stand-ins.
"""

from __future__ import annotations

import sys
from pathlib import Path

TAG = "TRITONTWINS:"
CASES = ("tree_build", "tree_build_old_width", "tree_build_unlinked", "greedy", "cache_locs")
RELEASE = "0.5.23"
REPO = Path(__file__).resolve().parent.parent


def _load(path: str, names: tuple) -> dict:
    import ast
    import zipfile

    import torch
    import triton
    import triton.language as tl

    from ddtree_deploy.sandbox import release_wheel

    with zipfile.ZipFile(release_wheel(RELEASE)) as zf:
        src = zf.read(path).decode()
    lines = src.splitlines(keepends=True)
    ns: dict = {"triton": triton, "tl": tl, "torch": torch}
    found = set()
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            exec(compile("".join(lines[start:node.end_lineno]), f"<{RELEASE}:{path}>", "exec"), ns)
            found.add(node.name)
    assert found == set(names), f"{path} lacks {set(names) - found}"
    return ns


def _kernels() -> dict:
    ns = {}
    ns.update(_load("sglang/kernels/ops/speculative/spec_tree.py",
                    ("sgl_build_tree_kernel_efficient_triton", "verify_tree_greedy_kernel_triton")))
    ns.update(_load("sglang/kernels/ops/speculative/cache_locs.py",
                    ("assign_extend_cache_locs", "assign_draft_cache_locs_contiguous")))
    ns.update(_load("sglang/kernels/ops/speculative/eagle.py",
                    ("fill_bonus_tokens", "fill_accept_out_cache_loc")))
    ns.update(_load("sglang/srt/mem_cache/allocation.py", ("assign_req_to_token_pool",)))
    return ns


def _buffers(seq_lens, n, mode):
    import torch

    bs = seq_lens.numel()
    mask = (torch.ones(int(seq_lens.sum()) * n + n * n * bs, dtype=torch.bool) if mode == 0
            else torch.ones(n * n * bs, dtype=torch.bool))
    return mask, torch.empty(bs * n, dtype=torch.long), torch.full((3, bs, n), -1, dtype=torch.long)


def _triton_build(k, parent_list, sel, seq_lens, topk, depth, n, mode):
    """As spec_tree.py's launcher calls it on XPU: one program per request, the parent list's
    REAL row stride."""
    import torch

    bs = seq_lens.numel()
    mask, positions, retrieve = _buffers(seq_lens, n, mode)
    k["sgl_build_tree_kernel_efficient_triton"][(bs,)](
        parent_list, sel, seq_lens, torch.cumsum(seq_lens, 0) - seq_lens, mask, positions,
        retrieve[0], retrieve[1], retrieve[2], topk=topk, depth=depth, draft_token_num=n,
        tree_mask_mode=mode, batch_size=bs, parent_list_stride=parent_list.stride(0),
        selected_index_stride=sel.stride(0))
    return mask, positions, retrieve


def _cuda_build(parent_list, sel, seq_lens, topk, depth, n, mode):
    import v2_kernel_standins as ks

    mask, positions, retrieve = _buffers(seq_lens, n, mode)
    ks.build_tree_kernel_efficient_cpu(parent_list, sel, seq_lens, mask, positions, retrieve[0],
                                       retrieve[1], retrieve[2], topk, depth, n, mode)
    return mask, positions, retrieve


def _worker_tree(seed, *, bs=2, depth=4, k=3, budget=12, vocab=30):
    import ddtree_lineage as dl
    import ddtree_utils as du
    import torch

    gen = torch.Generator().manual_seed(seed)
    lp, tok = du.topk_logprobs(torch.randn(bs, depth, vocab, generator=gen) * 2, k)
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    layout = du.build_ddtree(dl.finite_logprobs(lp), tok, roots, budget)
    parent_list, sel, _ = dl.eagle_lineage(layout, tok)
    seq_lens = torch.randint(0, 5, (bs,), generator=gen)
    return layout, parent_list, sel, seq_lens, k, dl.lineage_depth(budget, k, depth), budget + 1


def case_tree_build(k):
    import torch

    for seed in range(4):
        layout, parent_list, sel, seq_lens, topk, depth, n = _worker_tree(seed)
        for mode in (0, 1):
            t = _triton_build(k, parent_list, sel, seq_lens, topk, depth, n, mode)
            c = _cuda_build(parent_list, sel, seq_lens, topk, depth, n, mode)
            for a, b in zip(t, c):
                assert torch.equal(a, b), (seed, mode)
            assert torch.equal(c[2][1], layout.retrieve_next_token)


def case_tree_build_old_width(k):
    import torch
    import v2_kernel_standins as ks

    layout, parent_list, sel, seq_lens, topk, depth, n = _worker_tree(7)
    old = torch.full((parent_list.shape[0], n + 1), -1, dtype=torch.long)  # B + 2 columns
    old[:, : n - 1] = parent_list[:, : n - 1]
    _, _, retrieve = _triton_build(k, old, sel, seq_lens, topk, 4, n, 1)
    assert torch.equal(retrieve[1], layout.retrieve_next_token)  # the twin: a fine tree
    try:
        _cuda_build(old, sel, seq_lens, topk, 4, n, 1)
    except ks.HostCheckError as exc:
        assert "parent_width 14 != topk" in str(exc), exc
    else:
        raise AssertionError("the CUDA stand-in took the B + 2 wide parent list")


def case_tree_build_unlinked(k):
    import v2_kernel_standins as ks

    layout, parent_list, sel, seq_lens, topk, depth, n = _worker_tree(8)
    assert bool((layout.parents[0] == 3).any())  # node 3 has children
    parent_list = parent_list.clone()
    parent_list[0, 3] = 10_000  # whose group now names no node
    _triton_build(k, parent_list, sel, seq_lens, topk, depth, n, 1)  # no complaint
    try:
        _cuda_build(parent_list, sel, seq_lens, topk, depth, n, 1)
    except ks.OutOfRangeAccess as exc:
        assert "parent-not-found" in str(exc), exc
    else:
        raise AssertionError("the CUDA stand-in missed the out-of-row read")


def case_greedy(k):
    import ddtree_lineage as dl
    import ddtree_utils as du
    import torch
    import v2_kernel_standins as ks

    for seed in range(4):
        layout, *_ = _worker_tree(seed, budget=10)
        bs, n = layout.tokens.shape
        gen = torch.Generator().manual_seed(seed)
        nxt = layout.retrieve_next_token.clamp(min=0)
        target = torch.where(torch.rand(bs, n, generator=gen) < 0.7, layout.tokens.gather(1, nxt),
                             torch.randint(0, 30, (bs, n), generator=gen))
        steps = dl.lineage_depth(n - 1, 3, 4) + 1
        out = []
        for run in ("triton", "cuda"):
            bufs = (torch.zeros(bs * n, dtype=torch.int32),
                    torch.full((bs, steps), -1, dtype=torch.int32), torch.zeros(bs, dtype=torch.int32))
            args = (*bufs, layout.tokens, layout.retrieve_index, layout.retrieve_next_token,
                    layout.retrieve_next_sibling, target)
            if run == "triton":
                k["verify_tree_greedy_kernel_triton"][(bs,)](
                    *args, batch_size=bs, num_speculative_tokens=steps, num_draft_tokens=n)
            else:
                ks.verify_tree_greedy_cpu(*args)
            out.append(bufs)
        for a, b in zip(*out):
            assert torch.equal(a, b), seed
        assert torch.equal(out[1][2].long(), du.greedy_accept(layout, target).accept_length)


def case_cache_locs(k):
    import torch
    import v2_kernel_standins as ks

    gen = torch.Generator().manual_seed(0)
    pool_len, rows, bs = 40, 6, 4
    table = torch.randint(0, 1000, (rows, pool_len), generator=gen, dtype=torch.int32)
    req = torch.tensor([4, 1, 5, 2])
    start = torch.tensor([0, 7, 3, 12])
    end = start + torch.tensor([5, 9, 1, 6])
    total = int((end - start).sum())
    # assign_extend_cache_locs: the draft block's and the verify's windows.
    t, c = torch.zeros(total, dtype=torch.int64), torch.zeros(total, dtype=torch.int64)
    k["assign_extend_cache_locs"][(bs,)](req, table, start, end, t, pool_len, 4)
    ks.assign_extend_cache_locs_cpu(req, table, start, end, c, pool_len)
    assert torch.equal(t, c), "assign_extend_cache_locs"
    # assign_req_to_token_pool: the inverse, on fresh slots.
    slots = torch.randint(0, 1000, (total,), generator=gen)
    t, c = table.clone(), table.clone()
    k["assign_req_to_token_pool"][(bs,)](req, t, start, end, slots, pool_len, 4)
    ks.assign_req_to_token_pool_cpu(req, c, start, end, slots, pool_len)
    assert torch.equal(t, c), "assign_req_to_token_pool"
    # assign_draft_cache_locs_contiguous: topk x steps slots from seq_len.
    seq = torch.tensor([3, 0, 10, 20])
    t, c = torch.zeros(bs * 6, dtype=torch.int64), torch.zeros(bs * 6, dtype=torch.int64)
    k["assign_draft_cache_locs_contiguous"][(bs,)](req, table, seq, t, pool_len, 2, 3, BS=bs)
    ks.assign_draft_cache_locs_contiguous_cpu(req, table, seq, c, pool_len, 2, 3)
    assert torch.equal(t, c), "assign_draft_cache_locs_contiguous"
    # fill_accept_out_cache_loc: the accepted path's slots compacted to the front.
    accept_index = torch.tensor([[0, 3, 5, -1], [6, 9, -1, -1], [12, 13, 15, 17]], dtype=torch.int32)
    out_cache_loc = torch.randint(0, 1000, (18,), generator=gen)
    size = accept_index.numel()
    t, c = torch.zeros(size, dtype=torch.int64), torch.zeros(size, dtype=torch.int64)
    k["fill_accept_out_cache_loc"][(size,)](accept_index, out_cache_loc, t, 16)
    ks.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, c)
    assert torch.equal(t, c), "fill_accept_out_cache_loc"
    # fill_bonus_tokens: the last accepted token of each row.
    tokens = torch.randint(0, 100, (3, 4), generator=gen, dtype=torch.int32)
    lens = torch.tensor([3, 2, 4], dtype=torch.int32)
    t, c = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    k["fill_bonus_tokens"][(3,)](tokens, lens, t, 4)
    ks.fill_bonus_tokens_cpu(tokens, lens, c, 4)
    assert torch.equal(t, c), "fill_bonus_tokens"


def main(argv):
    import os

    from probe_cases import run_cases

    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    sys.path[:0] = [str(REPO / "payload"), str(REPO / "tests")]
    return run_cases(TAG, argv, _kernels, globals(), what="load")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
