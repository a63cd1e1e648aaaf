"""SGLang's CUDA tree-verify kernels transcribed in Python: the ONE transcription of them in
this repository.

Two users, one source:

- the GPU check (this package): ``simulate`` is the tree kernel's stand-in in the dry run and,
  on the GPU, the guard run before SGLang's kernel is launched on a lineage (a lineage with a
  fault is never launched: the out-of-row walk could hang the GPU and spend the machine's
  time); after a launch the kernel's outputs must equal ``simulate``'s bit for bit, and
  ``compare`` says whether the built tree is the DDTree layout it came from;
- the CPU suite's NAMED STAND-INS (tests/v2_kernel_standins.py): the ``sgl_kernel`` CPU ops of
  EAGLE's verify (``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu``,
  ``tree_speculative_sampling_target_only``) are ``build_tree_kernel_efficient``,
  ``verify_tree_greedy`` and ``tree_speculative_sampling_target_only`` below.

What is transcribed (0.5.23 wheel; 0.5.21 and 0.5.22 have the same lines, 0.5.20 runs the same
kernels from sgl-kernel 0.4.7 without host checks):

- the host checks, which raise ``HostCheckError`` exactly where the CUDA host code raises
  (``sglang/kernels/jit/csrc/speculative/tree.cuh`` and ``sampling.cuh``: shapes, strides,
  dtypes as ``TensorMatcher`` of ``include/sgl_kernel/tensor.h`` checks them, the parent-list
  width ``topk * (depth - 1) + 1``, the 1024-node bound); the device test is skipped (here
  every tensor is a CPU one). tree.cuh's checks all precede ``if (bs == 0) return;``;
- ``build_tree_efficient`` and ``VerifyTreeGreedy`` (``include/sgl_kernel/speculative/
  eagle.cuh``; one block per request, one thread per node / per request) and
  ``TreeSpeculativeSamplingTargetOnly`` (``include/sgl_kernel/speculative/sampling.cuh``),
  reading the buffers as flat memory with the kernels' own strides (``parent_list`` rows
  ``topk * (depth - 1) + 1`` apart whatever the tensor's stride, ``selected_index`` rows
  ``draft_token_num - 1`` apart), C integer semantics (``int`` parent ids and groups, division
  toward zero, the 32-bit mask offset), in place on the caller's tensors (what the kernel
  only reads, e.g. ``retrive_next_token`` before it links a child, is read from them).

Faults: where the CUDA kernel would leave a request's row (the tree builder's "parent not
found" path reads ``selected_index`` past the row and its mask walk then writes outside the
node's row; a group outside the ``parent_list`` row), loop forever (a parent cycle: the mask
walk is a ``while (true)``; a sibling cycle in the greedy walk), or overflow its 32-bit mask
offset, the transcription does not do it. It calls ``on_fault(message)``: by default that
raises ``OutOfRangeAccess`` (the stand-ins); ``simulate`` records the message instead and
abandons that node (or request), so the GPU check can name every fault of a lineage.

tests/integration/test_gpu_check_model.py and tests/integration/test_v2_kernel_contract.py pin, in each release's
wheel, the source lines this follows. torch only (no SGLang, nothing from tests/): importable
on the lent GPU machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2
MAX_DRAFT_TOKENS = 1024  # tree.cuh:46: CHECK_HOST(draft_token_num > 0 && draft_token_num <= 1024)
INT32_MAX = 2**31 - 1

OnFault = Optional[Callable[[str], None]]


class HostCheckError(RuntimeError):
    """A CUDA host check (CHECK_HOST / TensorMatcher / CHECK_INPUT) refused the call."""


class OutOfRangeAccess(RuntimeError):
    """The CUDA kernel would read or write outside the request's row (or loop forever)."""


class _Abandon(Exception):
    """A recorded fault: the kernel's work on this node (or request) stops here."""


def _faults(on_fault: OnFault):
    def fail(message: str):
        if on_fault is None:
            raise OutOfRangeAccess(message)
        on_fault(message)
        raise _Abandon
    return fail


def _c_div(a: int, b: int) -> int:
    """C integer division (truncates toward zero), as the kernel's ``x / topk``."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _as_int32(x: int) -> int:
    """An int64 stored in a C ``int``."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


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


