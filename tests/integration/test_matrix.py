"""The matrix: pure verdict rules on hand-made values, then the real thing over real wheels.

Tiers:
- pure: cells from check results, family assignment by version range, exit codes,
  renderings (no files);
- release facts from the real wheels' file lists;
- the CI matrix (marked ``network``: it fills the wheel cache from PyPI on the first
  run, then runs offline): SGLang 0.5.11 .. 0.5.14 (six wheels), with the expected
  verdicts asserted for the test family under tests/data/matrix_family and for the
  real DDTree series' patches that exist;
- the CLI through typer's CliRunner.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from typer.testing import CliRunner

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.base.locations import REPO_ROOT
from ddtree_deploy.cli import app
from ddtree_deploy.engine import patch_write
from ddtree_deploy.engine.check import ALREADY, APPLIED, FAILED, PARTLY, SKIPPED, EntryCheck, FileCheck
from ddtree_deploy.engine.patch_apply import HunkResult, HunkStatus, Mismatch
from ddtree_deploy.engine.series import FamilyInfo, load_family
from ddtree_deploy.release import releases
from ddtree_deploy.release.matrix import (
    Cell,
    CellStatus,
    Coverage,
    Matrix,
    ReleaseRow,
    assign,
    cell_from_entry,
    upper_bound,
)
from ddtree_deploy.release.matrix_run import run_matrix, select_releases
from ddtree_deploy.release.facts import DFlashWorker, describe, explain_missing, facts_from_names

DATA = Path(__file__).resolve().parent.parent / "data"
TEST_FAMILY = DATA / "matrix_family"
#: The CI matrix: 0.5.11 .. 0.5.14, six wheels (about 60 MB), kept small so CI stays fast.
CI_RELEASES = ("0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14")


# --- pure: cells ---------------------------------------------------------------


def _hunk(index, status, *, offset=0, fuzz=0, nearest=None, mismatches=()):
    return HunkResult(index=index, header="@@ -10,6 +10,7 @@", patch_line=5 + index, status=status,
                      line=None if status is HunkStatus.FAILED else 10 + offset, offset=offset, fuzz=fuzz,
                      nearest_line=nearest, mismatches=tuple(mismatches))


def _entry(*files):
    return EntryCheck(name="0002-x.patch", line=2, kind="patch", files=tuple(files))


def test_cell_takes_the_worst_hunk_and_reports_the_biggest_offset():
    fc = FileCheck("sglang/a.py", APPLIED, hunks=(_hunk(1, HunkStatus.EXACT), _hunk(2, HunkStatus.OFFSET, offset=-7),
                                                  _hunk(3, HunkStatus.OFFSET, offset=3)))
    cell = cell_from_entry(_entry(fc))
    assert (cell.status, cell.note, cell.short()) == (CellStatus.OFFSET, "-7", "offset -7")
    fuzzy = FileCheck("sglang/a.py", APPLIED, hunks=(_hunk(1, HunkStatus.OFFSET, offset=2),
                                                     _hunk(2, HunkStatus.FUZZ, fuzz=1)))
    assert cell_from_entry(_entry(fuzzy)).short() == "fuzz 1"
    already = FileCheck("sglang/a.py", ALREADY, hunks=(_hunk(1, HunkStatus.ALREADY_APPLIED),))
    assert cell_from_entry(_entry(already)).status is CellStatus.ALREADY_APPLIED
    assert cell_from_entry(_entry(fc)).ok and cell_from_entry(_entry(already)).ok


def test_failed_cell_names_file_hunk_patch_line_nearest_line_and_the_differing_line():
    bad = _hunk(2, HunkStatus.FAILED, nearest=3631,
                mismatches=[Mismatch(3633, "    old line\n", "    new line\n"), Mismatch(3634, "x\n", None)])
    fc = FileCheck("sglang/srt/server_args.py", FAILED, hunks=(_hunk(1, HunkStatus.EXACT), bad),
                   message="1 of 2 hunks failed")
    cell = cell_from_entry(_entry(fc))
    assert cell.status is CellStatus.FAILED and not cell.ok
    assert cell.note == ("sglang/srt/server_args.py hunk 2 (patch line 7), nearest line 3631: "
                         "line 3633 expected '    old line', found '    new line'")


def test_missing_file_and_skipped_cells():
    missing = FileCheck("sglang/srt/speculative/dflash_worker.py", FAILED,
                        message="sglang/srt/speculative/dflash_worker.py does not exist in this SGLang")
    cell = cell_from_entry(_entry(missing))
    assert cell.status is CellStatus.FAILED and "does not exist" in cell.note
    skipped = FileCheck("sglang/a.py", SKIPPED, message="0002-x.patch failed on this file")
    assert cell_from_entry(_entry(skipped)).status is CellStatus.SKIPPED
    assert not cell_from_entry(_entry(skipped)).ok


def test_a_partly_applied_file_makes_a_failing_cell_never_ok():
    mixed = (_hunk(1, HunkStatus.ALREADY_APPLIED), _hunk(2, HunkStatus.OFFSET, offset=2))
    fc = FileCheck("sglang/a.py", PARTLY, hunks=mixed, message="partly applied: hunk 1 already in the file, hunk 2 not")
    cell = cell_from_entry(_entry(fc))
    assert cell.status is CellStatus.PARTLY and not cell.ok and cell.short() == "partly applied"
    assert "hunk 1 already in the file" in cell.note
    row = ReleaseRow("0.5.16", "f", Coverage.IN_RANGE, cells=(cell,))
    assert row.verdict == "failed" and Matrix(rows=(row,)).exit_code == 1
    assert any("partly applied" in line for line in Matrix(rows=(row,)).details())
    # what check --allow-partly-applied accepted is not a failure
    allowed = FileCheck("sglang/a.py", PARTLY, hunks=mixed, allowed=True)
    assert cell_from_entry(_entry(allowed)).ok


# --- pure: which family, and what counts -------------------------------------------


def _info(name, spec):
    return FamilyInfo(name=name, folder=Path("/nonexistent") / name, specifier=SpecifierSet(spec), description="")


FAMS = [_info("sglang-0.5.12", ">=0.5.12,<0.5.13"), _info("sglang-0.5.15", ">=0.5.15,<=0.5.16")]


@pytest.mark.parametrize(
    "version, family, coverage",
    [
        ("0.5.12", "sglang-0.5.12", Coverage.IN_RANGE),
        ("0.5.12.post1", "sglang-0.5.12", Coverage.IN_RANGE),  # a post release is in its range
        ("0.5.11", None, Coverage.NO_FAMILY),  # older than every range
        ("0.5.13", None, Coverage.NO_FAMILY),  # in the gap between the two families
        ("0.5.16", "sglang-0.5.15", Coverage.IN_RANGE),  # <= is inclusive
        ("0.5.16.post1", "sglang-0.5.15", Coverage.UNCOVERED),  # newer than all: probed with the newest
        ("0.5.23", "sglang-0.5.15", Coverage.UNCOVERED),
    ],
)
def test_assign_picks_the_covering_family_or_says_why_not(version, family, coverage):
    info, cov = assign(version, FAMS)
    assert (info.name if info else None, cov) == (family, coverage)


def test_an_explicit_family_applies_everywhere_and_marks_releases_outside_its_range():
    assert assign("0.5.11", FAMS, FAMS[0]) == (FAMS[0], Coverage.OUTSIDE)
    assert assign("0.5.12.post1", FAMS, FAMS[0]) == (FAMS[0], Coverage.IN_RANGE)


@pytest.mark.parametrize(
    "spec, bound",
    [(">=0.5.12,<0.5.13", ("0.5.13", False)), ("==0.5.12", ("0.5.12", True)), ("~=0.5.12", ("0.6", False)),
     (">=0.5.12", None), ("<=0.5.20,<0.5.18", ("0.5.18", False))],
)
def test_upper_bound_of_a_range(spec, bound):
    got = upper_bound(_info("f", spec))
    assert (None if got is None else (str(got[0]), got[1])) == bound


def _row(version, coverage, ok=True, family="f"):
    cells = (Cell("0001-a.patch", CellStatus.EXACT), Cell("0002-b.patch", CellStatus.EXACT if ok else CellStatus.FAILED,
                                                         "" if ok else "sglang/a.py hunk 1 (patch line 9)"))
    return ReleaseRow(version, family, coverage, cells=cells)


def test_exit_code_fails_only_for_a_release_inside_its_range_or_uncovered_with_strict():
    clean = [_row("0.5.12", Coverage.IN_RANGE), _row("0.5.14", Coverage.UNCOVERED, ok=False),
             _row("0.5.11", Coverage.OUTSIDE, ok=False)]
    assert Matrix(tuple(clean)).exit_code == 0
    assert Matrix(tuple(clean), strict=True).exit_code == 1
    assert Matrix(tuple(clean[:1] + clean[2:]), strict=True).exit_code == 0
    broken = [_row("0.5.12", Coverage.IN_RANGE, ok=False)]
    assert Matrix(tuple(broken)).exit_code == 1
    assert Matrix(tuple(broken)).failures()[0].verdict == "failed"
    compile_broken = ReleaseRow("0.5.12", "f", Coverage.IN_RANGE, cells=clean[0].cells,
                                compile_errors=("sglang/a.py:3: invalid syntax",))
    assert Matrix((compile_broken,)).exit_code == 1


def test_markdown_and_json_carry_every_row_column_and_failure():
    m = Matrix((_row("0.5.12", Coverage.IN_RANGE), _row("0.5.12.post1", Coverage.IN_RANGE, ok=False),
                ReleaseRow("0.5.11", None, Coverage.NO_FAMILY, why="no family's range contains it")))
    md = m.to_markdown()
    assert "| release | cuda | family | 0001 | 0002 | compile | verdict | why |" in md
    assert "| 0.5.12.post1 | cu129 | f | exact | failed | skipped | failed |" in md
    assert "| 0.5.11 | cu129 | - | no family | no family | - | no family | no family's range contains it |" in md
    assert "- 0.5.12.post1 [f] 0002-b.patch: sglang/a.py hunk 1 (patch line 9)" in md
    doc = json.loads(json.dumps(m.to_json()))
    assert doc["failed"] == ["0.5.12.post1"] and doc["exit_code"] == 1
    assert [r["cuda_lane"] for r in doc["rows"]] == ["cu129", "cu129", "cu129"]
    assert doc["columns"] == ["0001-a.patch", "0002-b.patch"]
    assert [r["verdict"] for r in doc["rows"]] == ["ok", "failed", "no family"]


def test_select_releases_keeps_wheel_releases_in_range(data_dir):
    doc = json.loads((data_dir / "pypi" / "sglang-trimmed.json").read_text())
    listing = releases.parse_project(doc, base_url="https://x/pypi/sglang/json")
    assert [str(r.version) for r in select_releases(listing, "0.5.10", "latest")] == [
        "0.5.10", "0.5.11", "0.5.12", "0.5.12.post1"]
    assert [str(r.version) for r in select_releases(listing, "0.5.11", "0.5.12")] == ["0.5.11", "0.5.12"]


# --- release facts --------------------------------------------------------------


def test_facts_date_a_removed_file_and_a_file_not_yet_added():
    paths = ("sglang/srt/speculative/spec_registry.py", "sglang/srt/speculative/dflash_worker.py")
    base = ["sglang/srt/server_args.py", "sglang-x.dist-info/RECORD"]
    v1 = base + ["sglang/srt/speculative/dflash_worker.py"]
    history = [
        facts_from_names("0.5.11", v1, paths),
        facts_from_names("0.5.12", v1 + ["sglang/srt/speculative/spec_registry.py"], paths),
        facts_from_names("0.5.14", base + ["sglang/srt/speculative/spec_registry.py",
                                           "sglang/srt/speculative/dflash_worker_v2.py"], paths),
    ]
    assert [f.dflash_worker for f in history] == [DFlashWorker.V1, DFlashWorker.V1, DFlashWorker.V2]
    assert explain_missing(history[0], history) == ("spec_registry.py not yet added (first in 0.5.12)",)
    assert explain_missing(history[2], history) == (
        "dflash_worker.py removed in 0.5.14 (only the v2 worker, dflash_worker_v2.py)",)
    assert describe(history[1], history) == "DFlash worker v1; validation in server_args.py"


# --- the CI matrix over real wheels ----------------------------------------------


@pytest.fixture(scope="module")
def ci_wheels() -> dict[str, Path]:
    """The six CI wheels, verified; downloaded once (network), offline afterwards."""
    try:
        return {v: releases.ensure_wheel(v) for v in CI_RELEASES}
    except DeployError as exc:
        pytest.skip(f"CI wheels not cached and PyPI unreachable: {exc.message}")


@pytest.fixture
def test_family_env(monkeypatch, tmp_path):
    """The test family as the repository's patches/ (a copy: port tests write beside it)."""
    patches = tmp_path / "patches"
    shutil.copytree(TEST_FAMILY / "patches", patches)
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(patches))
    monkeypatch.setenv("DDTREE_DEPLOY_PAYLOAD", str(TEST_FAMILY / "payload"))
    return patches


