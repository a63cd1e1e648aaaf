"""Never a change twice, on SGLang's own release-to-release diffs (issue 11 item 10).

Real files from the PyPI wheels (ddtree_deploy/sandbox/hostenv.py), diffs made by GNU diff, GNU
patch -N as the oracle. Each case is one the engine used to get wrong:

- eagle_utils.py's 0.5.14 -> 0.5.16 change, checked against 0.5.16: every hunk is there
  already; the engine found 3 of the 18 again further down and wrote them a second time
  (sgl_build_tree_kernel_triton defined twice). GNU patch -N sees hunk 1 reversed and
  skips the file. Issue 21 made those 3 hunks ambiguous (old side below, new side at its
  place); since issue 28 places are ranked and the new side at the line the patch states
  (after the offsets of the hunks above) outranks the old side's copy further down: all 18
  are already applied, as GNU patch says. Alone (no hunk above to set the offset) neither
  side of those 3 is at the stated line, and they fail with both places.
- spec_info.py's 0.5.12.post1 -> 0.5.13 change, hunk 1 (it adds `import torch`), on
  0.5.16: made with 4 and 5 lines of context, the outermost context differs in 0.5.16, so
  only a reverse match WITH fuzz recognises it. GNU patch -F1/-F2 -N says "previously
  applied"; the engine failed it (its reverse match was exact only).
- the same hunk (3 lines of context) on 0.5.16 whose `from typing import` line a user
  edited: at fuzz 2 the old side's middle lines match three lines below the expected
  place, and both GNU patch and the old engine add a second `import torch` there. The
  new side matches one line below it (0.5.16 has a line more above), and the old side's
  compared lines are lines of that match: one place read both ways, with no hunk above to
  say whether the file is patched, so the hunk fails (rule engine-ambiguous of the
  differential test).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ddtree_deploy.engine.patch_apply import HunkStatus, apply_file_patch
from ddtree_deploy.engine.patch_parse import FilePatch, parse_patch
from ddtree_deploy.sandbox import pristine_files
from ddtree_testkit.system_tools import require

EAGLE = "sglang/srt/speculative/eagle_utils.py"
SPEC = "sglang/srt/speculative/spec_info.py"
TYPING = "from typing import TYPE_CHECKING, Callable, List, Optional, Tuple, Type, Union\n"

pytestmark = pytest.mark.network  # the wheels are fetched once into the cache, then offline
require("patch", "diff")  # the oracle and the diffs: a machine without them fails, never skips


def _release_diff(tmp: Path, path: str, old: str, new: str, context: int = 3) -> str:
    for side, version in (("a", old), ("b", new)):
        (tmp / side / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / side / path).write_bytes(pristine_files(version, [path])[path])
    run = subprocess.run(["diff", f"-U{context}", "--label", f"a/{path}", "--label", f"b/{path}",
                          f"a/{path}", f"b/{path}"], cwd=tmp, capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    return run.stdout


def _first_hunk(text: str) -> str:
    lines = text.splitlines(keepends=True)
    hunks = [k for k, line in enumerate(lines) if line.startswith("@@")]
    return "".join(lines[:hunks[1]])


def _gnu(tmp: Path, path: str, target: str, patch: str, fuzz: int) -> tuple[str, str]:
    """GNU patch -N on a copy of ``target``: (its output, the file afterwards)."""
    work = tmp / "gnu"
    shutil.rmtree(work, ignore_errors=True)
    (work / path).parent.mkdir(parents=True)
    (work / path).write_text(target)
    (tmp / "p.diff").write_text(patch)
    run = subprocess.run(["patch", "-p1", f"-F{fuzz}", "-N", "-r", "-", "--no-backup-if-mismatch",
                          "-i", str(tmp / "p.diff")], cwd=work, capture_output=True, text=True, timeout=60)
    return run.stdout, (work / path).read_text()


def test_eagle_utils_0_5_14_to_0_5_16_on_0_5_16_is_already_applied(tmp_path):
    patch = _release_diff(tmp_path, EAGLE, "0.5.14", "0.5.16")
    target = pristine_files("0.5.16", [EAGLE])[EAGLE].decode()
    (fp,) = parse_patch(patch, name="eagle.diff")
    assert len(fp.hunks) == 18
    res = apply_file_patch(fp, target)
    # Hunks 4-6 have their old side further down too, but their new side is where the patch
    # (with the hunks above) puts them: that place outranks the copy, they are already there.
    assert [h.status for h in res.hunks] == [HunkStatus.ALREADY_APPLIED] * 18
    assert [res.hunks[k].line for k in (3, 4, 5)] == [226, 281, 389]
    assert res.text == target  # nothing is written: not the 3 hunks a second time, not anything
    out, after = _gnu(tmp_path, EAGLE, target, patch, 0)
    assert "Reversed (or previously applied) patch detected" in out and after == target
    # and on 0.5.14 the same diff applies exactly, as GNU patch does it
    before = pristine_files("0.5.14", [EAGLE])[EAGLE].decode()
    res = apply_file_patch(fp, before)
    assert all(h.status is HunkStatus.EXACT for h in res.hunks) and res.text == target


@pytest.mark.parametrize("context,fuzz", [(4, 1), (4, 2), (5, 2)])
def test_spec_info_hunk_1_is_recognised_with_fuzz_as_gnu_patch_does(tmp_path, context, fuzz):
    patch = _first_hunk(_release_diff(tmp_path, SPEC, "0.5.12.post1", "0.5.13", context))
    target = pristine_files("0.5.16", [SPEC])[SPEC].decode()
    (fp,) = parse_patch(patch, name="spec.diff")
    assert ("+", "import torch") in fp.hunks[0].lines
    res = apply_file_patch(fp, target, fuzz=fuzz)
    assert res.hunks[0].status is HunkStatus.ALREADY_APPLIED and 1 <= res.hunks[0].fuzz <= fuzz
    assert res.text == target
    out, after = _gnu(tmp_path, SPEC, target, patch, fuzz)
    assert "Reversed (or previously applied) patch detected" in out and after == target
    # without fuzz neither recognises it: it fails, nothing is written
    assert apply_file_patch(fp, target).hunks[0].status is HunkStatus.FAILED


def test_fuzz_never_adds_import_torch_a_second_time(tmp_path):
    patch = _first_hunk(_release_diff(tmp_path, SPEC, "0.5.12.post1", "0.5.13"))
    original = pristine_files("0.5.16", [SPEC])[SPEC].decode()
    assert original.count(TYPING) == 1 and original.count("import torch\n") == 1
    # a host where someone added a name to the typing import (the outermost context line)
    target = original.replace(TYPING, TYPING.replace("Callable, ", "Any, Callable, "))
    (fp,) = parse_patch(patch, name="spec.diff")
    res = apply_file_patch(fp, target, fuzz=2)
    # 0.5.16 has one line more above (import warnings): the new side is one line lower than
    # the patch says, with fuzz 2; the old side's fuzz-2 match is three lines lower, on lines
    # of the new side's match: one place read both ways, and nothing above it tells which.
    # Failed, nothing written.
    (h,) = res.hunks
    assert (h.status, h.nearest_line, h.new_side_line) == (HunkStatus.FAILED, 7, 5)
    assert "(fuzz 2)" in h.reason and "read both ways" in h.reason and res.text is None
    # GNU patch -F2 -N finds the forward match two lines lower first and adds it again:
    # the divergence is deliberate (the differential test's rule engine-ambiguous).
    out, after = _gnu(tmp_path, SPEC, target, patch, 2)
    assert "with fuzz 2" in out and after.count("import torch\n") == 2


def test_a_later_hunk_alone_is_judged_at_its_place(tmp_path):
    """Every hunk of the eagle diff on 0.5.16, one at a time: its new side is found at its place;
    it is already applied unless its old side is in reach too (hunks 4-6: alone, no hunk above
    sets the offset, so neither side is at the line the hunk states and they rank alike)."""
    patch = _release_diff(tmp_path, EAGLE, "0.5.14", "0.5.16")
    target = pristine_files("0.5.16", [EAGLE])[EAGLE].decode()
    (fp,) = parse_patch(patch, name="eagle.diff")
    for h in fp.hunks:
        one = FilePatch(fp.patch_name, fp.header_line, fp.source_path, fp.target_path, (h,))
        (r,) = apply_file_patch(one, target).hunks
        if r.ambiguous:
            assert r.new_side_line == h.new_start, h.header  # where 0.5.16 has it
        else:
            assert r.status is HunkStatus.ALREADY_APPLIED, h.header
            assert r.line == h.new_start, h.header
