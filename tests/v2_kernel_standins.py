"""NAMED STAND-INS for the GPU kernels on the v2 tree-verify path, in pure torch (CPU).

With ``SGLANG_USE_CPU_ENGINE=1`` SGLang 0.5.23 routes its speculative kernels to the CPU ops of
its ``sgl_kernel`` wheel (``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu``,
``assign_extend_cache_locs_cpu``, ``fill_accept_out_cache_loc_cpu``, ``fill_bonus_tokens_cpu``,
...). That wheel is a compiled build this machine does not have, so these functions stand in
for them. Each one follows the kernel a GPU server runs, not SGLang's CPU or XPU twin:

- ``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu``,
  ``tree_speculative_sampling_target_only``: the CUDA kernels, transcribed from the release's
  own sources (0.5.21 - 0.5.23: ``sglang/kernels/jit/csrc/speculative/tree.cuh`` and
  ``sampling.cuh`` for the host checks, ``include/sgl_kernel/speculative/eagle.cuh`` and
  ``sampling.cuh`` for the kernels; 0.5.20 runs the same kernels from sgl-kernel 0.4.7 without
  the host checks). Their host checks raise ``HostCheckError`` exactly where the CUDA host code
  raises (shapes, strides, dtypes, the parent-list width ``topk * (depth - 1) + 1``, the 1024
  node bound), and the kernels index flat memory with the CUDA kernel's strides (not the
  tensor's), raising ``OutOfRangeAccess`` where the CUDA kernel would read or write outside
  the request's row (the tree builder's parent-not-found path) or never stop (its mask loop).
  The XPU Triton twin (``spec_tree.py``) reads the tensor's real row stride and bounds its
  loops by ``depth``, so it accepts inputs the CUDA kernel refuses or mis-reads:
  tests/test_v2_kernel_contract.py runs it in Triton's CPU interpreter to show that.
- the cache-location writers (``assign_extend_cache_locs_cpu``, ``assign_req_to_token_pool_cpu``,
  ``assign_draft_cache_locs_contiguous_cpu``, ``fill_accept_out_cache_loc_cpu``,
  ``fill_bonus_tokens_cpu``): on CUDA SGLang runs Triton kernels for these
  (``cache_locs.py``, ``allocation.py``, ``eagle.py``), and the contract test runs those very
  kernels in the interpreter against these stand-ins.

The host checks skip the device test (the CUDA code demands a GPU tensor; here everything is
on the CPU). tests/test_v2_kernel_contract.py pins every source line these transcriptions rely
on, in the cached release wheels, so a release that changes the ABI fails that test.

``tree_speculative_sampling_target_only`` has no CPU op in SGLang at all (EAGLE's CPU engine
verifies greedily); the sampling test installs this stand-in in ``eagle_utils`` by name.

This file is also written out as the ``sgl_kernel`` package of the test host (see
``install_as_sgl_kernel``): anything not defined here resolves to a stand-in that raises when
called, like ``sglang_host.write_kernel_standin``.
"""

from __future__ import annotations

import math

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

# tree.cuh:46 (CHECK_HOST(draft_token_num > 0 && draft_token_num <= 1024)).
MAX_DRAFT_TOKENS = 1024
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


class HostCheckError(RuntimeError):
    """A CUDA host check (CHECK_HOST / TensorMatcher / CHECK_INPUT) refused the call."""


class OutOfRangeAccess(RuntimeError):
    """The CUDA kernel would read or write outside the request's row (or loop forever)."""


# ---------------------------------------------------------------------------------------------
# Host checks: TensorMatcher (sgl_kernel/tensor.h) as the JIT wrappers use it.


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise HostCheckError(what)


def _match(name, t, shape, dtype, strides=None):
    """TensorMatcher({shape}).with_strides({strides}).with_dtype<dtype>().verify(t): shape,
    dtype, and the strides given (a size-1 dimension's stride is not checked; None entries
    are unconstrained), or contiguity when no strides are given."""
    _check(t.dim() == len(shape), f"{name}: dimension {t.dim()} != {len(shape)}")
    for i, want in enumerate(shape):
        _check(int(t.shape[i]) == int(want), f"{name}: size {tuple(t.shape)} != {tuple(shape)}")
    if strides is None:
        _check(t.is_contiguous(), f"{name}: not contiguous")
    else:
        for i, want in enumerate(strides):
            if want is not None and t.shape[i] != 1:
                _check(t.stride(i) == want, f"{name}: stride {t.stride()} != {tuple(strides)}")
    _check(t.dtype == dtype, f"{name}: dtype {t.dtype} != {dtype}")


