"""The v2 families against every release they claim, with real wheels: ``sglang-0.5.20``
(0.5.20 - 0.5.23) and ``sglang-0.5.19`` (0.5.19, the last CUDA 12 lane; the same payload, the
spec fields in server_args.py).

- ``ddtree-deploy check --release V`` (the CLI, as a user runs it) applies and compiles the
  whole series on each release, without fuzz (0.5.19 and 0.5.23: every hunk exact); GNU
  ``patch -F0`` (the oracle) lands the same hunks and gives the same bytes, and so does
  ``git apply`` (no fuzz by design).
- ``matrix`` over each family's range says ``ok`` with that family on each release, and
  ``matrix --import`` on each family's newest release passes the import, cli and tree levels
  in a throwaway venv.
- Never silently linear: the tree level (ddtree_deploy/release/matrix_import.py) fails a series
  that registers DDTREE without the worker, and one whose worker does not tree-verify.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.20"
RELEASES = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")
# Every v2 family: its releases (each one checked), releases just outside its range, and the
# releases whose hunks are all exact (the others land at offsets).
FAMILIES = {
    "sglang-0.5.20": (RELEASES, ("0.5.19", "0.5.24", "0.5.13.post1", "0.5.12.post1"), ("0.5.23",)),
    "sglang-0.5.19": (("0.5.19",), ("0.5.18", "0.5.20", "0.5.19rc0"), ("0.5.19",)),
    "sglang-0.5.18": (("0.5.18",), ("0.5.17", "0.5.19"), ("0.5.18",)),
    "sglang-0.5.17": (("0.5.17",), ("0.5.16", "0.5.18"), ("0.5.17",)),
    "sglang-0.5.16": (("0.5.16",), ("0.5.15.post1", "0.5.17"), ("0.5.16",)),
    "sglang-0.5.15": (("0.5.15", "0.5.15.post1"), ("0.5.14", "0.5.16"), ("0.5.15",)),
    "sglang-0.5.14": (("0.5.14",), ("0.5.13.post1", "0.5.15"), ("0.5.14",)),
}
# The series' hunk count where it is not 5 (one per patch).
HUNKS = {"sglang-0.5.18": 6, "sglang-0.5.17": 6, "sglang-0.5.16": 6, "sglang-0.5.15": 6, "sglang-0.5.14": 6}
PER_RELEASE = [(family, version) for family, (releases, _, _) in FAMILIES.items()
               for version in releases]

# `sglang_env` on the tests that run the release in a venv (matrix --import, the tree level);
# the others read the wheels (check, GNU patch, matrix) or are pure.


@pytest.mark.parametrize("family", FAMILIES)
def test_family_range_is_the_releases_it_is_proven_on(family):
    from packaging.version import Version

    from ddtree_deploy.engine.series import load_family

    releases, outside, _ = FAMILIES[family]
    spec = load_family(REPO / "patches" / family).info.specifier
    assert all(Version(v) in spec for v in releases)
    for version in outside:
        assert Version(version) not in spec, version


@pytest.mark.parametrize("family,version", PER_RELEASE)
def test_check_release_applies_and_compiles(family, version, tmp_path):
    from ddtree_deploy.sandbox import release_wheel

    release_wheel(version)  # cached once (sha256-checked against PyPI)
    done = subprocess.run(
        [sys.executable, "-m", "ddtree_deploy", "check", "--release", version, "--json"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**_env(), "DDTREE_DEPLOY_SNAPSHOT": str(tmp_path / "snapshot")})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True
    # No --family: the release picks its family by the ranges.
    assert report["family"] == family and report["compile_errors"] == []
    counts = report["hunks"]
    assert counts["fuzz"] == 0 and counts["failed"] == 0 and counts["already-applied"] == 0, counts
    # (0.5.16's, 0.5.17's and 0.5.18's 0005 is two hunks: the reserve computed before their per-request
    # loop, then used.)
    assert counts["exact"] + counts["offset"] == HUNKS.get(family, 5), counts
    if version in FAMILIES[family][2]:
        assert counts["exact"] == HUNKS.get(family, 5), counts


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_DEPLOY_")}


@pytest.mark.parametrize("family,version", PER_RELEASE)
def test_gnu_patch_and_git_apply_agree_with_the_check_layer(family, version, tmp_path):
    from ddtree_deploy.sandbox import pristine_files

    from ddtree_deploy.engine.check import check_series
    from ddtree_deploy.engine.series import PatchEntry, load_family

    series = load_family(REPO / "patches" / family)
    pristine = pristine_files(version)
    report = check_series(series, {p: pristine.get(p) for p in series.touched_paths()})
    assert report.ok
    patches = [entry for entry in series.entries if isinstance(entry, PatchEntry)]
    for tool in ("patch", "git"):
        tree = tmp_path / tool
        for entry in patches:
            for fp in entry.file_patches:
                (tree / fp.path).parent.mkdir(parents=True, exist_ok=True)
                (tree / fp.path).write_bytes(pristine[fp.path])
        for entry in patches:
            argv = (["patch", "-p1", "-F0", "-N", "--no-backup-if-mismatch", "-i", str(entry.file)]
                    if tool == "patch" else
                    ["git", "apply", "--unsafe-paths", "-p1", "--directory=.", str(entry.file)])
            done = subprocess.run(argv, cwd=tree, capture_output=True, text=True)
            assert done.returncode == 0, (tool, done.stdout + done.stderr)
            assert "fuzz" not in done.stdout, done.stdout
        for entry in patches:
            for fp in entry.file_patches:
                assert (tree / fp.path).read_bytes() == report.patched[fp.path].patched, (tool, fp.path)


@pytest.mark.parametrize("family", FAMILIES)
def test_matrix_says_ok_on_every_release_of_the_range(family, monkeypatch):
    from ddtree_deploy.release.matrix_run import run_matrix

    for name in ("DDTREE_DEPLOY_PATCHES", "DDTREE_DEPLOY_PAYLOAD"):
        monkeypatch.delenv(name, raising=False)
    releases = FAMILIES[family][0]
    m = run_matrix(from_version=releases[0], to_version=releases[-1], offline=True, jobs=1)
    rows = {r.version: r for r in m.rows}
    assert set(releases) <= set(rows)
    for version in releases:
        assert rows[version].family == family, version
        assert rows[version].verdict == "ok", (version, rows[version].why)


# ---------------------------------------------------------------------------
# matrix --import and the tree level


@pytest.mark.sglang_env
@pytest.mark.parametrize("family", FAMILIES)
def test_matrix_import_passes_the_tree_level_on_the_newest_release(family, monkeypatch):
    from ddtree_deploy.release.matrix_run import run_matrix

    for name in ("DDTREE_DEPLOY_PATCHES", "DDTREE_DEPLOY_PAYLOAD"):
        monkeypatch.delenv(name, raising=False)
    newest = FAMILIES[family][0][-1]
    m = run_matrix(from_version=newest, to_version=newest, offline=True, jobs=1, import_smoke=True)
    row = next(r for r in m.rows if r.version == newest)
    levels = {lv: (st, d) for lv, st, d in row.smoke}
    assert row.family == family
    assert [lv for lv, _, _ in row.smoke] == ["import", "cli", "tree"]
    assert all(st == "passed" for st, _ in levels.values()), levels
    assert "verify width 33 = budget 32 + 1" in levels["tree"][1]
    assert "ddtree_worker_v2.DDTreeWorkerV2 tree-verifies" in levels["tree"][1]
    assert row.verdict == "ok" and m.exit_code == 0


def _variant(tmp_path: Path, *, drop: tuple[str, ...] = (), worker_source: str | None = None):
    """A copy of the family (and payload) with series entries dropped or the worker replaced."""
    from ddtree_deploy.engine.series import load_family

    patches, payload = tmp_path / "patches", tmp_path / "payload"
    shutil.copytree(FAMILY, patches / FAMILY.name)
    shutil.copytree(REPO / "payload", payload, ignore=shutil.ignore_patterns("__pycache__"))
    series_file = patches / FAMILY.name / "series"
    lines = [ln for ln in series_file.read_text().splitlines() if not any(d in ln for d in drop)]
    series_file.write_text("\n".join(lines) + "\n")
    if worker_source is not None:
        (payload / "ddtree_worker_v2.py").write_text(worker_source)
    return load_family(patches / FAMILY.name, payload_dir=payload)


@pytest.fixture(scope="module")
def unpatched_cannot():
    """What the unpatched release cannot import in a CPU env, per (version, modules): the
    same answer for every variant below (they differ in payload files the release lacks)
    and for the `matrix --import` run above it (matrix_import.unimportable_release keeps
    the answer per wheel and modules), so its import probe (torch and SGLang imported
    whole) runs once per process."""
    from ddtree_deploy.release import releases
    from ddtree_deploy.release.matrix_import import unimportable_release

    def cannot(version: str, python: Path, modules: list[str]) -> dict[str, str]:
        return unimportable_release(releases.ensure_wheel(version), python, modules, 300)

    return cannot


def _tree_level(series, version: str, tmp_path: Path, unpatched_cannot) -> tuple[str, str]:
    from ddtree_deploy.engine.check import check_series
    from ddtree_deploy.release import releases
    from ddtree_deploy.release.matrix_import import make_env, tree_level
    from ddtree_deploy.smoke.plan import module_name

    wheel = releases.ensure_wheel(version)
    wanted = series.touched_paths()
    found = releases.read_wheel_files(wheel, wanted)
    report = check_series(series, {p: found.get(p) for p in wanted})
    assert report.ok, report.to_json()
    python, site = make_env(tmp_path / "env", wheel)
    existing = [module_name(p) for p in wanted if found.get(p) is not None and module_name(p)]
    cannot = unpatched_cannot(version, python, existing)  # probed before the series is written
    for p in report.patched.values():
        target = site.joinpath(*p.path.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(p.patched)
    return tree_level(python, tmp_path / "tree", cannot, 300)


@pytest.mark.sglang_env
def test_tree_level_fails_a_series_without_the_worker(tmp_path, unpatched_cannot):
    # A deliberately partial port: DDTREE registered (plugin, flags, hooks), no worker.
    series = _variant(tmp_path, drop=("ddtree_worker_v2.py",))
    status, detail = _tree_level(series, "0.5.23", tmp_path, unpatched_cannot)
    assert status == "failed", detail
    assert "does not import" in detail and "ddtree_worker_v2" in detail, detail


@pytest.mark.sglang_env
def test_tree_level_fails_a_series_without_the_lineage(tmp_path, unpatched_cannot):
    # The plugin's resolution refuses what EAGLE's CUDA tree ABI cannot carry
    # (ddtree_lineage.abi_problem): without the lineage module DDTREE does not resolve.
    series = _variant(tmp_path, drop=("ddtree_lineage.py",))
    status, detail = _tree_level(series, "0.5.23", tmp_path, unpatched_cannot)
    assert status == "failed", detail
    assert "ddtree_lineage" in detail, detail


LINEAR_WORKER = '''"""NAMED STAND-IN for this test: a DDTree worker that is only DFlash's chain worker."""
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2


