"""NAMED STAND-INS for the GPU kernels on the v2 tree-verify path, in pure torch (CPU).

With ``SGLANG_USE_CPU_ENGINE=1`` SGLang 0.5.23 routes its speculative kernels to the CPU ops of
its ``sgl_kernel`` wheel (``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu``,
``assign_extend_cache_locs_cpu``, ``fill_accept_out_cache_loc_cpu``, ``fill_bonus_tokens_cpu``,
...). That wheel is a compiled build this machine does not have, so these functions stand in
for them. Each one follows the kernel a GPU server runs, not SGLang's CPU or XPU twin:

- ``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu``,
  ``tree_speculative_sampling_target_only``: the CUDA kernels with their host checks, as
  transcribed ONCE in scripts/ddtree_gpu_check/kernel_model.py (the GPU check compares the same
  transcription with SGLang's compiled kernels and host code; see that module for what it
  follows). Host checks raise ``HostCheckError`` exactly where the CUDA host code raises
  (shapes, strides, dtypes, the parent-list width ``topk * (depth - 1) + 1``, the 1024 node
  bound); the kernels index flat memory with the CUDA kernel's strides (not the tensor's),
  raising ``OutOfRangeAccess`` where the CUDA kernel would read or write outside the request's
  row (the tree builder's parent-not-found path) or never stop (its mask loop).
  The XPU Triton twin (``spec_tree.py``) reads the tensor's real row stride and bounds its
  loops by ``depth``, so it accepts inputs the CUDA kernel refuses or mis-reads:
  tests/integration/test_v2_kernel_contract.py runs it in Triton's CPU interpreter to show that.
- the cache-location writers (``assign_extend_cache_locs_cpu``, ``assign_req_to_token_pool_cpu``,
  ``assign_draft_cache_locs_contiguous_cpu``, ``fill_accept_out_cache_loc_cpu``,
  ``fill_bonus_tokens_cpu``): on CUDA SGLang runs Triton kernels for these
  (``cache_locs.py``, ``allocation.py``, ``eagle.py``), and the contract test runs those very
  kernels in the interpreter against these stand-ins.

The host checks skip the device test (the CUDA code demands a GPU tensor; here everything is
on the CPU). tests/integration/test_v2_kernel_contract.py and tests/integration/test_gpu_check_model.py pin every source
line the transcription relies on, in the cached release wheels, so a release that changes the
ABI fails them.

``tree_speculative_sampling_target_only`` has no CPU op in SGLang at all (EAGLE's CPU engine
verifies greedily); the sampling test installs this stand-in in ``eagle_utils`` by name.

This file is also written out as the ``sgl_kernel`` package of the test host (see
``install_as_sgl_kernel``, which puts a copy of the transcription beside it): anything not
defined here resolves to a stand-in that raises when called, like
``sglang_host.write_kernel_standin``.
"""

from __future__ import annotations

import sys
from pathlib import Path


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

# The CUDA kernels and their host checks: the one transcription of this repository,
# scripts/ddtree_gpu_check/kernel_model.py (the GPU check's too). Its folder is put on the path
# from a checkout; a written sgl_kernel package (install_as_sgl_kernel) carries a copy beside
# itself instead.
_SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
if (_SCRIPTS / "ddtree_gpu_check" / "kernel_model.py").is_file() and str(_SCRIPTS) not in sys.path:
    sys.path.insert(0, str(_SCRIPTS))
from ddtree_gpu_check import kernel_model as _km  # noqa: E402

MAX_DRAFT_TOKENS = _km.MAX_DRAFT_TOKENS  # tree.cuh:46
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = _km.FULL_MASK, _km.QLEN_ONLY, _km.QLEN_ONLY_BITPACKING
HostCheckError, OutOfRangeAccess = _km.HostCheckError, _km.OutOfRangeAccess
check_build_tree_host = _km.check_build_tree_host
check_verify_greedy_host = _km.check_verify_greedy_host
check_sampling_host = _km.check_sampling_host
_flat = _km._flat


def build_tree_kernel_efficient_cpu(
    parent_list, selected_index, verified_seq_len, tree_mask, positions, retrieve_index,
    retrieve_next_token, retrieve_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
):
    """The CUDA tree builder (tree.cuh host checks + eagle.cuh build_tree_efficient):
    kernel_model.build_tree_kernel_efficient, raising OutOfRangeAccess at the first fault."""
    _km.build_tree_kernel_efficient(
        parent_list, selected_index, verified_seq_len, tree_mask, positions, retrieve_index,
        retrieve_next_token, retrieve_next_sibling, topk, depth, draft_token_num,
        tree_mask_mode)


def verify_tree_greedy_cpu(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, target_predict,
):
    """The CUDA greedy walk (tree.cuh host checks + eagle.cuh VerifyTreeGreedy):
    kernel_model.verify_tree_greedy, raising OutOfRangeAccess at the first fault."""
    _km.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict)


# The CUDA target-only tree sampling (sampling.cuh host checks + kernel), unchanged name.
tree_speculative_sampling_target_only = _km.tree_speculative_sampling_target_only


# ---------------------------------------------------------------------------------------------
# Cache-location writers: on CUDA these are Triton kernels (compared in the interpreter).


def _request_spans(req_pool_indices, table, start_offset, end_offset, pool_len):
    """(row start in the flat req_to_token table, its end, where in out_cache_loc) for each
    request with end > start, in order, as both writers below walk them; a span outside its
    row of pool_len entries is where the Triton kernel would read or write another row."""
    pos = 0
    for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        if e > s:
            if not (0 <= s and e <= pool_len and (r + 1) * pool_len <= table.numel()):
                raise OutOfRangeAccess(f"req_to_token row {r} [{s}, {e}) outside the table")
            yield r * pool_len + s, r * pool_len + e, pos
            pos += e - s


def assign_extend_cache_locs_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """cache_locs.py assign_extend_cache_locs: out_cache_loc = concat over requests of
    req_to_token[row, start:end] (row stride pool_len)."""
    table = _flat(req_to_token)
    for lo, hi, pos in _request_spans(req_pool_indices, table, start_offset, end_offset, pool_len):
        out_cache_loc[pos: pos + hi - lo] = table[lo:hi].to(out_cache_loc.dtype)


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """allocation.py assign_req_to_token_pool, the inverse: req_to_token[row, start:end] = the
    next end - start entries of out_cache_loc."""
    table = _flat(req_to_token)
    for lo, hi, pos in _request_spans(req_pool_indices, table, start_offset, end_offset, pool_len):
        table[lo:hi] = out_cache_loc[pos: pos + hi - lo].to(table.dtype)


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


vec_size = _km.vec_size


def install_as_sgl_kernel(dest) -> str:
    """Write a ``sgl_kernel`` package under ``dest`` = the generic raising stand-in of
    ddtree_deploy/sandbox/hostenv.py plus the ops above, and beside it the
    ``ddtree_gpu_check.kernel_model`` they wrap; return ``dest`` (for PYTHONPATH)."""
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
    # The transcription they wrap, importable beside the package (same PYTHONPATH entry).
    package = folder / "ddtree_gpu_check"
    package.mkdir(exist_ok=True)
    for name in ("__init__.py", "kernel_model.py"):
        (package / name).write_text((Path(_km.__file__).parent / name).read_text())
    return str(folder)