def _by_version(matrix):
    return {r.version: r for r in matrix.rows}


def _statuses(row):
    return [c.short() for c in row.cells]


@pytest.mark.network
def test_ci_matrix_test_family_verdicts(ci_wheels, test_family_env):
    m = run_matrix(from_version="0.5.11", to_version="0.5.14", offline=True, jobs=2)
    rows = _by_version(m)
    assert list(rows) == list(CI_RELEASES)
    assert rows["0.5.11"].verdict == "no family" and rows["0.5.11"].family is None
    for v in ("0.5.12", "0.5.12.post1"):
        assert rows[v].verdict == "ok"
        assert _statuses(rows[v]) == ["exact"] * 5 and rows[v].compile_text() == "ok"
    for v in ("0.5.13", "0.5.13.post1"):
        row = rows[v]
        assert row.verdict == "uncovered" and row.family == "sglang-0.5.12"
        # 0.5.13 moved DFLASH's validation to arg_groups/: the validation hunk fails there.
        assert _statuses(row) == ["offset +6", "failed", "failed", "skipped", "exact"]
        assert "server_args.py hunk 2" in row.cells[1].note
        assert row.facts.validation_in == "arg_groups/speculative_hook.py"
    row = rows["0.5.14"]
    assert row.facts.dflash_worker is DFlashWorker.V2
    assert "sglang/srt/speculative/dflash_worker.py" in row.facts.missing
    assert "dflash_worker.py removed in 0.5.14" in row.why
    assert "does not exist" in row.cells[2].note
    assert m.exit_code == 0
    strict = run_matrix(from_version="0.5.11", to_version="0.5.14", offline=True, strict=True, jobs=1)
    assert strict.exit_code == 1
    # Parallel and serial runs give the same rows.
    assert [r.to_json() for r in strict.rows] == [r.to_json() for r in m.rows]


