"""A Python transcription of SGLang's CUDA tree builder, and the comparison of a built tree
with the DDTree layout it came from.

``simulate`` follows ``build_tree_efficient`` in the 0.5.23 wheel's
``sgl_kernel/speculative/eagle.cuh`` (launched by ``speculative/tree.cuh`` with one block per
request and one thread per verify node), modes FULL_MASK and QLEN_ONLY, reading the buffers
as the kernel does: ``parent_list`` with the row stride ``topk * (depth - 1) + 1`` (not the
tensor's own), ``selected_index`` with the stride ``draft_token_num - 1``, the parent search
over ``draft_token_num`` entries (one past the request's row). Where the kernel would leave
the request's row, take its "invalid eagle tree" path, write the mask outside a node's row,
loop forever or overflow its 32-bit mask offset, the transcription does not do it: it
records a violation and stops that node. tests/test_gpu_check_model.py pins the kernel lines
this relies on. It is the CPU path of the tree check (the dry run) and, on the GPU, the guard
that runs before SGLang's kernel is launched on a lineage: a lineage with a violation is
never launched (the out-of-row walk could hang the GPU and spend the machine's time).

``compare`` states what a correct tree is, for the real kernel's output and for this
transcription's alike: every draft node linked exactly once; every VALID node with the
DDTree layout's parent, child order, depth, position and mask row; every node (padding
included) with a mask row and a position consistent with the links the kernel made; the
prefix columns untouched; nothing written past the batch's mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

FULL_MASK, QLEN_ONLY = 0, 1
INT32_MAX = 2**31 - 1


def _c_div(a: int, b: int) -> int:
    """C integer division (truncates toward zero), as the kernel's ``x / topk``."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _as_int32(x: int) -> int:
    """The kernel stores parent ids in an ``int``."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


@dataclass
class TreeOutputs:
    tree_mask: torch.Tensor  # the mask buffer after the kernel (same dtype and size as given)
    positions: torch.Tensor  # [bs * n] int64
    retrieve_index: torch.Tensor  # [bs, n] int64
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor


def mask_row_start(seq_lens: List[int], b: int, tid: int, n: int, mode: int) -> int:
    """Index of the first cell of node ``tid``'s mask row (its first prefix column)."""
    if mode == FULL_MASK:
        return n * n * b + n * sum(seq_lens[:b]) + (seq_lens[b] + n) * tid
    return n * n * b + n * tid


def used_mask_cells(seq_lens: List[int], n: int, mode: int) -> int:
    bs = len(seq_lens)
    return n * sum(seq_lens) + bs * n * n if mode == FULL_MASK else bs * n * n


