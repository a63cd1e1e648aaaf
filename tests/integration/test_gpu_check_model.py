"""The GPU check's stand-ins held to what they stand for.

- scripts/ddtree_gpu_check/kernel_model.py is the one transcription of SGLang's CUDA tree
  builder and greedy walk (0.5.23 ``sgl_kernel/speculative/eagle.cuh``) and of tree.cuh's host
  code (every check before ``if (bs == 0) return;``), used by the GPU check and wrapped by the
  CPU suite's stand-ins (tests/v2_kernel_standins.py): the lines it follows are pinned here,
  read from the release wheel, so a release that changes them fails this test (and
  tests/integration/test_v2_kernel_contract.py pins the stand-ins' view of the same lines).
- The transcription's faults: a parent id found nowhere, a group outside the request's row, a
  cycle (the kernel would loop forever), a sibling cycle in the walk; raised for the stand-ins,
  recorded for the GPU check; C integer semantics.
- The check runs the payload's own worker, plugin and hybrid modules (real_payload: named
  stand-ins for the SGLang they import); a worker defect fails it.
- The batch-0 host check describes a size-1 batch's stride as SGLang's matcher treats it.
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
from ddtree_testkit import payload

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from ddtree_gpu_check import checks_tree  # noqa: E402
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


def test_the_check_runs_the_payloads_own_worker_plugin_and_hybrid():
    # No repeated worker lines: the check imports the payload files themselves (real_payload,
    # under their installed names) and takes the verify arguments from the worker's own call.
    mods = dd.real()
    for name in ("ddtree_worker_v2", "ddtree_v2_plugin", "ddtree_hybrid", "ddtree_schedule"):
        assert Path(getattr(mods, name).__file__) == dd.payload_dir() / f"{name}.py", name
    dl = payload("ddtree_lineage")

    for cfg in dd.configs(small=True):
        inputs = dd.make_inputs(cfg, torch.device("cpu"), vocab=64, hidden=16, seed=1)
        call = dd.worker_call(inputs, cfg)
        assert (call["topk"], call["depth"], call["n"]) == (
            cfg.topk, dl.lineage_depth(cfg.budget, cfg.topk, cfg.drafted), cfg.n), cfg
        assert call["parent_list"].shape == (cfg.batch, cfg.topk * (call["depth"] - 1) + 1), cfg


def test_a_worker_defect_fails_the_check(tmp_path):
    # What the issue found: every worker defect passed the check that repeated the worker's
    # lines. With the worker imported, a verify call one lineage level short (the old depth-L
    # width, mutant W01) fails the tree check in its CPU path (the transcription's guard).
    import shutil

    copy = tmp_path / "payload"
    shutil.copytree(dd.payload_dir(), copy)
    worker = copy / "ddtree_worker_v2.py"
    line = "num_steps = lineage_depth(state.budget, k, int(tokens.shape[1]))\n"
    text = worker.read_text()
    assert text.count(line) == 1
    worker.write_text(text.replace(line, "num_steps = int(tokens.shape[1])\n"))
    from ddtree_gpu_check import real_payload

    cfg = dd.configs(small=True)[1]  # budget 256: lineage depth 33, draft depth 15
    ctx = checks_tree.Context(torch.device("cpu"), None, "not built here", None, None)
    try:
        mutated = real_payload.load(copy)
        ctx.utils, ctx.lineage = mutated.ddtree_utils, mutated.ddtree_lineage
        report = _Report()
        real = dd.real
        dd.real = lambda: mutated
        try:
            checks_tree.check_config(report, ctx, cfg, seed=1)
        finally:
            dd.real = real
    finally:
        real_payload.load(dd.payload_dir())  # the checkout's payload again
    (status, name, detail), = report.records
    assert status == "FAIL", detail
    assert "host check" in detail, detail


class _Report:
    def __init__(self):
        self.records = []

    def record(self, status, name, detail=""):
        self.records.append((status, name, detail))
        return status == "PASS"


def test_the_plugin_bounds_are_read_from_its_source():
    dl = payload("ddtree_lineage")

    c = dd.plugin_constants()
    assert c == {"DEFAULT_BUDGET": 64, "DEFAULT_MAX_TOPK": 8, "MAX_BUDGET": 1023}
    assert c["MAX_BUDGET"] + 1 == dl.MAX_VERIFY_WIDTH == km.MAX_DRAFT_TOKENS


def test_the_configurations_are_accepted_and_the_refused_ones_named_refused():
    dl = payload("ddtree_lineage")

    accepted = dd.configs()
    for cfg in accepted:
        assert dd.plugin_problem(dl, cfg) is None, cfg
    carried = {(c.budget, c.topk, c.block) for c in accepted}
    for cfg in dd.refused_configs():
        line = dd.plugin_problem(dl, cfg)
        assert line is not None and line == dl.abi_problem(cfg.budget, cfg.topk, cfg.block)
        # Its suggestion is a configuration the tree checks carry.
        assert checks_tree._suggestion(line) in carried, line
    # The depth is raised past the draft's where the budget needs it, and never past B.
    depths = {cfg.label: dl.lineage_depth(cfg.budget, cfg.topk, cfg.block - 1) for cfg in accepted}
    assert depths["the plugin's largest budget (depth 129)"] == 129
    assert depths["top-K 2, block 3: the draft's 6 prefixes (depth 4)"] == 4
    assert all(c.block - 1 <= depths[c.label] <= c.budget for c in accepted)


def test_a_size_1_batch_is_described_to_the_batch_0_host_check_as_sglang_sees_it():
    # The worker's top_scores_index at batch 1: a [1, n - 1] slice of an [1, n] row, which
    # torch calls contiguous and SGLang's TensorMatcher accepts (a size-1 dimension's stride is
    # skipped). Described at batch 0 the stride would be checked: it is given as contiguous.
    row = torch.arange(1024).view(1, 1024)[:, 1:].contiguous()
    assert row.stride() == (1024, 1)
    desc = tree_abi.describe(row, zero_dim0=True)
    assert (desc.shape[0], desc.shape[1], desc.strides[0], desc.strides[1]) == (0, 1023, 1023, 1)
    wide = torch.arange(2048).view(2, 1024)[:, 1:]  # batch 2: the real stride is checked
    desc = tree_abi.describe(wide, zero_dim0=True)
    assert (desc.shape[0], desc.strides[0]) == (0, 1024)
    assert tree_abi.describe(row).strides[0] == 1024  # a launch describes it as it is


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


# ---------------------------------------------------------------------------------------------
# One transcription: the CPU stand-ins are kernel_model's


def test_the_cpu_standins_wrap_this_transcription(tmp_path):
    import v2_kernel_standins as ks

    assert ks.HostCheckError is km.HostCheckError and ks.OutOfRangeAccess is km.OutOfRangeAccess
    assert ks.check_build_tree_host is km.check_build_tree_host
    assert ks.check_verify_greedy_host is km.check_verify_greedy_host
    assert ks.tree_speculative_sampling_target_only is km.tree_speculative_sampling_target_only
    # The builder and the walk: the same outputs as simulate on the known tree.
    pl, sel, seq = torch.tensor([[-1, 0, 1, -1, -1]]), torch.tensor([[0, 1, 2]]), [5]
    want, _ = km.simulate(pl, sel, torch.tensor(seq), 2, 3, 4, km.FULL_MASK, _buffers(seq, 4))
    mask, pos, r = _buffers(seq, 4), torch.full((4,), -1), torch.full((3, 1, 4), -1)
    ks.build_tree_kernel_efficient_cpu(pl, sel, torch.tensor(seq), mask, pos, r[0], r[1], r[2],
                                       2, 3, 4, km.FULL_MASK)
    assert torch.equal(mask, want.tree_mask) and torch.equal(pos, want.positions)
    assert torch.equal(r[1], want.retrieve_next_token)
    # The sgl_kernel package written for SGLang's host processes carries this very file.
    folder = Path(ks.install_as_sgl_kernel(tmp_path))
    copy = folder / "ddtree_gpu_check" / "kernel_model.py"
    assert copy.read_bytes() == Path(km.__file__).read_bytes()
    assert "def build_tree_efficient" not in (folder / "sgl_kernel" / "__init__.py").read_text()


def test_faults_are_raised_for_the_standins_and_recorded_for_the_check():
    seq = [3]
    args = (torch.tensor([[-1, 99, -1, -1, -1]]), torch.tensor([[0, 1, 2]]), torch.tensor(seq))
    recorded = km.simulate(*args, 2, 3, 4, km.FULL_MASK, _buffers(seq, 4))[1]
    # node 2 (link) and node 3 (mask walk) both look up group 1's lost parent id
    assert len(recorded) == 2 and all("parent-not-found" in x for x in recorded), recorded
    mask, pos, r = _buffers(seq, 4), torch.full((4,), -1), torch.full((3, 1, 4), -1)
    with pytest.raises(km.OutOfRangeAccess, match="matches no candidate"):
        km.build_tree_kernel_efficient(*args, mask, pos, r[0], r[1], r[2], 2, 3, 4,
                                       km.FULL_MASK)


def test_c_integer_semantics_a_negative_candidate_id_is_a_root_child():
    # selected_index / topk in C truncates toward zero: id -1 is group 0 (the root), where
    # Python's floor division would give group -1 (another request's parent_list entry).
    assert km._c_div(-1, 8) == 0 and km._c_div(-9, 8) == -1 and km._as_int32(2**32 + 5) == 5
    seq = [2]
    out, faults = km.simulate(torch.tensor([[-1, -1, -1]]), torch.tensor([[0, -1]]),
                              torch.tensor(seq), 2, 2, 3, km.FULL_MASK, _buffers(seq, 3))
    assert not faults and out.retrieve_next_token.tolist() == [[1, -1, -1]]
    assert out.retrieve_next_sibling.tolist() == [[-1, 2, -1]]  # both under the root
    assert out.positions.tolist() == [2, 3, 3]


def test_a_sibling_cycle_in_the_greedy_walk_is_a_fault_not_a_hang():
    cand = torch.tensor([[9, 10, 11]])
    r_idx, r_next = torch.tensor([[0, 1, 2]]), torch.tensor([[1, -1, -1]])
    r_sib = torch.tensor([[-1, 2, 1]])  # 1 -> 2 -> 1 -> ...
    target = torch.tensor([[42, 0, 0]])  # matches no child: the walk keeps trying siblings
    _, faults = km.simulate_verify_greedy(cand, r_idx, r_next, r_sib, target, 3)
    assert faults and "never ends" in faults[0]
    with pytest.raises(km.OutOfRangeAccess, match="never ends"):
        km.verify_tree_greedy(torch.zeros(3, dtype=torch.int32),
                              torch.full((1, 3), -1, dtype=torch.int32),
                              torch.zeros(1, dtype=torch.int32), cand, r_idx, r_next, r_sib,
                              target)
