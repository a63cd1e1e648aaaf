"""NAMED STAND-INS for the SGLang kernels on the v2 tree-verify path, in pure torch (CPU).

With ``SGLANG_USE_CPU_ENGINE=1`` SGLang 0.5.23 routes its speculative kernels to the CPU ops of
its ``sgl_kernel`` wheel (``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu``,
``assign_extend_cache_locs_cpu``, ``fill_accept_out_cache_loc_cpu``, ``fill_bonus_tokens_cpu``,
...). That wheel is a compiled build this machine does not have, so these functions stand in
for them: each one is written from the semantics of SGLang's Triton/CUDA kernel of the same
name (``sglang/kernels/ops/speculative/spec_tree.py``, ``cache_locs.py``, ``eagle.py``,
``kernels/jit/include/sgl_kernel/speculative/sampling.cuh``), plain loops, no cleverness, and
the tests check them against the DDTree reference in ``payload/ddtree_utils.py``.

``tree_speculative_sampling_target_only`` has no CPU op in SGLang at all (EAGLE's CPU engine
verifies greedily); the sampling test installs this stand-in in ``eagle_utils`` by name.

This file is also written out as the ``sgl_kernel`` package of the test host (see
``install_as_sgl_kernel``): anything not defined here resolves to a stand-in that raises when
called, like ``sglang_host.write_kernel_standin``.
"""

from __future__ import annotations

import torch

STANDIN = True

# The ops below, by the name SGLang imports them under.
OPS = (
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_req_to_token_pool_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "tree_speculative_sampling_target_only",
)


def build_tree_kernel_efficient_cpu(
    parent_list, selected_index, verified_seq_len, tree_mask, positions, retrieve_index,
    retrieve_next_token, retrieve_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
):
    """EAGLE's tree builder (spec_tree.py sgl_build_tree_kernel_efficient_triton)."""
    n = int(draft_token_num)
    bs = verified_seq_len.numel()
    seq = verified_seq_len.tolist()
    sel = selected_index.tolist()
    par = parent_list.reshape(bs, -1).tolist()
    prefix_sum = 0

    def parent_position(b, i):  # tree index of node i's parent, or None (unlinked)
        group = sel[b][i - 1] // topk
        if group == 0:
            return 0
        want = par[b][group]
        for pp in range(n - 1):
            if sel[b][pp] == want:
                return pp + 1
        return None

    for b in range(bs):
        seq_len = int(seq[b])
        positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            retrieve_index[b, i] = b * n + i
            p = parent_position(b, i)
            if p is not None:
                first = int(retrieve_next_token[b, p])
                retrieve_next_token[b, p] = i
                if first != -1:
                    retrieve_next_sibling[b, i] = first
        retrieve_index[b, 0] = b * n
        for x in range(n):
            if tree_mask_mode == 0:  # FULL_MASK: rows of seq_len + n columns
                row = n * n * b + prefix_sum * n + (seq_len + n) * x + seq_len
            else:  # QLEN_ONLY: rows of n columns
                row = n * n * b + n * x
            tree_mask[row] = True
            for j in range(n - 1):
                tree_mask[row + 1 + j] = False
            if x == 0:
                continue
            cur, depth_of = x - 1, 0
            for _ in range(depth):
                depth_of += 1
                tree_mask[row + 1 + cur] = True
                p = parent_position(b, cur + 1)
                if p is None or p == 0:
                    break
                cur = p - 1
            positions[b * n + x] = seq_len + depth_of
        prefix_sum += seq_len