@pytest.mark.network
def test_ci_matrix_an_explicit_family_on_an_older_release(ci_wheels, test_family_env):
    m = run_matrix(from_version="0.5.11", to_version="0.5.11", family="sglang-0.5.12", offline=True, jobs=1)
    row = m.rows[0]
    # 0.5.11 predates the names the 0.5.12 family's context uses.
    assert row.coverage is Coverage.OUTSIDE and row.verdict == "outside range"
    assert [c.status for c in row.cells[:2]] == [CellStatus.FAILED, CellStatus.FAILED]
    assert m.exit_code == 0


def _real_family(tmp_path: Path) -> Path:
    """The patches folder holding the real DDTree family (complete: a broken one fails here)."""
    real = REPO_ROOT / "patches" / "sglang-0.5.12"
    load_family(real)
    return real.parent


@pytest.mark.network
def test_ci_matrix_real_series(ci_wheels, tmp_path, monkeypatch):
    patches = _real_family(tmp_path)
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(patches))
    m = run_matrix(from_version="0.5.11", to_version="0.5.14", offline=True, jobs=2)
    rows = _by_version(m)
    # The 0.5.12 family applies to 0.5.12 and 0.5.12.post1 and the results compile.
    for v in ("0.5.12", "0.5.12.post1"):
        assert rows[v].verdict == "ok", rows[v].to_json()
        assert all(c.ok for c in rows[v].cells) and rows[v].compile_text() == "ok"
    # 0.5.11 has no family; applied explicitly, it differs (names, no spec_registry.py).
    assert rows["0.5.11"].verdict == "no family"
    older = run_matrix(from_version="0.5.11", to_version="0.5.11", family="sglang-0.5.12", offline=True, jobs=1)
    assert not older.rows[0].applies
    assert "spec_registry.py not yet added (first in 0.5.12)" in rows["0.5.11"].why
    # The 0.5.13 family (validation moved to arg_groups/speculative_hook.py) covers both 0.5.13s:
    # four v1 releases ok.
    for v in ("0.5.13", "0.5.13.post1"):
        assert rows[v].verdict == "ok", rows[v].to_json()
        assert rows[v].family == "sglang-0.5.13"
    # 0.5.14 is the first v2-worker release: its own family (sglang-0.5.14), not a v1 one.
    assert rows["0.5.14"].verdict == "ok" and rows["0.5.14"].family == "sglang-0.5.14", rows["0.5.14"].to_json()
    assert rows["0.5.14"].facts.dflash_worker is DFlashWorker.V2
    assert sum(r.verdict == "ok" for r in m.rows) == 5
    assert m.exit_code == 0
    # A release its family covers cleanly lists no files that only other families touch.
    assert "not yet added" not in rows["0.5.12"].why and "DFlash worker v1" in rows["0.5.12"].why
    # The terminal shows one table per family, with that family's own entries as columns.
    tables = {family: (header, [r[0] for r in body]) for family, header, body in m.tables()}
    assert list(tables) == ["sglang-0.5.12", "sglang-0.5.13", "sglang-0.5.14", None]
    assert tables["sglang-0.5.12"][1] == ["0.5.12", "0.5.12.post1"]
    assert tables["sglang-0.5.14"][1] == ["0.5.14"]
    assert tables[None][1] == ["0.5.11"]
    assert "0003" in tables["sglang-0.5.13"][0] and len(tables["sglang-0.5.13"][0]) == len(set(tables["sglang-0.5.13"][0]))