def check_build_tree_host(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                          retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                          draft_token_num, tree_mask_mode):
    """tree.cuh:45-89, the JIT host checks of build_tree_kernel_efficient (0.5.21 - 0.5.23)."""
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
    # The mask: any element type whose width is whole bytes, a lower bound on its bytes.
    _check(tree_mask.dim() == 1, "tree_mask must be 1-D")
    bytes_per_item, min_bytes = 1, 0
    if tree_mask_mode == QLEN_ONLY_BITPACKING:
        _check(n <= 32, f"bit-packed tree mask needs draft_token_num <= 32, got {n}")
        bytes_per_item = 4 if n > 16 else (2 if n > 8 else 1)
        min_bytes = bs * n * bytes_per_item
    elif tree_mask_mode == QLEN_ONLY:
        min_bytes = bs * n * n
    _check(tree_mask.is_contiguous(), "tree_mask: not contiguous")
    elem = tree_mask.element_size()  # tensor.h: dtype().bits / 8 (bool: 8 bits)
    _check(tree_mask.numel() * elem >= min_bytes, f"tree_mask holds {tree_mask.numel() * elem} "
           f"bytes, needs >= {min_bytes}")


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


# ---------------------------------------------------------------------------------------------
# Memory as a kernel sees it


def _flat(t):
    # The kernels see raw memory from data_ptr: the storage as laid out, whatever the view.
    return t.reshape(-1) if t.is_contiguous() else t.as_strided((t.numel(),), (1,))


class _Row:
    """Flat memory read the way a CUDA kernel reads it, with its bounds checked."""

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


def mask_row_start(seq_lens: List[int], b: int, tid: int, n: int, mode: int) -> int:
    """Index of the first cell of node ``tid``'s mask row (its first prefix column)."""
    if mode == FULL_MASK:
        return n * n * b + n * sum(seq_lens[:b]) + (seq_lens[b] + n) * tid
    return n * n * b + n * tid


def used_mask_cells(seq_lens: List[int], n: int, mode: int) -> int:
    bs = len(seq_lens)
    return n * sum(seq_lens) + bs * n * n if mode == FULL_MASK else bs * n * n


# ---------------------------------------------------------------------------------------------
# The tree builder: eagle.cuh build_tree_efficient (+ tree.cuh's host code around it)


def build_tree_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                         retrive_index, retrive_next_token, retrive_next_sibling, topk: int,
                         depth: int, draft_token_num: int, tree_mask_mode: int,
                         on_fault: OnFault = None) -> None:
    """The kernel, in place: thread 0 of request b links the retrieve arrays (nodes n-1 .. 1,
    each under the first node whose candidate id equals its group's ``parent_list`` entry,
    pushed at the front of the parent's child list); thread tid > 0 writes row tid of the
    mask (its own column, then each ancestor's, found by the same scan) and its position."""
    if tree_mask_mode == QLEN_ONLY_BITPACKING:
        raise NotImplementedError("the bit-packed mask is not on the DDTree path")
    fail = _faults(on_fault)
    n, topk, depth = int(draft_token_num), int(topk), int(depth)
    stride = topk * (depth - 1) + 1  # eagle.cuh:81, :115: the kernel's parent_list row stride
    pl = _flat(parent_list).tolist()
    sel = _flat(selected_index).tolist()
    lens = [int(x) for x in _flat(verified_seq_len).tolist()]
    mask = _flat(tree_mask)
    pos_t, idx_t = _flat(positions), _flat(retrive_index)
    nxt_t, sib_t = _flat(retrive_next_token), _flat(retrive_next_sibling)
    pos, r_idx, r_next, r_sib = (pos_t.tolist(), idx_t.tolist(), nxt_t.tolist(),
                                 sib_t.tolist())
    for b in range(len(lens)):
        row = b * (n - 1)
        # The parent scans read selected_index[row + p] for p = 0, 1, ... and stop at the first
        # match; no match in the row reads p = n - 1: the next request's entry, or past the
        # buffer (the "invalid eagle tree" path).
        first = {}
        for j in range(n - 1):
            v = sel[row + j] if row + j < len(sel) else None
            if v is not None and v not in first:
                first[v] = j

        def group_of(j: int, node: int) -> int:
            if row + j >= len(sel):
                fail(f"request {b}: node {node}: selected_index[{row + j}] is past the buffer")
            return _as_int32(_c_div(sel[row + j], topk))

        def parent_at(g: int, node: int) -> int:
            """The node index (0-based in selected_index) whose id is group g's parent id."""
            if not 0 <= g < stride:
                fail(f"request {b}: node {node}: group {g} reads parent_list outside the "
                     f"request's row (the kernel's row stride topk * (depth - 1) + 1 = {stride})")
            if b * stride + g >= len(pl):
                fail(f"request {b}: node {node}: group {g} reads past the end of parent_list")
            pid = _as_int32(pl[b * stride + g])
            j = first.get(pid)
            if j is None:
                fail(f"request {b}: node {node}: parent id {pid} matches no candidate in the "
                     "request's row (the CUDA parent-not-found path: the scan reads "
                     "selected_index past the row, and the mask walk writes outside the "
                     "node's row)")
            return j

        for tid in range(n):
            start = mask_row_start(lens, b, tid, n, tree_mask_mode)
            t = start + (lens[b] if tree_mask_mode == FULL_MASK else 0) + 1  # token_tree_idx
            try:
                if t + n > INT32_MAX:
                    fail(f"request {b}: node {tid}: mask offset {t} overflows the kernel's int")
                if t - 1 < 0 or t + n - 1 > mask.numel():
                    fail(f"request {b}: node {tid}: mask row [{t - 1}, {t + n - 1}) is outside "
                         f"the tree_mask buffer ({mask.numel()} cells)")
                mask[t - 1] = True
                mask[t:t + n - 1] = False
            except _Abandon:
                continue
            if tid == 0:
                pos[b * n] = lens[b]
                for i in range(n - 1, 0, -1):
                    r_idx[b * n + i] = b * n + i
                    try:
                        g = group_of(i - 1, i)
                        parent_position = parent_at(g, i) + 1 if g > 0 else 0
                    except _Abandon:
                        continue  # unlinked ("The token will be ignored")
                    head = r_next[b * n + parent_position]
                    r_next[b * n + parent_position] = i
                    if head != -1:
                        r_sib[b * n + i] = head
                r_idx[b * n] = b * n
                continue
            cur, position, marks = tid - 1, 0, []
            try:
                while True:
                    position += 1
                    if position > n:
                        fail(f"request {b}: node {tid}'s parent chain never reaches the root (a "
                             "cycle: the CUDA mask loop has no bound)")
                    marks.append(t + cur)
                    g = group_of(cur, tid)
                    if g == 0:
                        break
                    cur = parent_at(g, tid)
            except _Abandon:
                continue
            finally:
                if marks:
                    mask[torch.tensor(marks)] = True
            pos[b * n + tid] = position + lens[b]
    for tensor, values in ((pos_t, pos), (idx_t, r_idx), (nxt_t, r_next), (sib_t, r_sib)):
        tensor.copy_(torch.tensor(values, dtype=tensor.dtype))


