"""`make gpu-check-dry`: the GPU check (scripts/gpu_check.py, scripts/ddtree_gpu_check/) run
on CPU, as CI runs it.

One dry run per session (under a minute here: nvcc building SGLang's speculative/tree.cuh from
the 0.5.23 wheel with our host wrapper, the hybrid recurrent kernels in Triton's interpreter):
SGLang's files extracted from the cached wheel into a carried folder, every check's CPU path,
the CUDA-only checks reported SKIP by name, and the size of what would travel to the GPU
machine. The tests read its JSON report and its output.

What the GPU run proves that this cannot (SGLang's kernels executing on CUDA, the
sync-free step, CUDA-graph replay, timings, the hybrid kernels in bf16 at budgets 64 and 256)
is listed in docs/gpu-checks.md; on CPU the tree kernel is represented by our transcription of
it (scripts/ddtree_gpu_check/kernel_model.py, pinned to the kernel's lines by
tests/integration/test_gpu_check_model.py) and SGLang's host checks run as compiled, at batch 0 (tree.cuh
returns before any launch), beside their transcription.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.release import releases

REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.py"
RELEASE = "0.5.23"
sys.path.insert(0, str(REPO / "scripts"))

from ddtree_gpu_check.tree_abi import find_nvcc  # noqa: E402

HAVE_NVCC = find_nvcc() is not None


def _hybrid_script():
    from ddtree_gpu_check import carry

    return carry.hybrid_script()


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return releases.ensure_wheel(RELEASE)
    except DeployError as exc:  # offline with an empty cache
        pytest.skip(f"the {RELEASE} wheel is not cached and PyPI is unreachable: {exc.message}")


def _run(args, **kw):
    env = {**os.environ, "PYTHONPATH": ""}  # the check finds its own modules
    env.pop("OUT", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=600, **kw)


@pytest.fixture(scope="module")
def dry(wheel, tmp_path_factory):
    """(process, report, carry folder) of one `gpu_check.py --dry-run --prepare`."""
    root = tmp_path_factory.mktemp("gpu-check")
    carry, out, build = root / "carry", root / "out", root / "build"
    run = _run(["--dry-run", "--prepare", "--carry", str(carry), "--out", str(out),
                "--build-dir", str(build)])
    report = json.loads((out / "gpu-check.json").read_text())
    return run, report, carry


def _results(report, status=None):
    return [r for r in report["results"] if status is None or r["status"] == status]


def _named(report, prefix):
    return [r for r in report["results"] if r["check"].startswith(prefix)]


def test_the_make_targets_run_the_script():
    make = (REPO / "Makefile").read_text()
    assert re.search(r"^gpu-check:\n\ttimeout 540 \$\(GPU_PYTHON\) scripts/gpu_check.py "
                     r"--carry \$\(GPU_CARRY\)$", make, re.M)
    assert re.search(r"^gpu-check-dry: install\n\t\$\(PY\) scripts/gpu_check.py --dry-run "
                     r"--prepare --carry \$\(GPU_CARRY\)$", make, re.M)
    assert "GPU_CARRY ?= .gpu-carry/gpu-check" in make
    # The carried folder and the build folder never travel as tracked files.
    ignored = subprocess.run(["git", "check-ignore", ".gpu-carry/gpu-check/x", "build/gpu-check/x"],
                             cwd=REPO, capture_output=True, text=True).stdout.split()
    assert ignored == [".gpu-carry/gpu-check/x", "build/gpu-check/x"]


def test_the_summary_and_exit_code_follow_the_results(dry):
    run, report, _ = dry
    counts = report["counts"]
    lines = run.stdout.strip().splitlines()
    assert lines[-1] == (f"gpu-check: {counts['PASS']} passed, {counts['FAIL']} failed, "
                         f"{counts['SKIP']} skipped"), run.stdout[-2000:]
    assert run.returncode == (1 if counts["FAIL"] else 0), run.stderr[-3000:]
    # One line per check, in the order of the report.
    shown = [line.split("  ")[1] for line in lines
             if line.startswith(("PASS  ", "FAIL  ", "SKIP  "))]
    assert shown == [r["check"] for r in report["results"]]


def test_sglang_files_come_from_the_wheel_with_our_shim_for_tvm_ffi(dry, wheel):
    _, report, carry = dry
    manifest = json.loads((carry / f"sglang-{RELEASE}" / "MANIFEST.json").read_text())
    files = manifest["files"]
    assert "sglang/kernels/jit/csrc/speculative/tree.cuh" in files
    assert "sglang/kernels/jit/include/sgl_kernel/speculative/eagle.cuh" in files
    assert "sglang/kernels/jit/include/sgl_kernel/tensor.h" in files
    assert "sglang/kernels/ops/attention/extend_attention.py" in files
    # Exactly what tvm-ffi would have provided is ours; nothing else is missing.
    assert manifest["shimmed_includes"] == ["dlpack/dlpack.h", "tvm/ffi/container/tensor.h",
                                            "tvm/ffi/dtype.h", "tvm/ffi/extra/c_env_api.h"]
    assert set(manifest["standin_modules"]) == {"sglang.srt.environ", "sglang.srt.utils"}
    # The hybrid check's kernel files, exactly the ones scripts/gpu_check_hybrid.py loads.
    hybrid = _hybrid_script()
    assert manifest["hybrid_files"] == [c[0] for c in hybrid.KERNEL_FILES.values()]
    assert set(manifest["hybrid_files"]) <= set(files)
    assert {m: set(n) for m, n in manifest["hybrid_standin_modules"].items()} == hybrid.STUBBED
    found = releases.read_wheel_files(wheel, list(files))
    for path in files:
        assert (carry / f"sglang-{RELEASE}" / path).read_bytes() == found[path]
    assert _named(report, "SGLang 0.5.23 files carried")[0]["status"] == "PASS"


def test_what_travels_is_measured_and_under_64_mib(dry):
    _, report, carry = dry
    travel = report["info"]["travel"]
    assert travel["limit_bytes"] == 64 * 1024 * 1024
    assert travel["total_bytes"] < travel["limit_bytes"]
    carried = travel["carry"][str(carry)]
    on_disk = sum(p.stat().st_size for p in carry.rglob("*") if p.is_file())
    assert carried["bytes"] == on_disk and carried["files"] > 10
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True,
                             text=True).stdout.split()
    assert travel["tree_files"] >= len([p for p in tracked if (REPO / p).is_file()])
    assert travel["total_bytes"] == travel["tree_bytes"] + carried["bytes"]
    assert _named(report, "what travels")[0]["status"] == "PASS"


def test_cuda_only_parts_are_skipped_by_name(dry):
    _, report, _ = dry
    skipped = {r["check"]: r["detail"] for r in _results(report, "SKIP")}
    for name in ("DDTree step without a host sync",
                 "DDTree step captured in a CUDA graph, replayed == eager",
                 "per-step timings, batch 1..64 x budget 16..256"):
        assert name in skipped and "CUDA only" in skipped[name]
    # Nothing else is skipped where nvcc is present (this machine's kind has nvcc 13).
    if HAVE_NVCC:
        assert len(skipped) == 3, skipped


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc on this machine")
def test_sglang_tree_cuh_builds_and_its_host_checks_run_on_cpu(dry):
    _, report, _ = dry
    build = _named(report, "SGLang's speculative/tree.cuh built with nvcc")[0]
    assert build["status"] == "PASS" and "sm_90a" in build["detail"], build
    known = _named(report, "known-answer tree")[0]
    assert known["status"] == "PASS", known
    assert "refuse a wrong parent_list width" in known["detail"]


def test_every_check_passes(dry):
    # The worker's lineage passes SGLang's compiled host checks and their transcription, and
    # the transcribed kernel builds the DDTree layout from it, for every configuration.
    _, report, _ = dry
    failed = [r["check"] + ": " + r["detail"][:300] for r in _results(report, "FAIL")]
    assert not failed, failed
    attention = _named(report, "Triton extend attention")
    assert attention and all(r["status"] == "PASS" for r in attention)


def test_every_configuration_is_checked(dry):
    _, report, _ = dry
    tree = _named(report, "tree kernel + lineage vs DDTree: ")
    labels = [r["check"].split(": ", 1)[1] for r in tree]
    for label in ("default (budget 64, top-K 8, block 16", "budget 256 (depth 33) (budget 256",
                  "the plugin's largest budget (depth 129) (budget 1023, top-K 8",
                  "budget 1 (depth 1) (budget 1, top-K 1, block 2",
                  "top-K 1: the chain of the draft's depth (budget 15, top-K 1, block 16",
                  "block 2: one drafted position", "top-K 2, block 3", "top-K = budget"):
        assert any(x.startswith(label) for x in labels), (label, labels)
    assert any(x.endswith("QLEN_ONLY") for x in labels)
    assert all("depth" in r["detail"] and "padding" not in r["detail"] for r in tree)
    if HAVE_NVCC:
        assert all("SGLang's host checks and their transcription passed" in r["detail"]
                   for r in tree)
    assert len(_named(report, "verify_tree_greedy on the built tree")) == 5
    # What the plugin refuses is shown refused by abi_problem, never fed to the kernel.
    refused = _named(report, "refused by the plugin, not fed to the kernel: ")
    assert len(refused) == 4 and all(r["status"] == "PASS" for r in refused)
    assert any("verify width of 1025" in r["detail"] for r in refused)
    assert all("distinct draft prefixes" in r["detail"] for r in refused[1:])


def test_a_budget_schedule_runs_every_width_through_the_real_worker(dry):
    # The plugin's own resolution (its rules on an H200's memory here), then per entry the
    # payload's worker picking it for a batch of its threshold, its tree through the kernel
    # checks and its mask through Triton's extend attention (graphs: CUDA only).
    _, report, _ = dry
    resolved = _named(report, "the plugin resolves the budget schedule")
    assert len(resolved) == 1 and resolved[0]["status"] == "PASS", resolved
    assert "max_running_requests = " in resolved[0]["detail"]
    assert "decode reserve per entry" in resolved[0]["detail"]
    assert "recurrent states per request" in resolved[0]["detail"]  # ddtree_hybrid's rule
    widths = _named(report, "schedule width ")
    assert [r["check"].split(":")[0] for r in widths] == [
        "schedule width 9", "schedule width 7", "schedule width 5"], widths
    assert all(r["status"] == "PASS" and "the worker's entry" in r["check"] for r in widths)
    attention = [r for r in _named(report, "Triton extend attention") if "schedule entry" in
                 r["check"]]
    assert len(attention) == 3 and all(r["status"] == "PASS" for r in attention), attention
    assert "no mask (the tree is a chain)" in attention[-1]["detail"]


def test_the_hybrid_kernels_tree_path_is_checked_in_the_interpreter(dry):
    run, report, _ = dry
    hybrid = _hybrid_script()
    rows = _named(report, "hybrid tree path: ")
    assert [r["check"] for r in rows] == [f"hybrid tree path: {c}, budget 16 (depth 15)"
                                          for c in hybrid.CHECKS]
    assert all(r["status"] == "PASS" for r in rows), rows
    control = next(r for r in rows if "control-chain-parents-fail" in r["check"])
    assert "must be > 0.1" in control["detail"]
    assert "PASS  hybrid tree path: mamba2, budget 16" in run.stdout


def _carried_copy(carry: Path, tmp_path: Path) -> tuple:
    """A copy of the carried folder (to damage): (the copy, its release folder)."""
    copy = tmp_path / "carry"
    shutil.copytree(carry, copy)
    return copy, copy / f"sglang-{RELEASE}"


def test_a_folder_prepared_before_the_hybrid_part_is_refused(dry, tmp_path):
    copy, root = _carried_copy(dry[2], tmp_path)
    manifest = root / "MANIFEST.json"
    doc = json.loads(manifest.read_text())
    del doc["hybrid_files"]
    manifest.write_text(json.dumps(doc))
    run = _run(["--dry-run", "--carry", str(copy)])
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0
    assert "prepared by an older check (no hybrid kernel files)" in run.stderr


def test_the_hybrid_stand_ins_answer_every_name_the_carry_step_allows():
    # carry.hybrid_closure admits a kernel file's SGLang import only when STUBBED names it;
    # STUBBED must then be what _stub_modules really installs.
    import torch

    hybrid = _hybrid_script()
    before = dict(sys.modules)
    try:
        hybrid._stub_modules(torch)
        for module, names in hybrid.STUBBED.items():
            assert all(callable(getattr(sys.modules[module], n, None)) for n in names), module
    finally:  # the stand-in sglang modules never outlive this test
        for name in set(sys.modules) - set(before):
            del sys.modules[name]
        sys.modules.update(before)


def test_a_hybrid_run_without_its_kernel_files_fails_by_name(tmp_path):
    from ddtree_gpu_check import hybrid
    from ddtree_gpu_check.report import Report

    report = Report("test", stream=io.StringIO())
    hybrid.check(report, tmp_path, "cpu", (6,))
    assert [r["status"] for r in report.results] == ["FAIL"]
    detail = report.results[0]["detail"]
    assert "exit 2" in detail and "none of" in detail and "no result for conv at budget 6" in detail


def test_a_hybrid_run_past_its_time_limit_fails_by_name(dry, monkeypatch):
    from ddtree_gpu_check import carry, hybrid
    from ddtree_gpu_check.report import Report

    _, _, carried = dry
    monkeypatch.setitem(hybrid.TIME_LIMIT_S, "cpu", 1)
    report = Report("test", stream=io.StringIO())
    hybrid.check(report, carry.release_dir(carried), "cpu", (6,))
    assert report.results[-1]["status"] == "FAIL"
    assert "ran past its 1 s limit" in report.results[-1]["detail"]


def test_without_carried_files_it_stops_with_one_line_and_exit_2(tmp_path):
    run = _run(["--dry-run", "--carry", str(tmp_path / "nothing")])
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0
    assert "MANIFEST.json: missing; run `make gpu-check-dry`" in run.stderr


def test_a_changed_carried_file_is_refused(dry, tmp_path):
    copy, root = _carried_copy(dry[2], tmp_path)
    header = root / "sglang/kernels/jit/include/sgl_kernel/speculative/eagle.cuh"
    header.write_text(header.read_text().replace("depth - 1", "depth"))
    run = _run(["--dry-run", "--carry", str(copy)])
    assert run.returncode == 2 and "eagle.cuh: does not match MANIFEST.json" in run.stderr


def test_without_a_gpu_the_gpu_mode_fails_and_points_at_the_dry_run(dry, tmp_path):
    _, _, carry = dry
    run = _run(["--carry", str(carry), "--out", str(tmp_path)])
    assert run.returncode == 1
    assert "FAIL  environment  no CUDA device" in run.stdout
    assert "make gpu-check-dry" in run.stdout