#: Every release from 0.5.12 to 0.5.23 (15 on PyPI) and the family that must cover it ok.
FAMILY_OF = {
    "0.5.12": "sglang-0.5.12", "0.5.12.post1": "sglang-0.5.12",
    "0.5.13": "sglang-0.5.13", "0.5.13.post1": "sglang-0.5.13",
    "0.5.14": "sglang-0.5.14", "0.5.15": "sglang-0.5.15", "0.5.15.post1": "sglang-0.5.15",
    "0.5.16": "sglang-0.5.16", "0.5.17": "sglang-0.5.17", "0.5.18": "sglang-0.5.18",
    "0.5.19": "sglang-0.5.19",
    "0.5.20": "sglang-0.5.20", "0.5.21": "sglang-0.5.20", "0.5.22": "sglang-0.5.20",
    "0.5.23": "sglang-0.5.20",
}


def test_matrix_from_0_5_12_with_the_real_families(monkeypatch):
    # The real families (no test family) over the cached wheels: every release a family's
    # range holds is ok with that family, so the run exits 0; a release in a range that
    # failed would make it exit 1 (test_exit_code_fails_only_for_a_release_inside_its_range...).
    for name in ("DDTREE_DEPLOY_PATCHES", "DDTREE_DEPLOY_PAYLOAD"):
        monkeypatch.delenv(name, raising=False)
    m = run_matrix(from_version="0.5.12", to_version="0.5.23", offline=True, jobs=2)
    rows = _by_version(m)
    assert len(rows) == 15, sorted(rows)
    ok = {v: r.family for v, r in rows.items() if r.verdict == "ok"}
    assert ok == FAMILY_OF, {v: (r.verdict, r.family, r.why) for v, r in rows.items()}
    assert all(rows[v].coverage is Coverage.IN_RANGE for v in FAMILY_OF)
    assert m.exit_code == 0