def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask,
                                positions, retrive_index, retrive_next_token,
                                retrive_next_sibling, topk, depth, draft_token_num,
                                tree_mask_mode, on_fault: OnFault = None):
    """tree.cuh build_tree_kernel_efficient: the host checks, then (batch > 0) the kernel."""
    check_build_tree_host(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                          retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                          draft_token_num, tree_mask_mode)
    if int(parent_list.shape[0]) == 0:  # `if (bs == 0) return;`
        return
    build_tree_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                         retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                         draft_token_num, tree_mask_mode, on_fault)


# ---------------------------------------------------------------------------------------------
# The greedy walk: eagle.cuh VerifyTreeGreedy (+ tree.cuh verify_tree_greedy's host code)


def verify_tree_greedy_walk(predicts, accept_index, accept_token_num, candidates,
                            retrive_index, retrive_next_token, retrive_next_sibling,
                            target_predict, on_fault: OnFault = None) -> None:
    """The kernel, in place (one thread per request): from the root, the first child in
    sibling order whose token is the target's token at the last accepted node; at most
    ``accept_index.shape[1] - 1`` levels. Reads by flat index as the kernel does: the
    retrieve arrays within the request's row, ``target_predict`` / ``predicts`` at the flat
    retrieve index."""
    fail = _faults(on_fault)
    bs, n = int(candidates.shape[0]), int(candidates.shape[1])
    s = int(accept_index.shape[1])
    cand = _flat(candidates).tolist()
    r_idx, r_next = _flat(retrive_index).tolist(), _flat(retrive_next_token).tolist()
    r_sib, target = _flat(retrive_next_sibling).tolist(), _flat(target_predict).tolist()
    pred_t, acc_t, num_t = _flat(predicts), _flat(accept_index), _flat(accept_token_num)
    pred, acc, num = pred_t.tolist(), acc_t.tolist(), num_t.tolist()

    def flat_at(values: list, i: int, what: str, b: int):
        if not 0 <= i < len(values):
            fail(f"request {b}: {what}[{i}] is outside the buffer ({len(values)})")
        return values[i]

    for bx in range(bs):
        try:
            last = r_idx[bx * n]
            acc[bx * s] = _as_int32(last)
            accepted, cur, tried = 0, 0, 0
            for _ in range(1, s):
                cur = r_next[bx * n + cur]
                while cur != -1:
                    tried += 1
                    if not 0 <= cur < n:
                        fail(f"request {bx}: the walk leaves the request's row (node {cur})")
                    if tried > n * s:
                        fail(f"request {bx}: the walk never ends (a sibling cycle)")
                    draft_index = r_idx[bx * n + cur]
                    want = flat_at(target, last, "target_predict", bx)
                    if cand[bx * n + cur] == want:
                        flat_at(pred, last, "predicts", bx)
                        pred[last] = _as_int32(want)
                        accepted += 1
                        acc[bx * s + accepted] = _as_int32(draft_index)
                        last = draft_index
                        break
                    cur = r_sib[bx * n + cur]
                if cur == -1:
                    break
            num[bx] = accepted
            flat_at(pred, last, "predicts", bx)
            pred[last] = _as_int32(flat_at(target, last, "target_predict", bx))
        except _Abandon:
            continue
    for tensor, values in ((pred_t, pred), (acc_t, acc), (num_t, num)):
        tensor.copy_(torch.tensor(values, dtype=tensor.dtype))


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict,
                       on_fault: OnFault = None):
    """tree.cuh verify_tree_greedy: the host checks, then (batch > 0) the kernel."""
    bs, _, _ = check_verify_greedy_host(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, target_predict)
    if bs == 0:
        return
    verify_tree_greedy_walk(predicts, accept_index, accept_token_num, candidates,
                            retrive_index, retrive_next_token, retrive_next_sibling,
                            target_predict, on_fault)


