"""The kernel stand-ins held to SGLang's real kernels, read from the cached release wheels.

1. Pins: every CUDA source line the NAMED STAND-INS of tests/v2_kernel_standins.py rely on
   (they wrap the repository's one transcription of these kernels,
   scripts/ddtree_gpu_check/kernel_model.py, which the GPU check compares with the compiled
   kernels: host checks, row strides, the parent-not-found path, the unbounded mask loop, the
   sampling walk's mass accumulation), and the Python lines that route a CUDA server to those kernels
   and size what EAGLE hands them, must be in each release of the v2 family (0.5.21 - 0.5.23
   ship the JIT sources; 0.5.20 routes the same ops to sgl-kernel 0.4.7, whose compiled wheel
   carries no sources: its ``csrc/speculative/eagle_utils.cu`` has the same kernel with no
   host check, see docs/patches-v2.md). 0.5.19, 0.5.18, 0.5.17 and 0.5.16 (families
   sglang-0.5.19, sglang-0.5.18, sglang-0.5.17, sglang-0.5.16) ship no tree kernel source
   either: they route to the compiled sgl-kernel (0.4.6.post1; 0.5.17 and 0.5.16: 0.4.5), so
   only their Python lines and their route are pinned; so do 0.5.14, 0.5.15 and 0.5.15.post1
   (sgl-kernel 0.4.4; the compaction line in EAGLEWorkerV2 there, PIN_HOMES; families
   sglang-0.5.14, sglang-0.5.15). A release that changes
   one fails here, naming it.
2. SGLang's Triton kernels, run in Triton's CPU interpreter (``TRITON_INTERPRET=1``), loaded
   from the 0.5.23 wheel's own files (nothing copied into this repository), in a process of
   their own (tests/v2_triton_twins.py):
   - the tree builder's XPU twin builds the same tree as the CUDA stand-in from the worker's
     lineage, and ACCEPTS what the CUDA host check refuses (the B + 2 wide parent list the
     worker used to hand it) and silently skips a node the CUDA kernel would read out of its
     row for: the stand-in cannot be the Triton kernel;
   - the greedy walk's XPU twin agrees with the CUDA stand-in;
   - the cache-location writers, which ARE Triton kernels on a CUDA server, agree with the
     stand-ins on random inputs.
"""

from __future__ import annotations

import os
import re
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent


JIT = "sglang/kernels/jit"
TREE_HOST = f"{JIT}/csrc/speculative/tree.cuh"
TREE_KERNEL = f"{JIT}/include/sgl_kernel/speculative/eagle.cuh"
SAMPLING_HOST = f"{JIT}/csrc/speculative/sampling.cuh"
SAMPLING_KERNEL = f"{JIT}/include/sgl_kernel/speculative/sampling.cuh"
TENSOR_MATCHER = f"{JIT}/include/sgl_kernel/tensor.h"
SPEC_TREE = "sglang/kernels/ops/speculative/spec_tree.py"
EAGLE_UTILS = "sglang/srt/speculative/eagle_utils.py"
EAGLE_INFO = "sglang/srt/speculative/eagle_info.py"
EAGLE_COMMON = "sglang/srt/speculative/eagle_worker_common.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
# Where a pinned line lives in releases that moved it: 0.5.14 - 0.5.15.post1 have no
# eagle_worker_common.py; the compaction is EAGLEWorkerV2._compact_accept_to_front there.
PIN_HOMES = {version: {EAGLE_COMMON: EAGLE_V2} for version in ("0.5.14", "0.5.15", "0.5.15.post1")}