# --- CLI ------------------------------------------------------------------------------


@pytest.mark.network
def test_cli_matrix_json_markdown_and_exit_codes(ci_wheels, test_family_env, tmp_path):
    runner = CliRunner()
    md = tmp_path / "report" / "compat.md"
    res = runner.invoke(app, ["matrix", "--from", "0.5.12", "--to", "0.5.13", "--offline", "--jobs", "1",
                              "--json", "--markdown", str(md)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [r["verdict"] for r in doc["rows"]] == ["ok", "ok", "uncovered"]
    assert "| 0.5.13 | cu129 | sglang-0.5.12 | offset +6 | failed |" in md.read_text()
    res = runner.invoke(app, ["matrix", "--from", "0.5.12", "--to", "0.5.13", "--offline", "--jobs", "1",
                              "--strict"])
    assert res.exit_code == 1
    assert "matrix: 3 release(s): 2 ok, 1 uncovered; exit 1" in res.stdout


def test_cli_matrix_bad_range_is_one_line_exit_2(test_family_env, monkeypatch, data_dir, tmp_path):
    # A cached listing (the real, trimmed PyPI document) so that nothing touches the network.
    cache = tmp_path / "cache"
    (cache / "pypi").mkdir(parents=True)
    shutil.copy(data_dir / "pypi" / "sglang-trimmed.json", cache / "pypi" / "sglang.json")
    monkeypatch.setenv("DDTREE_DEPLOY_CACHE", str(cache))
    res = CliRunner().invoke(app, ["matrix", "--from", "0.5.13", "--to", "0.5.12", "--offline"])
    assert res.exit_code == 2
    assert "--from 0.5.13 is newer than --to 0.5.12" in res.stderr
    res = CliRunner().invoke(app, ["matrix", "--from", "banana", "--offline"])
    assert res.exit_code == 2 and "not a valid PEP 440 version" in res.stderr


# --- the CI workflow -----------------------------------------------------------------------


def test_the_ci_workflow_runs_the_matrix_command_with_options_it_has():
    yaml = pytest.importorskip("yaml")
    import typer.main

    doc = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "sglang-compat.yml").read_text())
    triggers = doc[True]  # YAML 1.1 reads the key "on" as True
    assert "schedule" in triggers and "patches/**" in triggers["push"]["paths"]
    runs = [s.get("run", "") for s in doc["jobs"]["matrix"]["steps"]]
    command = next(r for r in runs if "ddtree-deploy matrix" in r)
    used = set(re.findall(r"(--[a-z][a-z-]*)", command.split("ddtree-deploy matrix", 1)[1]))
    matrix = typer.main.get_command(app).commands["matrix"]
    known = {opt for p in matrix.params for opt in p.opts}
    assert used and used <= known, used - known
    assert {"--markdown", "--json"} <= used
    # The markdown report is what the job summary shows.
    assert any("sglang-compat.md" in r and "GITHUB_STEP_SUMMARY" in r for r in runs)