class DDTreeWorkerV2(DFlashWorkerV2):
    pass
'''


@pytest.mark.sglang_env
def test_tree_level_fails_a_worker_that_does_not_tree_verify(tmp_path, unpatched_cannot):
    series = _variant(tmp_path, worker_source=LINEAR_WORKER)
    status, detail = _tree_level(series, "0.5.23", tmp_path, unpatched_cannot)
    assert status == "failed", detail
    assert "does not tree-verify" in detail and "DDTREE_TREE_VERIFY" in detail, detail


def test_tree_verdict_rules():
    from ddtree_deploy.release.matrix_import import tree_verdict

    ok = {"ok": True, "width": 33, "budget": 32, "worker": "m.W", "tree_verify": True}
    assert tree_verdict(ok, budget=32, cannot={})[0] == "passed"
    # A verify width that is the DFlash block (a chain), or a budget that was not applied.
    assert tree_verdict({**ok, "width": 16}, budget=32, cannot={})[0] == "failed"
    assert tree_verdict({**ok, "budget": None, "width": 16}, budget=32, cannot={})[0] == "failed"
    assert tree_verdict({**ok, "tree_verify": False}, budget=32, cannot={})[0] == "failed"
    assert tree_verdict({"ok": False, "error": "x"}, budget=32, cannot={}) == ("failed", "x")
    # A worker that needs a CUDA-only package the unpatched release lacks here too: skipped;
    # a missing sglang module (the worker the series forgot): failed.
    cuda_only = {**ok, "import_error": "ModuleNotFoundError: No module named 'sgl_kernel'", "missing": "sgl_kernel"}
    del cuda_only["worker"], cuda_only["tree_verify"]
    cannot = {"sglang.srt.speculative.dflash_worker": "ModuleNotFoundError: No module named 'sgl_kernel'"}
    assert tree_verdict(cuda_only, budget=32, cannot=cannot)[0] == "skipped"
    assert tree_verdict(cuda_only, budget=32, cannot={})[0] == "failed"
    forgot = {**cuda_only, "missing": "sglang.srt.speculative.ddtree_worker_v2"}
    assert tree_verdict(forgot, budget=32, cannot=cannot)[0] == "failed"


def test_the_unpatched_import_probe_runs_once_per_wheel_and_modules(tmp_path):
    """matrix_import.unimportable_release: the probe runs on the first call (a real
    interpreter, a real failed import); a second call for the same wheel and modules answers
    without running anything (its interpreter does not even exist); other modules run it."""
    import sys

    from ddtree_deploy.release.matrix_import import unimportable_release

    wheel = tmp_path / "sglang-0.0.0.test-py3-none-any.whl"  # only its name is the key
    first = unimportable_release(wheel, Path(sys.executable), ["json", "ddtree_no_such_module"], 60)
    assert list(first) == ["ddtree_no_such_module"] and "ModuleNotFoundError" in first["ddtree_no_such_module"]
    first.clear()  # the caller's copy: the kept answer is not touched
    gone = tmp_path / "no-such-python"
    assert unimportable_release(wheel, gone, ["ddtree_no_such_module", "json"], 60) == {
        "ddtree_no_such_module": "ModuleNotFoundError: No module named 'ddtree_no_such_module'"}
    with pytest.raises(FileNotFoundError):  # other modules: the probe runs (and cannot, here)
        unimportable_release(wheel, gone, ["json"], 60)
