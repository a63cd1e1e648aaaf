"""The GPU check's stand-ins held to what they stand for.

- scripts/ddtree_gpu_check/kernel_model.py transcribes SGLang's CUDA tree builder and greedy
  walk (0.5.23 ``sgl_kernel/speculative/eagle.cuh``) and relies on tree.cuh's host code
  (every check before ``if (bs == 0) return;``): the lines it follows are pinned here,
  read from the release wheel, so a release that changes them fails this test.
- The transcription's refusals: a parent id found nowhere, a group outside the request's
  row, a cycle (the kernel would loop forever).
- ddtree.py repeats a few lines of the worker's step (payload/ddtree_worker_v2.py imports
  SGLang); they are pinned to the worker's source.
- csrc/shim/dlpack/dlpack.h (ours) has DLPack's values (compared with a real dlpack.h when
  one is installed: apache-tvm-ffi ships one).
- The tree kernel's JIT flags are SGLang's (kernels/jit/utils/arch.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.release import releases

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from ddtree_gpu_check import ddtree as dd  # noqa: E402
from ddtree_gpu_check import kernel_model as km  # noqa: E402
from ddtree_gpu_check import tree_abi  # noqa: E402

RELEASE = "0.5.23"
JIT = "sglang/kernels/jit/"

# eagle.cuh lines kernel_model.simulate / simulate_verify_greedy follow.
EAGLE_LINES = (
    "token_tree_idx = seq_tree_idx + (seq_len + draft_token_num) * tid + seq_len + 1;",
    "token_tree_idx = draft_token_num * draft_token_num * bid + draft_token_num * tid + 1;",
    "seq_tree_idx += verified_seq_len[i] * draft_token_num;",
    "tree_mask[token_tree_idx - 1] = true;",
    "for (int i = 0; i < draft_token_num - 1; i++) {",
    "tree_mask[token_tree_idx + i] = false;",
    "for (int i = draft_token_num - 1; i > 0; --i) {",
    "int parent_tb_idx = selected_index[bid * (draft_token_num - 1) + i - 1] / topk;",
    "int parent_token_idx = parent_list[bid * (topk * (depth - 1) + 1) + parent_tb_idx];",
    "for (; parent_position < draft_token_num; ++parent_position) {",
    "if (parent_position == draft_token_num) {",
    "retrive_next_token[bid * draft_token_num + parent_position] = i;",
    "retrive_next_sibling[bid * draft_token_num + i] = origin_next_token;",
    "tree_mask[token_tree_idx + cur_position] = true;",
    "int parent_tb_idx = selected_index[bid * (draft_token_num - 1) + cur_position] / topk;",
    "int token_idx = parent_list[bid * (topk * (depth - 1) + 1) + parent_tb_idx];",
    "for (cur_position = 0; cur_position < draft_token_num; ++cur_position) {",
    "positions[bid * draft_token_num + tid] = position + seq_len;",
    # VerifyTreeGreedy
    "IdType2 target_token_id = target_predict[last_accepted_retrive_idx];",
    "accept_index[bx * num_speculative_tokens + num_accepted_tokens] = draft_index;",
    "cur_index = retrive_next_sibling[bx * num_draft_tokens + cur_index];",
    "predicts[last_accepted_retrive_idx] = target_predict[last_accepted_retrive_idx];",
)
TREE_LINES = (
    "CHECK_HOST(draft_token_num > 0 && draft_token_num <= 1024);",
    "CHECK_HOST(depth == 1 || parent_width.unwrap() == topk * (depth - 1) + 1);",
    "auto launch = LaunchKernel(static_cast<uint32_t>(bs), static_cast<uint32_t>(draft_token_num), "
    "device.unwrap());",
)


@pytest.fixture(scope="module")
def sources():
    try:
        wheel = releases.ensure_wheel(RELEASE)
    except DeployError as exc:
        pytest.skip(f"the {RELEASE} wheel is not cached and PyPI is unreachable: {exc.message}")
    paths = [JIT + "include/sgl_kernel/speculative/eagle.cuh", JIT + "csrc/speculative/tree.cuh",
             JIT + "utils/arch.py"]
    found = releases.read_wheel_files(wheel, paths)
    return {Path(p).name: found[p].decode() for p in paths}


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_transcribed_kernel_lines_are_the_release_s(sources):
    eagle, tree = _squash(sources["eagle.cuh"]), _squash(sources["tree.cuh"])
    for line in EAGLE_LINES:
        assert _squash(line) in eagle, line
    for line in TREE_LINES:
        assert _squash(line) in tree, line


@pytest.mark.parametrize("function, early_return", [
    ("build_tree_kernel_efficient", "if (bs == 0) return;"),
    ("verify_tree_greedy", "if (batch_size.unwrap() == 0) return;"),
])
def test_every_host_check_comes_before_the_batch_0_return(sources, function, early_return):
    # tree_abi.host_checks runs SGLang's host code at batch 0 (no launch): that is a full
    # check only while no check follows the early return.
    text = sources["tree.cuh"]
    body = text[text.index(f"inline void {function}("):]
    body = body[:body.index("\n}\n")]
    head, tail = body.split(early_return)
    assert "CHECK_HOST" in head and ".verify(" in head
    assert "CHECK_HOST" not in tail and ".verify(" not in tail and "TensorMatcher" not in tail


def test_our_jit_flags_are_sglang_s(sources):
    arch = sources["arch.py"]
    for flag in ('"-std=c++20"', '"-O3"', '"--expt-relaxed-constexpr"',
                 'f"-DSGL_CUDA_ARCH={self.major * 100 + self.minor * 10}"'):
        assert flag in arch
    assert re.search(r'if major == 9:\s+return "a"', arch)
    cmd = tree_abi.build_command("nvcc", Path("/r"), (9, 0), Path("/o.so"))
    assert ["-std=c++20", "-O3", "--expt-relaxed-constexpr", "-DSGL_CUDA_ARCH=900",
            "-gencode=arch=compute_90a,code=sm_90a"] == cmd[1:6]


def test_the_worker_step_lines_the_check_repeats_are_the_worker_s():
    worker = (dd.payload_dir() / "ddtree_worker_v2.py").read_text()
    for line in dd.WORKER_LINES:
        assert line in worker, (line, "update scripts/ddtree_gpu_check/ddtree.py to the worker")


def test_the_plugin_bounds_are_read_from_its_source():
    c = dd.plugin_constants()
    assert c == {"DEFAULT_BUDGET": 64, "DEFAULT_MAX_TOPK": 8, "MAX_BUDGET": 1024}


def test_our_dlpack_values_are_dlpack_s():
    try:
        import tvm_ffi
    except ImportError:
        pytest.skip("no real dlpack.h here (apache-tvm-ffi not installed)")
    real = (Path(tvm_ffi.__file__).parent / "include" / "dlpack" / "dlpack.h").read_text()
    ours = (tree_abi.SHIM / "dlpack" / "dlpack.h").read_text()
    pair = re.compile(r"^\s*(kDL\w+) = (\d+)U?,", re.M)
    mine = dict(pair.findall(ours))
    theirs = dict(pair.findall(real))
    assert mine and all(theirs[k] == v for k, v in mine.items()), (mine, theirs)
    for struct in ("DLDevice", "DLDataType", "DLTensor"):
        fields = lambda text: re.findall(  # noqa: E731
            r"^\s+([\w ]+?\**)\s*(\w+);", text.split(f"}} {struct};")[0].rsplit("typedef", 1)[1],
            re.M)
        assert fields(ours) and fields(ours) == fields(real), struct


# ---------------------------------------------------------------------------------------------
# The transcription's refusals


def _buffers(seq, n, mode=km.FULL_MASK):
    return torch.ones(km.used_mask_cells(seq, n, mode) + 16, dtype=torch.uint8)


def test_a_known_tree_and_its_walk():
    # root -> {1, 2}, 1 -> {3}: candidate ids 0, 1, 2; group 1's parent id 0 (node 1).
    pl, sel, seq = torch.tensor([[-1, 0, 1, -1, -1]]), torch.tensor([[0, 1, 2]]), [5]
    out, v = km.simulate(pl, sel, torch.tensor(seq), 2, 3, 4, km.FULL_MASK, _buffers(seq, 4))
    assert not v
    assert out.retrieve_next_token.tolist() == [[1, 3, -1, -1]]
    assert out.retrieve_next_sibling.tolist() == [[-1, 2, -1, -1]]
    assert out.positions.tolist() == [5, 6, 6, 7]
    rows = out.tree_mask[: 4 * 9].view(4, 9)[:, 5:].bool().tolist()
    assert rows == [[True, False, False, False], [True, True, False, False],
                    [True, False, True, False], [True, True, False, True]]
    walk, v = km.simulate_verify_greedy(torch.tensor([[9, 10, 11, 12]]), out.retrieve_index,
                                        out.retrieve_next_token, out.retrieve_next_sibling,
                                        torch.tensor([[10, 12, 0, 42]]), 4)
    assert not v and walk.accept_index.tolist() == [[0, 1, 3, -1]]


def test_a_parent_found_nowhere_a_group_outside_the_row_and_a_cycle_are_refused():
    seq = [3]
    lost = km.simulate(torch.tensor([[-1, 99, -1, -1, -1]]), torch.tensor([[0, 1, 2]]),
                       torch.tensor(seq), 2, 3, 4, km.FULL_MASK, _buffers(seq, 4))[1]
    assert any("matches no candidate" in x for x in lost)
    # depth 1: the kernel's parent_list row stride is 1, so group 1 is another row's entry.
    outside = km.simulate(torch.tensor([[-1, 0]]), torch.tensor([[0, 2]]), torch.tensor(seq),
                          2, 1, 3, km.FULL_MASK, _buffers(seq, 3))[1]
    assert any("outside the request's row" in x for x in outside)
    # node 1 (id 2, group 1) has parent id 2: itself.
    cycle = km.simulate(torch.tensor([[-1, 2, -1]]), torch.tensor([[2]]), torch.tensor(seq),
                        2, 2, 2, km.FULL_MASK, _buffers(seq, 2))[1]
    assert any("never reaches the root" in x for x in cycle)


def test_qlen_only_rows_are_n_wide():
    pl, sel, seq = torch.tensor([[-1, 0, 1, -1, -1]]), torch.tensor([[0, 1, 2]]), [5]
    out, v = km.simulate(pl, sel, torch.tensor(seq), 2, 3, 4, km.QLEN_ONLY,
                         _buffers(seq, 4, km.QLEN_ONLY))
    assert not v and out.tree_mask[:16].view(4, 4).bool().tolist()[3] == [True, True, False,
                                                                          True]
