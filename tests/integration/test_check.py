"""check.py: the series applied in memory to real 0.5.12.post1 files, then byte-compiled.

GNU patch and git apply are the oracles for the bytes; every variant (offset,
fuzz, already applied, failed, compile error) is made by editing real files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.engine import check as C
from ddtree_deploy.engine.patch_apply import HunkStatus
from ddtree_deploy.engine.series import PatchEntry, load_family

SPEC = "sglang/srt/speculative/spec_info.py"
ARGS = "sglang/srt/server_args.py"
NEW = "sglang/srt/speculative/ddtree_test_utils.py"


@pytest.fixture(scope="module")
def series(test_family_dir):
    return load_family(test_family_dir)


@pytest.fixture
def files(series, release_tree) -> dict[str, bytes | None]:
    out = {}
    for p in series.touched_paths():
        f = release_tree / p
        out[p] = f.read_bytes() if f.exists() else None
    return out


def _oracle(tool: str, series, release_tree: Path, work: Path) -> dict[str, bytes]:
    """Apply the series with GNU patch or git apply to a real copy of the files."""
    for p in series.touched_paths():
        if (release_tree / p).exists():
            (work / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(release_tree / p, work / p)
    for e in series.entries:
        if isinstance(e, PatchEntry):
            cmd = (["patch", "-p1", "--batch", "--fuzz=0", "-i", str(e.file)] if tool == "patch"
                   else ["git", "apply", "-p1", "--unsafe-paths", str(e.file)])
            subprocess.run(cmd, cwd=work, check=True, capture_output=True)
        else:
            (work / e.dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(e.file, work / e.dest)
    return {p: (work / p).read_bytes() for p in series.touched_paths()}


@pytest.mark.parametrize("tool", ["patch", "git"])
def test_clean_check_matches_the_oracles(series, files, release_tree, tmp_path, tool):
    report = C.check_series(series, files)
    assert report.ok
    assert report.hunk_counts()["exact"] == 5 and sum(report.hunk_counts().values()) == 5
    expected = _oracle(tool, series, release_tree, tmp_path)
    assert {p: f.patched for p, f in report.patched.items()} == expected
    assert report.patched[NEW].original is None
    assert report.patched[SPEC].original == files[SPEC] and report.patched[SPEC].changed


def test_report_json_round_trips(series, files):
    doc = json.loads(json.dumps(C.check_series(series, files).to_json()))
    assert doc["ok"] is True and doc["family"] == "test-0.5.12"
    assert [e["name"] for e in doc["entries"]] == [e.name for e in series.entries]
    assert {f["path"] for f in doc["files"]} == set(series.touched_paths())
    new = next(f for f in doc["files"] if f["path"] == NEW)
    assert new["created"] is True and new["original_sha256"] is None


def test_offsets_are_allowed_and_reported(series, files):
    files[SPEC] = b"# three\n# lines\n# added\n" + files[SPEC]
    report = C.check_series(series, files)
    assert report.ok
    spec_hunks = [h for e in report.entries for f in e.files if f.path == SPEC for h in f.hunks]
    assert {h.status for h in spec_hunks} == {HunkStatus.OFFSET}
    assert {h.offset for h in spec_hunks} == {3}


def test_fuzz_only_when_allowed(series, files):
    # Change the first context line of 0002's server_args hunk (line 584 of the release).
    original = files[ARGS]
    files[ARGS] = original.replace(b"    speculative_eagle_topk: Optional[int] = None\n",
                                   b"    speculative_eagle_topk: Optional[int] = 1\n", 1)
    assert files[ARGS] != original
    strict = C.check_series(series, files, fuzz=0)
    assert not strict.ok
    loose = C.check_series(series, files, fuzz=1)
    assert loose.ok
    args_hunks = [h for e in loose.entries for f in e.files if f.path == ARGS for h in f.hunks]
    assert [h.status for h in args_hunks] == [HunkStatus.FUZZ]


def test_already_applied_series_is_recognised(series, files):
    done = C.check_series(series, files)
    patched = {p: f.patched for p, f in done.patched.items()}
    again = C.check_series(series, patched)
    assert again.ok
    assert all(f.status == C.ALREADY for e in again.entries for f in e.files)
    assert all(not f.changed for f in again.patched.values())


def test_a_failed_hunk_skips_later_entries_on_that_file(series, files):
    files[SPEC] = files[SPEC].replace(b"    DFLASH = auto()\n", b"    DFLASH_RENAMED = auto()\n", 1)
    report = C.check_series(series, files)
    assert not report.ok
    first, second = report.entries[0], report.entries[1]
    (spec1,) = first.files
    assert spec1.status == C.FAILED
    failed = [h for h in spec1.hunks if h.status is HunkStatus.FAILED]
    assert len(failed) == 1 and failed[0].index == 1 and failed[0].mismatches
    spec2 = next(f for f in second.files if f.path == SPEC)
    assert spec2.status == C.SKIPPED and "0001-spec-info-test-algorithm.patch" in spec2.message
    assert SPEC not in report.patched and ARGS in report.patched


def test_a_result_that_does_not_compile(series, files, tmp_path):
    # The add payload brings a syntax error: compile names the file and line.
    broken = tmp_path / "broken.py"
    broken.write_bytes(b'"""ok"""\n\ndef f(:\n    pass\n')
    add = series.entries[2]
    bad = type(series)(series.info, series.series_file,
                       series.entries[:2] + (type(add)(add.source, add.dest, add.line, broken, broken.read_bytes()),))
    report = C.check_series(bad, files)
    assert not report.ok and all(e.ok for e in report.entries)
    (err,) = report.compile_errors
    assert err.path == NEW and err.line == 3


def test_add_over_a_different_existing_file_fails(series, files):
    files[NEW] = b"x = 1\n"
    report = C.check_series(series, files)
    (fc,) = report.entries[2].files
    assert fc.status == C.FAILED and "already exists with different content" in fc.message


def test_a_patched_file_missing_from_this_release_fails(series, files):
    files[ARGS] = None  # recorded absent in the snapshot: not bad input, the series does not fit
    report = C.check_series(series, files)
    fc = next(f for f in report.entries[1].files if f.path == ARGS)
    assert fc.status == C.FAILED and "does not exist in this SGLang" in fc.message


def test_a_file_not_in_the_snapshot_is_bad_input(series, files):
    del files[ARGS]
    with pytest.raises(BadInput, match=r"0002-wire-test-algorithm.patch:\d+: sglang/srt/server_args.py "
                                       r"is not in the snapshot"):
        C.check_series(series, files)


def test_fuzz_out_of_range_is_bad_input(series, files):
    with pytest.raises(BadInput, match="fuzz 3 is out of range"):
        C.check_series(series, files, fuzz=3)


def test_crlf_bytes_survive_exactly(series, files):
    """A CRLF file stays CRLF: texts are never newline-translated."""
    crlf = files[ARGS].replace(b"\n", b"\r\n")
    files[ARGS] = crlf
    report = C.check_series(series, files)
    fc = next(f for f in report.entries[1].files if f.path == ARGS)
    assert fc.ok  # the engine matches LF hunks to a CRLF file and writes CRLF back
    patched = report.patched[ARGS].patched
    assert patched.count(b"\r\n") == crlf.count(b"\r\n") + 1
    assert b"\n" not in patched.replace(b"\r\n", b"")


def test_a_partly_applied_file_fails_unless_allowed(series, files):
    """Hunk 1 of the spec_info.py patch by hand on the real file, hunk 2 not (issue 11 item 10)."""
    text = files[SPEC].decode()
    done = ("    DFLASH = auto()\n"
            "    # Test series only: a stand-in algorithm name exercising the check flow.\n"
            "    DDTREE_TEST = auto()\n")
    half = dict(files, **{SPEC: text.replace("    DFLASH = auto()\n", done, 1).encode()})
    report = C.check_series(series, half)
    spec = report.entries[0].files[0]
    assert not report.ok and spec.status == C.PARTLY and not spec.ok
    assert [h.status for h in spec.hunks] == [HunkStatus.ALREADY_APPLIED, HunkStatus.OFFSET]
    assert SPEC not in report.patched  # nothing of a refused file is handed to a push
    later = [f for e in report.entries[1:] for f in e.files if f.path == SPEC]
    assert later and all(f.status == C.SKIPPED for f in later)
    assert json.loads(json.dumps(report.to_json()))["entries"][0]["files"][0]["status"] == "partly applied"

    allowed = C.check_series(series, half, allow_partly_applied=True)
    assert allowed.ok and allowed.entries[0].files[0].status == C.PARTLY
    # the rest applied: the same bytes as the series on the pristine file
    assert allowed.patched[SPEC].patched == C.check_series(series, files).patched[SPEC].patched


def test_a_placement_that_does_not_reverse_fails_the_check_naming_the_hunk(series, files, monkeypatch):
    """Issue 21: check proves every written file after the fact. A stand-in for an engine bug
    (the engine's result with its first hunk reported one line off) must fail the file, whatever
    the engine's verdict, and name the hunk; later entries on that file are skipped."""
    import dataclasses

    from ddtree_deploy.engine import patch_apply

    real = patch_apply.apply_file_patch

    def one_line_off(fp, text, *, fuzz=0):
        res = real(fp, text, fuzz=fuzz)
        if fp.path != SPEC or not res.ok:
            return res
        first = dataclasses.replace(res.hunks[0], line=res.hunks[0].line + 1)
        return dataclasses.replace(res, hunks=(first, *res.hunks[1:]))

    monkeypatch.setattr(C.patch_apply, "apply_file_patch", one_line_off)
    report = C.check_series(series, files)
    assert not report.ok and SPEC not in report.patched
    spec = report.entries[0].files[0]
    assert spec.status == C.FAILED and all(h.ok for h in spec.hunks)  # the engine said ok
    assert spec.message.startswith("placement not proven: reversing hunk 1 @@ ")
    assert "does not give the original back: its new lines are not at line" in spec.message
    monkeypatch.setattr(C.patch_apply, "apply_file_patch", real)
    assert C.check_series(series, files).ok  # the real engine's result is proven