def _flat(t):
    # The kernels see raw memory from data_ptr: the storage as laid out, whatever the view.
    return t.reshape(-1) if t.is_contiguous() else t.as_strided((t.numel(),), (1,))


class _Row:
    """Flat int64 memory read the way a CUDA kernel reads it, with its bounds checked."""

    def __init__(self, name, t):
        self.name, self.t = name, _flat(t)

    def __getitem__(self, i):
        if not 0 <= i < self.t.numel():
            raise OutOfRangeAccess(f"{self.name}[{i}] is outside the buffer ({self.t.numel()})")
        return int(self.t[i])

    def __setitem__(self, i, value):
        if not 0 <= i < self.t.numel():
            raise OutOfRangeAccess(f"{self.name}[{i}] is outside the buffer ({self.t.numel()})")
        self.t[i] = value


# ---------------------------------------------------------------------------------------------
# Tree builder: tree.cuh build_tree_kernel_efficient (host) + eagle.cuh build_tree_efficient.


def check_build_tree_host(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                          retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                          draft_token_num, tree_mask_mode):
    """tree.cuh:45-89, the JIT host checks (0.5.21 - 0.5.23)."""
    n = int(draft_token_num)
    _check(topk > 0 and depth > 0, f"topk {topk} / depth {depth} must be > 0")
    _check(0 < n <= MAX_DRAFT_TOKENS, f"draft_token_num {n} not in (0, {MAX_DRAFT_TOKENS}]")
    _check(0 <= tree_mask_mode <= 2, f"tree_mask_mode {tree_mask_mode}")
    _check(parent_list.dim() == 2, f"parent_list: dimension {parent_list.dim()} != 2")
    bs, width = int(parent_list.shape[0]), int(parent_list.shape[1])
    _match("parent_list", parent_list, (bs, width), torch.int64,
           strides=(None if width == 0 else width, 1))
    _check(depth == 1 or width == topk * (depth - 1) + 1,
           f"parent_width {width} != topk * (depth - 1) + 1 = {topk * (depth - 1) + 1}")
    _match("selected_index", selected_index, (bs, n - 1), torch.int64,
           strides=(None if n == 1 else n - 1, 1))
    _match("verified_seq_len", verified_seq_len, (bs,), torch.int64)
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        _match(name, t, (bs, n), torch.int64)
    _match("positions", positions, (bs * n,), torch.int64)
    _check(tree_mask.dim() == 1, "tree_mask must be 1-D")
    bytes_per_item, min_bytes = 1, 0
    if tree_mask_mode == QLEN_ONLY_BITPACKING:
        _check(n <= 32, f"bit-packed tree mask needs draft_token_num <= 32, got {n}")
        bytes_per_item = 4 if n > 16 else (2 if n > 8 else 1)
        min_bytes = bs * n * bytes_per_item
    elif tree_mask_mode == QLEN_ONLY:
        min_bytes = bs * n * n
    elem = tree_mask.element_size()
    _check(tree_mask.numel() * elem >= min_bytes, f"tree_mask holds {tree_mask.numel() * elem} "
           f"bytes, needs >= {min_bytes}")