# ---------------------------------------------------------------------------------------------
# Target-only tree sampling: sampling.cuh (host, JIT) + speculative/sampling.cuh (kernel)


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


def vec_size(vocab: int) -> int:
    """The sampling kernel's vector width (sampling.py: gcd(4, vocab), checked on the host)."""
    return math.gcd(4, int(vocab))


# ---------------------------------------------------------------------------------------------
# The GPU check's view: outputs from fresh buffers, faults recorded instead of raised


@dataclass
class TreeOutputs:
    tree_mask: torch.Tensor  # the mask buffer after the kernel (same dtype and size as given)
    positions: torch.Tensor  # [bs * n] int64
    retrieve_index: torch.Tensor  # [bs, n] int64
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor


def simulate(parent_list, selected_index, seq_lens, topk: int, depth: int, n: int, mode: int,
             tree_mask: torch.Tensor):
    """The kernel's outputs for these inputs, from the buffers SGLang hands it (positions and
    retrieve arrays -1, the mask as given: copied, not changed), and its faults.

    parent_list, selected_index, seq_lens: CPU tensors (read as flat buffers). Returns
    (TreeOutputs, faults: one-line strings, at most 20; empty when the kernel stays inside
    every row)."""
    bs = int(seq_lens.numel())
    mask = tree_mask.clone()
    positions = torch.full((bs * n,), -1, dtype=torch.long)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
    faults: List[str] = []

    def record(message: str) -> None:
        if len(faults) < 20:
            faults.append(message)

    build_tree_efficient(parent_list, selected_index, seq_lens, mask, positions, retrieve[0],
                         retrieve[1], retrieve[2], topk, depth, n, mode, on_fault=record)
    return TreeOutputs(mask, positions, retrieve[0], retrieve[1], retrieve[2]), faults


@dataclass
class GreedyOutputs:
    predicts: torch.Tensor  # [bs * n] int32
    accept_index: torch.Tensor  # [bs, S] int32
    accept_token_num: torch.Tensor  # [bs] int32


def simulate_verify_greedy(candidates, retrieve_index, retrieve_next_token,
                           retrieve_next_sibling, target_predict, num_speculative_tokens: int):
    """The greedy walk from the buffers SGLang allocates (predicts 0, accept_index -1, int32)
    and its faults (a request whose walk faults is abandoned). All tensors CPU, [bs, n]."""
    bs, n = candidates.shape
    s = int(num_speculative_tokens)
    out = GreedyOutputs(torch.zeros(bs * n, dtype=torch.int32),
                        torch.full((bs, s), -1, dtype=torch.int32),
                        torch.zeros(bs, dtype=torch.int32))
    faults: List[str] = []
    verify_tree_greedy_walk(out.predicts, out.accept_index, out.accept_token_num, candidates,
                            retrieve_index, retrieve_next_token, retrieve_next_sibling,
                            target_predict, on_fault=faults.append)
    return out, faults[:20]