# --- --import: throwaway CPU virtualenvs ---------------------------------------------------


@pytest.mark.sglang_env
def test_matrix_import_smoke_passes_a_good_series_and_fails_one_that_breaks_an_import(monkeypatch, tmp_path):
    """The REAL 0.5.12 DDTree family (a toy series would now fail the tree level, rightly: it
    is not a tree) on 0.5.12, then the same plus a patch that compiles but imports a module
    that does not exist, on the same release. Real wheel, real venvs, the real smoke program;
    dflash_worker.py is left out of the import level on CPU because the unpatched release
    cannot import it here either (sgl_kernel is CUDA-only).

    Both runs on one release and the same touched files: what the unpatched release cannot
    import is probed once (matrix_import.unimportable_release keeps the answer in the
    process), so the second run costs one interpreter (its import level), not two."""

    try:
        wheel = releases.ensure_wheel("0.5.12")
    except DeployError as exc:
        pytest.skip(f"0.5.12 wheel not cached and PyPI unreachable: {exc.message}")
    real = REPO_ROOT / "patches" / "sglang-0.5.12"
    family_toml = (real / "family.toml").read_text()
    assert 'sglang = ">=0.5.12,<0.5.13"' in family_toml
    good = tmp_path / "good-series" / "good"
    shutil.copytree(real, good)
    bad = tmp_path / "bad-series" / "bad"
    shutil.copytree(real, bad)
    spec = "sglang/srt/speculative/spec_info.py"
    old = releases.read_wheel_files(wheel, [spec])[spec].decode()
    new = old.replace("from enum import", "import ddtree_no_such_module_for_this_test  # noqa\nfrom enum import", 1)
    assert new != old
    (bad / "0099-broken-import.patch").write_text(
        f"--- a/{spec}\n+++ b/{spec}\n" + "".join(h for _, h in patch_write.diff_hunks(old, new)))
    with open(bad / "series", "a") as fh:
        fh.write("0099-broken-import.patch\n")
    assert load_family(bad).touched_paths() == load_family(good).touched_paths()  # one probe for both
    monkeypatch.setenv("DDTREE_DEPLOY_PAYLOAD", str(REPO_ROOT / "payload"))

    def matrix_of(patches: Path):
        monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(patches))
        return run_matrix(from_version="0.5.12", to_version="0.5.12", offline=True, jobs=1, import_smoke=True)

    m = matrix_of(good.parent)
    (row,) = m.rows
    assert row.version == "0.5.12" and row.verdict == "ok" and m.exit_code == 0, row.smoke  # applies, compiles, smokes
    levels = {lv: (st, d) for lv, st, d in row.smoke}
    assert [lv for lv, _, _ in row.smoke] == ["import", "cli", "tree"]
    assert levels["import"][0] == "passed" and levels["cli"][0] == "passed"
    # The tree level resolves the width; the v1 worker itself needs sgl_kernel (CUDA-only), as
    # the unpatched release's modules do here: skipped, said so, never passed nor failed.
    assert levels["tree"][0] == "skipped" and levels["tree"][1].startswith(
        "verify width 33 = budget + 1; the worker needs sgl_kernel"), levels["tree"]
    assert "sglang.srt.speculative.dflash_worker" in levels["import"][1] and "sgl_kernel" in levels["import"][1]

    broken_m = matrix_of(bad.parent)
    (broken_row,) = broken_m.rows
    assert broken_row.applies, broken_row.smoke  # it applies and compiles: only importing it fails
    broken = {lv: (st, d) for lv, st, d in broken_row.smoke}
    assert broken["import"][0] == "failed" and "ddtree_no_such_module_for_this_test" in broken["import"][1]
    assert broken["cli"][0] == "skipped" and broken["tree"][0] == "skipped"
    assert broken_row.verdict == "failed" and broken_m.exit_code == 1
    markdown = broken_m.to_markdown()
    assert re.search(r"^\| 0\.5\.12 \| cu\d+ \| bad \|", markdown, re.M), markdown
    assert "import failed" in markdown