def build_tree_kernel_efficient_cpu(
    parent_list, selected_index, verified_seq_len, tree_mask, positions, retrieve_index,
    retrieve_next_token, retrieve_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
):
    """The CUDA tree builder: host checks, then eagle.cuh build_tree_efficient (one block per
    request; thread 0 links the retrieve arrays, thread tid > 0 writes row tid of the mask by
    walking up its parents) with the kernel's own strides."""
    check_build_tree_host(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                          retrieve_index, retrieve_next_token, retrieve_next_sibling, topk,
                          depth, draft_token_num, tree_mask_mode)
    if tree_mask_mode == QLEN_ONLY_BITPACKING:
        raise NotImplementedError("the bit-packed mask is not on the DDTree path")
    n = int(draft_token_num)
    bs = int(verified_seq_len.numel())
    pstride = topk * (depth - 1) + 1  # eagle.cuh:81, :115: the kernel's row stride
    par = _Row("parent_list", parent_list)
    sel = _Row("selected_index", selected_index)
    seq = [int(x) for x in verified_seq_len.tolist()]
    nxt = _Row("retrive_next_token", retrieve_next_token)
    sib = _Row("retrive_next_sibling", retrieve_next_sibling)
    ridx = _Row("retrive_index", retrieve_index)
    pos = _Row("positions", positions)
    mask = _flat(tree_mask)

    def sel_read(b, p):
        # selected_index[bid * (n - 1) + p]; p == n - 1 is the next request's first entry
        # (or past the buffer): the parent-not-found scan reads it.
        if not 0 <= p < n - 1:
            raise OutOfRangeAccess(
                f"request {b}: selected_index read at {p}, outside its row of {n - 1} (a "
                "candidate id names no node: the CUDA parent-not-found path)")
        return sel[b * (n - 1) + p]

    def par_read(b, group):
        if not 0 <= group < pstride:
            raise OutOfRangeAccess(
                f"request {b}: parent_list read at {group}, outside the kernel's row of "
                f"{pstride} (topk * (depth - 1) + 1)")
        return par[b * pstride + group]

    for b in range(bs):
        seq_tree_idx = n * n * b + sum(seq[:b]) * n
        for tid in range(n):
            if tree_mask_mode == FULL_MASK:
                row = seq_tree_idx + (seq[b] + n) * tid + seq[b] + 1
                row_end = seq_tree_idx + (seq[b] + n) * (tid + 1)
            else:
                row = n * n * b + n * tid + 1
                row_end = n * n * b + n * (tid + 1)

            def mask_write(i, value, row=row, row_end=row_end, tid=tid, b=b):
                if not row - 1 <= i < row_end:
                    raise OutOfRangeAccess(
                        f"request {b}: node {tid}'s mask write at {i} is outside its row "
                        f"[{row - 1}, {row_end})")
                if not 0 <= i < mask.numel():
                    raise OutOfRangeAccess(f"tree_mask[{i}] is outside the buffer")
                mask[i] = value

            mask_write(row - 1, True)
            for i in range(n - 1):
                mask_write(row + i, False)
            if tid == 0:
                pos[b * n] = seq[b]
                for i in range(n - 1, 0, -1):
                    ridx[b * n + i] = b * n + i
                    group = sel_read(b, i - 1) // topk
                    parent_position = 0
                    if group > 0:
                        want = par_read(b, group)
                        while parent_position < n:
                            if sel_read(b, parent_position) == want:
                                parent_position += 1
                                break
                            parent_position += 1
                    if parent_position == n:  # unreachable: sel_read raised first
                        continue
                    first = nxt[b * n + parent_position]
                    nxt[b * n + parent_position] = i
                    if first != -1:
                        sib[b * n + i] = first
                ridx[b * n] = b * n
            else:
                cur, position = tid - 1, 0
                while True:
                    position += 1
                    if position > n:
                        raise OutOfRangeAccess(
                            f"request {b}: node {tid}'s parent chain never reaches the root "
                            "(the CUDA mask loop has no bound)")
                    mask_write(row + cur, True)
                    group = sel_read(b, cur) // topk
                    if group == 0:
                        break
                    want = par_read(b, group)
                    cur = 0
                    while cur < n and sel_read(b, cur) != want:
                        cur += 1
                pos[b * n + tid] = position + seq[b]


# ---------------------------------------------------------------------------------------------
# Greedy walk: tree.cuh verify_tree_greedy (host) + eagle.cuh VerifyTreeGreedy.


def check_verify_greedy_host(predicts, accept_index, accept_token_num, candidates,
                             retrive_index, retrive_next_token, retrive_next_sibling,
                             target_predict):
    """tree.cuh:139-153 (and sgl-kernel 0.4.x's CHECK_INPUT / dtype checks: the same set)."""
    bs, n, steps = _check_walk_tensors(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling)
    _match("target_predict", target_predict, (bs, n), torch.int64)
    _check(n > 0 and steps > 0, "draft_tokens and spec_tokens must be > 0")
    return bs, n, steps


