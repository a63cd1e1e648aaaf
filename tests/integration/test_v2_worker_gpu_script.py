"""scripts/gpu_check_v2.sh (+ .py), the prepared GPU check of the v2 worker, checked on CPU.

It cannot run here (CUDA kernels, a served model). What can be checked without a GPU is: the
shell script parses, the helper compiles and imports with the standard library alone and
offers its three commands, its ``install`` step really installs (the 0.5.23 wheel plus the v2
family's series land in a folder where every installed Python file byte-compiles and the
worker module carries the tree-verify marker), and its ``kernels`` step runs at small shapes
on CPU through SGLang's CPU-engine path with the named kernel stand-ins, so its calls into
SGLang are right before a GPU is spent on them. ``serve`` is only import-checked.
"""

from __future__ import annotations

import ast
import py_compile
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "scripts" / "gpu_check_v2.sh"
HELPER = REPO / "scripts" / "gpu_check_v2.py"


def test_shell_script_parses_and_names_its_steps():
    run = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    text = SCRIPT.read_text()
    for step in ("gpu_check_v2.py install", "gpu_check_v2.py kernels", "gpu_check_v2.py serve"):
        assert step in text


def test_helper_is_stdlib_only_at_module_level_and_has_three_commands():
    py_compile.compile(str(HELPER), doraise=True)
    tree = ast.parse(HELPER.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name.split(".")[0] for n in top for a in n.names if isinstance(n, ast.Import)}
    names |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= {"__future__", "argparse", "json", "shutil", "subprocess", "sys", "time",
                     "zipfile", "pathlib"}, names
    run = subprocess.run([sys.executable, str(HELPER), "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and all(c in run.stdout for c in ("install", "kernels", "serve"))


def test_install_step_lays_down_a_compiling_patched_release(tmp_path):
    from ddtree_deploy.sandbox import release_wheel

    site = tmp_path / "sp"
    run = subprocess.run(
        [sys.executable, str(HELPER), "install", "--wheel", str(release_wheel("0.5.23")),
         "--site-packages", str(site)],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    spec = site / "sglang" / "srt" / "speculative"
    for name in ("ddtree_worker_v2", "ddtree_lineage", "ddtree_utils", "ddtree_v2_plugin"):
        py_compile.compile(str(spec / f"{name}.py"), doraise=True)
    worker = ast.parse((spec / "ddtree_worker_v2.py").read_text())
    assert "DDTREE_TREE_VERIFY" in ast.dump(worker)
    # The patched files compile too (the series' own targets).
    series = (REPO / "patches" / "sglang-0.5.20" / "series").read_text().splitlines()
    for patch in (line.split()[0] for line in series if line.endswith(".patch")):
        for line in (REPO / "patches" / "sglang-0.5.20" / patch).read_text().splitlines():
            if line.startswith("+++ b/"):
                py_compile.compile(str(site / line[6:].split("\t")[0]), doraise=True)


def test_kernels_step_runs_on_cpu_against_the_patched_release(tmp_path):
    # The script's `kernels` step at small shapes on CPU (SGLang's CPU-engine path, the named
    # kernel stand-ins of tests/v2_kernel_standins.py): SGLang's build_tree_kernel_efficient
    # and verify_tree_greedy_func wrappers called the way the GPU run calls them, on the
    # release with the family applied. The sync check and the sampling kernel are CUDA-only.
    import json

    import v2_kernel_standins as ks
    from ddtree_deploy.sandbox import make_host_env, run_python
    from test_v2_worker import RELEASE, _family_overlay

    (tmp_path / "series").mkdir()
    env = make_host_env(tmp_path / "host", overlay=_family_overlay(tmp_path / "series"),
                        version=RELEASE, read_only=True)
    standin = ks.install_as_sgl_kernel(tmp_path / "standin")
    run = run_python(env, [str(HELPER), "kernels", "--device", "cpu"], timeout=600,
                     extra_env={"PYTHONPATH": standin, "SGLANG_USE_CPU_ENGINE": "1"})
    rows = [json.loads(line[len("GPU-V2:"):]) for line in run.stdout.splitlines()
            if line.startswith("GPU-V2:")]
    assert run.returncode == 0 and len(rows) == 6, run.stdout[-2000:] + run.stderr[-4000:]
    assert all(row["ok"] for row in rows), rows