# (file, line the stand-in relies on, what for). Whitespace-normalised substring matches.
JIT_PINS = [
    (TREE_HOST, "CHECK_HOST(draft_token_num > 0 && draft_token_num <= 1024);",
     "MAX_DRAFT_TOKENS: verify width <= 1024"),
    (TREE_HOST, ".with_strides({parent_list.size(1) == 0 ? -1 : parent_list.size(1), 1})",
     "parent_list rows contiguous"),
    (TREE_HOST, "CHECK_HOST(depth == 1 || parent_width.unwrap() == topk * (depth - 1) + 1);",
     "the parent-list width"),
    (TREE_HOST, ".with_strides({draft_token_num == 1 ? -1 : draft_token_num - 1, 1})",
     "selected_index [bs, n - 1] contiguous"),
    (TREE_HOST, "min_mask_bytes = bs * draft_token_num * draft_token_num;", "QLEN_ONLY mask bound"),
    (TREE_HOST, "TensorMatcher({-1}).with_device(device).verify(tree_mask);",
     "the mask: 1-D, contiguous, any element type"),
    (TREE_HOST, "CHECK_HOST(tree_mask.numel() * mask_elem_bytes >= min_mask_bytes);",
     "the mask: a lower bound on its bytes"),
    (TREE_HOST, "TensorMatcher({batch_size, spec_tokens}).with_dtype<int32_t>().with_device(device).verify(accept_index);",
     "greedy accept_index int32"),
    (TREE_HOST, "TensorMatcher({batch_size}).with_dtype<int32_t>().with_device(device).verify(accept_token_num);",
     "greedy accept_token_num int32"),
    (TENSOR_MATCHER, 'RuntimeCheck(view.is_contiguous(), "Tensor is not contiguous as expected");',
     "no strides given: contiguous"),
    (TREE_KERNEL, "int parent_token_idx = parent_list[bid * (topk * (depth - 1) + 1) + parent_tb_idx];",
     "the kernel's parent-list row stride (links)"),
    (TREE_KERNEL, "int token_idx = parent_list[bid * (topk * (depth - 1) + 1) + parent_tb_idx];",
     "the kernel's parent-list row stride (mask)"),
    (TREE_KERNEL, "for (; parent_position < draft_token_num; ++parent_position) {",
     "the parent scan reads one entry past the row"),
    (TREE_KERNEL, "Detected a token with no parent token selected.", "parent-not-found path"),
    (TREE_KERNEL, "for (cur_position = 0; cur_position < draft_token_num; ++cur_position) {",
     "the mask walk's scan"),
    (TREE_KERNEL, "while (true) {", "the mask walk has no depth bound"),
    (TREE_KERNEL, "int parent_tb_idx = selected_index[bid * (draft_token_num - 1) + i - 1] / topk;",
     "group = candidate id // topk"),
    (TREE_KERNEL, "IdType2 target_token_id = target_predict[last_accepted_retrive_idx];",
     "greedy target read by flat retrieve index"),
    (SAMPLING_HOST, "TensorMatcher({batch_size, draft_tokens}).with_dtype<float>().with_device(device).verify(uniform_samples);",
     "coins float32 [bs, n]"),
    (SAMPLING_HOST, ".verify(target_probs)", "target_probs float32 [bs, n, V]"),
    (SAMPLING_HOST, "CHECK_HOST(threshold_acc >= 0 && threshold_acc <= 1);", "thresholds"),
    (SAMPLING_KERNEL, "prob_acc += target_prob_single;", "a twin's mass counts twice"),
    (SAMPLING_KERNEL, "if (has_target_mass && (coin < prob_acc / threshold_acc || target_prob_single >= threshold_single)) {",
     "the accept rule"),
    (SAMPLING_KERNEL, "draft_probs[cur_prob_offset + draft_token_id] = target_probs[cur_prob_offset + draft_token_id];",
     "a rejected token leaves the residual"),
    (SAMPLING_KERNEL, "if (num_accepted_tokens != num_speculative_tokens - 1) {",
     "no residual at the depth limit"),
]
# The Python side, in every release of the family (0.5.20 - 0.5.23).
PY_PINS = [
    (EAGLE_INFO, "return self.spec_steps + 1", "accept_index width = depth + 1"),
    (EAGLE_UTILS, "(bs, verify_input.max_tree_depth), -1, dtype=torch.int32", "accept_index int32"),
    (EAGLE_UTILS, "predict = torch.zeros(predict_shape, dtype=torch.int32, device=device).flatten()",
     "predicts int32"),
    (EAGLE_UTILS, "(3, bs, num_verify_tokens), -1, device=device, dtype=torch.long",
     "retrieve arrays int64 [bs, n], contiguous"),
    (EAGLE_COMMON, "out.view(bs, nd, *x.shape[1:])[:, :s1] = gathered.view(bs, s1, *x.shape[1:])",
     "depth + 1 <= n"),
]
# Where a CUDA server's tree build comes from: the JIT kernel (0.5.21+) or sgl-kernel (0.5.20).
ROUTES = {
    "0.5.14": (EAGLE_UTILS, "if _is_cuda or _is_hip or _is_musa:\n    from sgl_kernel import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.15": (EAGLE_UTILS, "if _is_cuda or _is_hip or _is_musa:\n    from sgl_kernel import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.15.post1": (EAGLE_UTILS, "if _is_cuda or _is_hip or _is_musa:\n    from sgl_kernel import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.16": (EAGLE_UTILS, "if _is_cuda or _is_hip or _is_musa:\n    from sgl_kernel import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.17": (EAGLE_UTILS, "if _is_cuda or _is_hip or _is_musa:\n    from sgl_kernel import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.18": (EAGLE_UTILS, "if _is_cuda or _is_hip or _is_musa:\n    from sgl_kernel import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.19": (EAGLE_UTILS, "if _is_cuda or _is_hip or _is_musa:\n    from sgl_kernel import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.20": (EAGLE_UTILS, "from sgl_kernel import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.21": (EAGLE_UTILS, "from sglang.kernels.ops.speculative.tree import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.22": (EAGLE_UTILS, "from sglang.kernels.ops.speculative.tree import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
    "0.5.23": (SPEC_TREE, "from sglang.kernels.ops.speculative.tree import (\n        build_tree_kernel_efficient as sgl_build_tree_kernel_efficient,"),
}
# Line numbers the docs cite (0.5.23).
CITED = {(TREE_HOST, 46), (TREE_HOST, 53), (TREE_KERNEL, 81), (TREE_KERNEL, 115)}


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _wheel_text(version: str, path: str) -> str:
    from ddtree_deploy.sandbox import release_wheel

    with zipfile.ZipFile(release_wheel(version)) as zf:
        return zf.read(path).decode()


@pytest.mark.parametrize("version", ["0.5.21", "0.5.22", "0.5.23"])
def test_the_cuda_lines_the_standins_transcribe_are_in_the_release(version):
    missing = []
    for path, line, why in JIT_PINS:
        if _norm(line) not in _norm(_wheel_text(version, path)):
            missing.append(f"{path}: {line!r} ({why})")
    assert not missing, f"sglang {version} changed what the CUDA stand-ins rely on:\n" + "\n".join(missing)


@pytest.mark.parametrize("version", list(ROUTES))
def test_the_python_lines_and_the_cuda_route_are_in_the_release(version):
    homes = PIN_HOMES.get(version, {})
    missing = [f"{path}: {line!r} ({why})" for path, line, why in PY_PINS
               if _norm(line) not in _norm(_wheel_text(version, homes.get(path, path)))]
    path, route = ROUTES[version]
    if _norm(route) not in _norm(_wheel_text(version, path)):
        missing.append(f"{path}: the CUDA route {route!r}")
    assert not missing, f"sglang {version} changed:\n" + "\n".join(missing)


def test_the_cited_line_numbers():
    text = {p: _wheel_text("0.5.23", p).splitlines() for p, _ in CITED}
    assert "draft_token_num <= 1024" in text[TREE_HOST][46 - 1]
    assert "topk * (depth - 1) + 1" in text[TREE_HOST][53 - 1]
    assert "parent_list[bid * (topk * (depth - 1) + 1)" in text[TREE_KERNEL][81 - 1]
    assert "parent_list[bid * (topk * (depth - 1) + 1)" in text[TREE_KERNEL][115 - 1]


def test_0_5_20_runs_sgl_kernel_0_4_7():
    meta = _wheel_text("0.5.20", "sglang-0.5.20.dist-info/METADATA")
    assert "Requires-Dist: sglang-kernel==0.4.7" in meta
    # ...and has no JIT tree kernel of its own (the compiled sgl-kernel runs instead).
    from ddtree_deploy.sandbox import release_wheel

    with zipfile.ZipFile(release_wheel("0.5.20")) as zf:
        assert TREE_HOST not in zf.namelist()


@pytest.mark.parametrize("version,kernel", [("0.5.14", "0.4.4"), ("0.5.15", "0.4.4"),
                                            ("0.5.15.post1", "0.4.4"), ("0.5.16", "0.4.5"),
                                            ("0.5.17", "0.4.5"),
                                            ("0.5.18", "0.4.6.post1"), ("0.5.19", "0.4.6.post1")])
def test_releases_without_a_tree_kernel_source_run_the_compiled_sgl_kernel(version, kernel):
    # Nothing of the CUDA tree builder or walks to pin in these wheels: the compiled
    # sgl-kernel (a binary wheel) runs them on a CUDA host.
    meta = _wheel_text(version, f"sglang-{version}.dist-info/METADATA")
    assert f"Requires-Dist: sglang-kernel=={kernel}" in meta
    from ddtree_deploy.sandbox import release_wheel

    with zipfile.ZipFile(release_wheel(version)) as zf:
        names = zf.namelist()
    assert not [n for n in names if n.endswith(("speculative/tree.cuh", "speculative/eagle.cuh"))]


# ---------------------------------------------------------------------------------------------
# SGLang's Triton kernels in the CPU interpreter (tests/v2_triton_twins.py, in a process of its
# own: TRITON_INTERPRET must be set before triton is first imported)


@pytest.fixture(scope="module")
def twins() -> dict:
    import json
    import subprocess

    pytest.importorskip("triton")
    import v2_triton_twins as probe

    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, str(REPO / "tests" / "v2_triton_twins.py"), *probe.CASES],
                         capture_output=True, text=True, timeout=900, env=env)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(probe.TAG)]
    assert run.returncode == 0 and lines, run.stdout[-2000:] + run.stderr[-4000:]
    return json.loads(lines[-1][len(probe.TAG):])


@pytest.mark.parametrize("case", __import__("v2_triton_twins").CASES)
def test_sglang_triton_kernel_against_the_standin(twins, case):
    assert twins[case] == "ok", f"{case}:\n{twins[case]}"