def _check_walk_tensors(predicts, accept_index, accept_token_num, candidates, retrive_index,
                        retrive_next_token, retrive_next_sibling):
    """What both tree walks check alike: the tree int64 [bs, n], accept_index int32 [bs, S],
    accept_token_num int32 [bs], predicts int32 [bs * n], all contiguous."""
    _check(candidates.dim() == 2, "candidates must be 2-D")
    bs, n = int(candidates.shape[0]), int(candidates.shape[1])
    for name, t in (("candidates", candidates), ("retrive_index", retrive_index),
                    ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        _match(name, t, (bs, n), torch.int64)
    _check(accept_index.dim() == 2, "accept_index must be 2-D")
    steps = int(accept_index.shape[1])
    _match("accept_index", accept_index, (bs, steps), torch.int32)
    _match("accept_token_num", accept_token_num, (bs,), torch.int32)
    _match("predicts", predicts, (bs * n,), torch.int32)
    return bs, n, steps


def verify_tree_greedy_cpu(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, target_predict,
):
    """The CUDA greedy walk (eagle.cuh VerifyTreeGreedy): from the root, the first child (in
    sibling order) whose token is the target's token at the last accepted node; at most
    ``accept_index.shape[1] - 1`` levels. Flat indexing as the kernel does."""
    bs, n, steps = check_verify_greedy_host(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, target_predict)
    cand, ridx = _Row("candidates", candidates), _Row("retrive_index", retrive_index)
    nxt, sib = _Row("retrive_next_token", retrive_next_token), _Row(
        "retrive_next_sibling", retrive_next_sibling)
    target, pred = _Row("target_predict", target_predict), _Row("predicts", predicts)
    acc, num = _Row("accept_index", accept_index), _Row("accept_token_num", accept_token_num)
    for b in range(bs):
        last = ridx[b * n]
        acc[b * steps] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = nxt[b * n + cur]
            while cur != -1:
                draft_index = ridx[b * n + cur]
                if cand[b * n + cur] == target[last]:
                    pred[last] = target[last]
                    accepted += 1
                    acc[b * steps + accepted] = draft_index
                    last = draft_index
                    break
                cur = sib[b * n + cur]
            if cur == -1:
                break
        num[b] = accepted
        pred[last] = target[last]


# ---------------------------------------------------------------------------------------------
# Target-only tree sampling: sampling.cuh (host, JIT) + speculative/sampling.cuh (kernel).


def check_sampling_host(predicts, accept_index, accept_token_num, candidates, retrive_index,
                        retrive_next_token, retrive_next_sibling, uniform_samples,
                        uniform_samples_for_final_sampling, target_probs, draft_probs,
                        threshold_single, threshold_acc):
    """csrc/speculative/sampling.cuh:54-77 (and sgl-kernel 0.4.x's checks: the same set)."""
    bs, n, steps = _check_walk_tensors(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling)
    _match("uniform_samples", uniform_samples, (bs, n), torch.float32)
    _match("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, (bs,),
           torch.float32)
    _check(target_probs.dim() == 3, "target_probs must be 3-D")
    vocab = int(target_probs.shape[2])
    _match("target_probs", target_probs, (bs, n, vocab), torch.float32)
    _match("draft_probs", draft_probs, (bs, n, vocab), torch.float32)
    _check(n > 0 and steps > 0 and vocab > 0, "empty dimension")
    _check(0 <= threshold_single <= 1 and 0 <= threshold_acc <= 1, "thresholds not in [0, 1]")
    return bs, n, steps, vocab


def tree_speculative_sampling_target_only(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
    draft_probs, threshold_single=1.0, threshold_acc=1.0, deterministic=True,
):
    """The target-only tree sampling walk (TreeSpeculativeSamplingTargetOnly): per node,
    children in sibling order with one coin per accepted node; a child is accepted when
    coin < (target mass of the children tried so far) / threshold_acc; a rejected child's
    target mass is copied into draft_probs, so the bonus, drawn from relu(target - draft) at
    the last node, leaves the rejected tokens out (at a depth-limit leaf: target itself)."""
    bs, n, steps, vocab = check_sampling_host(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single,
        threshold_acc)
    threshold_acc = max(float(threshold_acc), 1e-9)
    cand, ridx = _Row("candidates", candidates), _Row("retrive_index", retrive_index)
    nxt, sib = _Row("retrive_next_token", retrive_next_token), _Row(
        "retrive_next_sibling", retrive_next_sibling)
    pred = _Row("predicts", predicts)
    acc, num = _Row("accept_index", accept_index), _Row("accept_token_num", accept_token_num)
    coins = _flat(uniform_samples)
    target, draft = _flat(target_probs), _flat(draft_probs)
    for b in range(bs):
        prob_acc = 0.0
        offset = b * n * vocab  # cur_prob_offset: the current node's distribution
        coin = float(coins[b * n])
        last = ridx[b * n]
        acc[b * steps] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = nxt[b * n + cur]
            while cur != -1:
                draft_index = ridx[b * n + cur]
                token = cand[b * n + cur]
                if not 0 <= token < vocab:
                    raise OutOfRangeAccess(f"request {b}: token {token} outside the vocabulary")
                p = float(target[offset + token])
                prob_acc += p
                if p > 0 and (coin < prob_acc / threshold_acc or p >= threshold_single):
                    prob_acc = 0.0
                    offset = (b * n + cur) * vocab
                    coin = float(coins[b * n + cur])
                    pred[last] = token
                    accepted += 1
                    acc[b * steps + accepted] = draft_index
                    last = draft_index
                    break
                draft[offset + token] = target[offset + token]
                cur = sib[b * n + cur]
            if cur == -1:
                break
        num[b] = accepted
        q = target[offset:offset + vocab].double()
        if accepted != steps - 1:  # "there is no draft_probs for the bonus token"
            q = (q - draft[offset:offset + vocab].double()).clamp(min=0)
        u = float(uniform_samples_for_final_sampling[b]) * float(q.sum())
        cdf = q.cumsum(0)
        sampled = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True))
        if sampled >= vocab:  # u at (or past) the total: the last token with mass
            nz = (q > 0).nonzero()
            sampled = int(nz[-1]) if len(nz) else vocab - 1
        pred[last] = sampled