def _children(r_next: List[int], r_sib: List[int], node: int, n: int) -> Optional[List[int]]:
    out, c = [], r_next[node]
    while c != -1:
        if len(out) > n or not 0 <= c < n:
            return None  # a cycle or an index outside the request
        out.append(c)
        c = r_sib[c]
    return out


def compare(layout, seq_lens, outs: TreeOutputs, n: int, mode: int, sentinel: int,
            fill: int = 1) -> List[str]:
    """Mismatches (one line each, at most 20) between a built tree and the DDTree layout:
    every draft node linked exactly once; every valid node with the layout's parent, child
    order, depth, position and mask row; every node with a mask row and a position consistent
    with the links the kernel made; the prefix columns untouched; nothing written past the
    batch's mask cells.

    layout: ddtree_utils.DDTreeLayout (CPU). outs: the kernel's (or ``simulate``'s) outputs
    on CPU. The mask buffer was filled with ``fill`` over the batch's cells (the prefix
    columns, as SGLang fills them) and ``sentinel`` past them.
    """
    bad: List[str] = []

    def say(msg: str) -> None:
        if len(bad) < 20:
            bad.append(msg)

    lens = [int(x) for x in seq_lens.tolist()]
    bs = len(lens)
    flat = outs.tree_mask.view(-1).to(torch.int64).tolist()
    used = used_mask_cells(lens, n, mode)
    if any(v != sentinel for v in flat[used:]):
        say(f"the mask buffer was written past the batch's {used} cells")
    parents = layout.parents.tolist()
    valid = layout.valid.tolist()
    depths = layout.depths.tolist()
    ref_mask = layout.tree_mask.tolist()
    positions = outs.positions.tolist()
    for b in range(bs):
        r_idx = outs.retrieve_index[b].tolist()
        r_next = outs.retrieve_next_token[b].tolist()
        r_sib = outs.retrieve_next_sibling[b].tolist()
        if r_idx != [b * n + i for i in range(n)]:
            say(f"request {b}: retrieve_index is not b * n + i")
        kparent = [-2] * n  # -2: not linked
        kparent[0] = -1
        for p in range(n):
            kids = _children(r_next, r_sib, p, n)
            if kids is None:
                say(f"request {b}: node {p}'s child list is cyclic or leaves the request")
                continue
            for c in kids:
                if c == 0 or kparent[c] != -2:
                    say(f"request {b}: node {c} is linked twice (or the root is a child)")
                kparent[c] = p
            ref_kids = [i for i in range(1, n) if valid[b][i] and parents[b][i] == p]
            if valid[b][p] and [c for c in kids if valid[b][c]] != ref_kids:
                say(f"request {b}: node {p}'s valid children {[c for c in kids if valid[b][c]]}"
                    f" != DDTree's {ref_kids}")
        unlinked = [i for i in range(1, n) if kparent[i] == -2]
        if unlinked:
            say(f"request {b}: nodes {unlinked[:8]} are not linked into the tree")
            continue
        kdepth = [0] * n
        for i in range(1, n):  # parents precede children in both trees
            p = kparent[i]
            kdepth[i] = kdepth[p] + 1 if p < i else -n
        for i in range(n):
            if kdepth[i] < 0:
                say(f"request {b}: node {i} hangs under a later node {kparent[i]}")
                break
            if valid[b][i] and (kparent[i] != parents[b][i] or kdepth[i] != depths[b][i]):
                say(f"request {b}: valid node {i}: parent {kparent[i]} depth {kdepth[i]} != "
                    f"DDTree's parent {parents[b][i]} depth {depths[b][i]}")
            if positions[b * n + i] != lens[b] + kdepth[i]:
                say(f"request {b}: node {i}: position {positions[b * n + i]} != "
                    f"seq_len {lens[b]} + depth {kdepth[i]}")
            ancestors, a = set(), i
            while a >= 0:
                ancestors.add(a)
                a = kparent[a]
            start = mask_row_start(lens, b, i, n, mode)
            prefix = lens[b] if mode == FULL_MASK else 0
            if any(v != fill for v in flat[start:start + prefix]):
                say(f"request {b}: node {i}: a prefix column of its mask row changed")
            row = [bool(v) for v in flat[start + prefix:start + prefix + n]]
            if row != [j in ancestors for j in range(n)]:
                say(f"request {b}: node {i}: mask row is not its ancestors in the built tree")
            elif valid[b][i] and row != ref_mask[b][i]:
                say(f"request {b}: valid node {i}: mask row != DDTree's")
    return bad