def simulate(parent_list, selected_index, seq_lens, topk: int, depth: int, n: int, mode: int,
             tree_mask: torch.Tensor):
    """The kernel's outputs for these inputs, and what it would do out of bounds.

    parent_list, selected_index, seq_lens: CPU tensors (read as flat buffers); tree_mask:
    the buffer as it is before the launch (copied, not changed). Returns (TreeOutputs,
    violations: list of one-line strings; empty when the kernel stays inside every row).
    """
    pl = parent_list.contiguous().reshape(-1).tolist()
    sel = selected_index.contiguous().reshape(-1).tolist()
    lens = [int(x) for x in seq_lens.tolist()]
    bs = len(lens)
    stride = topk * (depth - 1) + 1
    mask = tree_mask.clone()
    flat = mask.view(-1)
    positions = torch.full((bs * n,), -1, dtype=torch.long)
    r_idx = torch.full((bs, n), -1, dtype=torch.long)
    r_next = torch.full((bs, n), -1, dtype=torch.long)
    r_sib = torch.full((bs, n), -1, dtype=torch.long)
    violations: List[str] = []

    def note(b: int, what: str) -> None:
        if len(violations) < 20:
            violations.append(f"request {b}: {what}")

    for b in range(bs):
        row = b * (n - 1)

        def sel_at(j: int) -> Optional[int]:
            return sel[row + j] if 0 <= row + j < len(sel) else None

        # The parent search scans draft_token_num entries: the last one is the next
        # request's first (or past the buffer). First match wins.
        first = {}
        for j in range(n - 1):
            v = sel_at(j)
            if v is not None and v not in first:
                first[v] = j

        def group_of(j: int) -> int:
            return _c_div(sel[row + j], topk)

        def parent_id(g: int, node: int) -> Optional[int]:
            if g < 0 or g >= stride:
                note(b, f"node {node}: group {g} reads parent_list outside the request's row "
                        f"(row stride topk * (depth - 1) + 1 = {stride})")
                return None
            idx = b * stride + g
            if idx >= len(pl):
                note(b, f"node {node}: group {g} reads past the end of parent_list")
                return None
            return _as_int32(pl[idx])

        def lookup(pid: int, node: int) -> Optional[int]:
            j = first.get(pid)
            if j is None:
                note(b, f"node {node}: parent id {pid} matches no candidate in the request's "
                        "row (the kernel's 'invalid eagle tree' path: it reads past the row, "
                        "and the mask walk writes outside the node's row)")
            return j

        for tid in range(n):
            start = mask_row_start(lens, b, tid, n, mode)
            token_tree_idx = start + (lens[b] if mode == FULL_MASK else 0) + 1
            if token_tree_idx + n > INT32_MAX:
                note(b, f"node {tid}: mask offset {token_tree_idx} overflows the kernel's int")
                continue
            flat[token_tree_idx - 1] = True
            flat[token_tree_idx:token_tree_idx + n - 1] = False
            if tid == 0:
                positions[b * n] = lens[b]
                for i in range(n - 1, 0, -1):
                    r_idx[b, i] = b * n + i
                    g = group_of(i - 1)
                    parent_position = 0
                    if g > 0:
                        pid = parent_id(g, i)
                        j = None if pid is None else lookup(pid, i)
                        if j is None:
                            continue  # unlinked ("the token will be ignored")
                        parent_position = j + 1
                    if r_next[b, parent_position] == -1:
                        r_next[b, parent_position] = i
                    else:
                        r_sib[b, i] = r_next[b, parent_position]
                        r_next[b, parent_position] = i
                r_idx[b, 0] = b * n
                continue
            cur, position, ok = tid - 1, 0, True
            while True:
                position += 1
                if position > n:
                    note(b, f"node {tid}: its ancestor walk never reaches the root (a cycle)")
                    ok = False
                    break
                flat[token_tree_idx + cur] = True
                g = group_of(cur)
                if g == 0:
                    break
                pid = parent_id(g, tid)
                j = None if pid is None else lookup(pid, tid)
                if j is None:
                    ok = False
                    break
                cur = j
            if ok:
                positions[b * n + tid] = position + lens[b]
    return TreeOutputs(mask, positions, r_idx, r_next, r_sib), violations


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
    """Mismatches (one line each, at most 20) between a built tree and the DDTree layout.

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


@dataclass
class GreedyOutputs:
    predicts: torch.Tensor  # [bs * n] int32
    accept_index: torch.Tensor  # [bs, S] int32
    accept_token_num: torch.Tensor  # [bs] int32


def simulate_verify_greedy(candidates, retrieve_index, retrieve_next_token,
                           retrieve_next_sibling, target_predict, num_speculative_tokens: int):
    """A transcription of ``VerifyTreeGreedy`` (eagle.cuh; one thread per request), with the
    caller's initial buffers as SGLang allocates them (predicts 0, accept_index -1). Returns
    (GreedyOutputs, violations). All tensors CPU, [bs, n]."""
    bs, n = candidates.shape
    s = int(num_speculative_tokens)
    cand = candidates.reshape(-1).tolist()
    r_idx = retrieve_index.reshape(-1).tolist()
    r_next = retrieve_next_token.reshape(-1).tolist()
    r_sib = retrieve_next_sibling.reshape(-1).tolist()
    target = target_predict.reshape(-1).tolist()
    predicts = [0] * (bs * n)
    accept_index = [-1] * (bs * s)
    num = [0] * bs
    violations: List[str] = []
    for bx in range(bs):
        last = r_idx[bx * n]
        accept_index[bx * s] = last
        accepted, cur, steps = 0, 0, 0
        for _ in range(1, s):
            cur = r_next[bx * n + cur]
            while cur != -1:
                steps += 1
                if not 0 <= cur < n or steps > n * s:
                    violations.append(f"request {bx}: the walk leaves the request or cycles")
                    cur = -1
                    break
                draft_index = r_idx[bx * n + cur]
                if cand[bx * n + cur] == target[last]:
                    predicts[last] = target[last]
                    accepted += 1
                    accept_index[bx * s + accepted] = draft_index
                    last = draft_index
                    break
                cur = r_sib[bx * n + cur]
            if cur == -1:
                break
        num[bx] = accepted
        predicts[last] = target[last]
    as32 = dict(dtype=torch.int32)
    return GreedyOutputs(torch.tensor(predicts, **as32),
                         torch.tensor(accept_index, **as32).reshape(bs, s),
                         torch.tensor(num, **as32)), violations