# --- never ok for a change a release already has (issue 11 item 10) --------------------

EAGLE = "sglang/srt/speculative/eagle_utils.py"


def _release_diff_family(tmp_path: Path, path: str, old: str, new: str, spec: str) -> Path:
    """A family whose one patch is SGLang's own change to ``path`` from ``old`` to ``new``."""
    import subprocess

    from ddtree_deploy.sandbox import pristine_files

    work = tmp_path / "diff"
    for side, version in (("a", old), ("b", new)):
        (work / side / path).parent.mkdir(parents=True, exist_ok=True)
        (work / side / path).write_bytes(pristine_files(version, [path])[path])
    text = subprocess.run(["git", "diff", "--no-index", "--no-prefix", "a/" + path, "b/" + path],
                          cwd=work, capture_output=True, text=True).stdout
    assert text.count("\n@@ ") >= 10, "the release diff should have many hunks"
    family = tmp_path / "patches" / "eagle"
    family.mkdir(parents=True)
    (family / "family.toml").write_text(f'sglang = "{spec}"\n')
    (family / "series").write_text("0001-eagle.patch\n")
    (family / "0001-eagle.patch").write_text(text)
    return family.parent


@pytest.mark.network
def test_matrix_never_says_ok_offset_for_a_release_that_has_the_change(tmp_path, monkeypatch):
    """eagle_utils.py's own 0.5.14 -> 0.5.16 diff, on 0.5.16: every hunk already there.

    The engine used to find 3 of its 18 hunks again further down and write them a second
    time (sgl_build_tree_kernel_triton defined twice), and matrix said "ok". Issue 21 made
    those 3 ambiguous (their old side further down, their new side at their place); since
    issue 28 the new side at the line the patch states outranks the copy: the cell says what
    the release is, "already upstream", and nothing is written.
    """
    for v in ("0.5.14", "0.5.16"):
        releases.ensure_wheel(v)
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(_release_diff_family(
        tmp_path, EAGLE, "0.5.14", "0.5.16", ">=0.5.14,<0.5.17")))
    m = run_matrix(from_version="0.5.16", to_version="0.5.16", offline=True, jobs=1)
    new = m.rows[0]
    (cell,) = new.cells
    assert cell.status is CellStatus.ALREADY_APPLIED, new.to_json()
    assert new.verdict == "already upstream" and new.verdict != "ok"
    # what the check hands a push: the file as it is; no hunk is written a second time
    from ddtree_deploy.engine.check import check_series
    from ddtree_deploy.sandbox import pristine_files

    original = pristine_files("0.5.16", [EAGLE])
    report = check_series(load_family(tmp_path / "patches" / "eagle"), original)
    hunks = report.entries[0].files[0].hunks
    assert len(hunks) == 18 and all(h.status is HunkStatus.ALREADY_APPLIED for h in hunks)
    assert report.patched[EAGLE].patched == original[EAGLE]
    old = run_matrix(from_version="0.5.14", to_version="0.5.14", offline=True, jobs=1).rows[0]
    assert [c.status for c in old.cells] == [CellStatus.EXACT] and old.verdict == "ok"