# ---------------------------------------------------------------------------------------------
# Cache-location writers: on CUDA these are Triton kernels (compared in the interpreter).


def assign_extend_cache_locs_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """cache_locs.py assign_extend_cache_locs: out_cache_loc = concat over requests of
    req_to_token[row, start:end] (row stride pool_len)."""
    table = _flat(req_to_token)
    pos = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        if e > s:
            if not (0 <= s and e <= pool_len and (r + 1) * pool_len <= table.numel()):
                raise OutOfRangeAccess(f"req_to_token row {r} [{s}, {e}) outside the table")
            out_cache_loc[pos: pos + e - s] = table[r * pool_len + s: r * pool_len + e].to(
                out_cache_loc.dtype)
            pos += e - s


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """allocation.py assign_req_to_token_pool, the inverse: req_to_token[row, start:end] = the
    next end - start entries of out_cache_loc."""
    table = _flat(req_to_token)
    pos = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        if e > s:
            if not (0 <= s and e <= pool_len and (r + 1) * pool_len <= table.numel()):
                raise OutOfRangeAccess(f"req_to_token row {r} [{s}, {e}) outside the table")
            table[r * pool_len + s: r * pool_len + e] = out_cache_loc[pos: pos + e - s].to(
                table.dtype)
            pos += e - s


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_cols
):
    """cache_locs.py assign_draft_cache_locs_contiguous: topk * num_cols slots from seq_len."""
    width = topk * num_cols
    table = _flat(req_to_token)
    for b, (r, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        if not (s + width <= pool_len):
            raise OutOfRangeAccess(f"req_to_token row {r} [{s}, {s + width}) past the row")
        out_cache_loc[b * width: (b + 1) * width] = table[r * pool_len + s: r * pool_len + s + width]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """eagle.py fill_accept_out_cache_loc: out_cache_loc[accept_index] (entries -1 skipped)
    compacted to the front, in order."""
    dst = 0
    for src in accept_index.reshape(-1).tolist():
        if src > -1:
            if src >= out_cache_loc.numel():
                raise OutOfRangeAccess(f"out_cache_loc[{src}] is outside the buffer")
            accept_out_cache_loc[dst] = out_cache_loc[src]
            dst += 1


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """eagle.py fill_bonus_tokens: the last accepted token of each request's row."""
    flat = accept_tokens.reshape(-1)
    for b, length in enumerate(accept_lens.tolist()):
        index = accept_stride * b + length - 1
        if not 0 <= index < flat.numel():
            raise OutOfRangeAccess(f"accept_tokens[{index}] is outside the buffer")
        bonus_tokens[b] = flat[index]


def vec_size(vocab: int) -> int:
    """The sampling kernel's vector width (sampling.py: gcd(4, vocab), checked on the host)."""
    return math.gcd(4, int(vocab))


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