def verify_tree_greedy_cpu(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, target_predict,
):
    """EAGLE's greedy tree walk (spec_tree.py verify_tree_greedy_kernel_triton)."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for j in range(1, steps):
            cur = int(retrive_next_token[b, cur])
            while cur != -1:
                draft_index = int(retrive_index[b, cur])
                token = int(candidates[b, cur])
                if token == int(target_predict[b, last - b * n]):
                    predicts[last] = token
                    accepted += 1
                    accept_index[b, accepted] = draft_index
                    last = draft_index
                    break
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
        accept_token_num[b] = accepted
        predicts[last] = int(target_predict[b, last - b * n])


def assign_extend_cache_locs_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """out_cache_loc = concat over requests of req_to_token[row, start:end]."""
    pos = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        out_cache_loc[pos : pos + e - s] = req_to_token[r, s:e].to(out_cache_loc.dtype)
        pos += e - s


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """The inverse: req_to_token[row, start:end] = the next end - start entries of
    out_cache_loc (allocation.py assign_req_to_token_pool)."""
    pos = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        req_to_token[r, s:e] = out_cache_loc[pos : pos + e - s].to(req_to_token.dtype)
        pos += e - s


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_cols
):
    width = topk * num_cols
    for b, (r, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[b * width : (b + 1) * width] = req_to_token[r, s : s + width]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """Compact out_cache_loc[accept_index] (entries -1 skipped) to the front, in order."""
    dst = 0
    for src in accept_index.reshape(-1).tolist():
        if src > -1:
            accept_out_cache_loc[dst] = out_cache_loc[src]
            dst += 1


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    flat = accept_tokens.reshape(-1)
    for b, length in enumerate(accept_lens.tolist()):
        bonus_tokens[b] = flat[accept_stride * b + length - 1]


def tree_speculative_sampling_target_only(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
    draft_probs, threshold_single=1.0, threshold_acc=1.0, deterministic=True,
):
    """The target-only tree sampling walk (sampling.cuh TreeSpeculativeSamplingTargetOnly):
    per node, children in sibling order with one coin per visited node; a child is accepted
    when coin < accumulated target mass of the children tried so far; rejected children's
    mass leaves the residual; the bonus is drawn from relu(target - rejected)."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    vocab = target_probs.shape[-1]
    for b in range(bs):
        prob_acc = 0.0
        node = 0  # the node whose distribution is current
        coin = float(uniform_samples[b, 0])
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = int(retrive_next_token[b, cur])
            while cur != -1:
                token = int(candidates[b, cur])
                p = float(target_probs[b, node, token])
                prob_acc += p
                if p > 0 and (coin < prob_acc / threshold_acc or p >= threshold_single):
                    prob_acc = 0.0
                    node = cur
                    coin = float(uniform_samples[b, cur])
                    predicts[last] = token
                    accepted += 1
                    last = int(retrive_index[b, cur])
                    accept_index[b, accepted] = last
                    break
                draft_probs[b, node, token] = target_probs[b, node, token]
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
        accept_token_num[b] = accepted
        q = target_probs[b, node].double()
        if accepted != steps - 1:
            q = (q - draft_probs[b, node].double()).clamp(min=0)
        u = float(uniform_samples_for_final_sampling[b]) * float(q.sum())
        cdf = q.cumsum(0)
        sampled = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True))
        if sampled >= vocab:
            nz = (q > 0).nonzero()
            sampled = int(nz[-1]) if len(nz) else vocab - 1
        predicts[last] = sampled


def install_as_sgl_kernel(dest) -> str:
    """Write a ``sgl_kernel`` package under ``dest`` = the generic raising stand-in of
    ddtree_deploy/sandbox/hostenv.py plus the ops above; return ``dest`` (for PYTHONPATH)."""
    from pathlib import Path

    from ddtree_deploy.sandbox import hostenv as sglang_host

    folder = sglang_host.write_kernel_standin(Path(dest))
    init = folder / "sgl_kernel" / "__init__.py"
    generic = init.read_text()
    ours = Path(__file__).read_text()
    # The generic stand-in's last line swaps the module class (unknown names -> raising
    # stand-ins); our ops are defined after it, as real module attributes, so they win.
    body = ours.split("def install_as_sgl_kernel", 1)[0].replace(
        "from __future__ import annotations\n", ""
    )
    init.write_text(generic + "\n\n# ---- named CPU stand-ins (tests/v2_kernel_standins.py) ----\n"
                    + body)
    return str(folder)
