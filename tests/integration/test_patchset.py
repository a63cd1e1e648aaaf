"""Unit tests of the patch engine: parsing, every hunk status, line endings, bad input.

The engine's agreement with GNU patch and git apply on generated cases is in
test_patch_differential.py; the end of this file checks it on the real series too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.engine.patch_apply import HunkStatus, Mismatch, apply_file_patch
from ddtree_deploy.engine.patch_parse import FilePatch, parse_patch, strip_path
from ddtree_testkit.system_tools import require

require("git", "patch")  # the oracles (git writes the modes): a machine without them fails, never skips

REPO = Path(__file__).resolve().parent.parent.parent
SERIES_DIR = REPO / "patches" / "sglang-0.5.12"

WORDS = [f"line {i}\n" for i in range(1, 31)]
BASE = "".join(WORDS)

# Line 5 -> FIVE and a line added after line 20 (two hunks, three lines of context).
TWO_HUNKS = """\
diff --git a/pkg/f.py b/pkg/f.py
index 1111111..2222222 100644
--- a/pkg/f.py
+++ b/pkg/f.py
@@ -2,7 +2,7 @@
 line 2
 line 3
 line 4
-line 5
+FIVE
 line 6
 line 7
 line 8
@@ -18,6 +18,7 @@ def g():
 line 18
 line 19
 line 20
+added
 line 21
 line 22
 line 23
"""
PATCHED = BASE.replace("line 5\n", "FIVE\n").replace("line 20\n", "line 20\nadded\n")


def one(text: str, name: str = "p.patch") -> FilePatch:
    (fp,) = parse_patch(text, name=name)
    return fp


def bad(text: str, name: str = "p.patch") -> str:
    with pytest.raises(BadInput) as info:
        parse_patch(text, name=name)
    assert info.value.exit_code == 2
    assert "\n" not in info.value.message  # one line
    return info.value.message


# ----------------------------------------------------------------------------- parsing


def test_parse_git_patch_paths_lines_and_hunks():
    fp = one(TWO_HUNKS)
    assert (fp.source_path, fp.target_path, fp.path) == ("pkg/f.py", "pkg/f.py", "pkg/f.py")
    assert fp.header_line == 3 and not fp.is_new and not fp.is_deletion and not fp.crlf
    assert [h.header for h in fp.hunks] == ["@@ -2,7 +2,7 @@", "@@ -18,6 +18,7 @@"]
    assert [h.patch_line for h in fp.hunks] == [5, 14]
    assert fp.hunks[0].lines[3:5] == (("-", "line 5"), ("+", "FIVE"))
    assert (fp.hunks[1].prefix_context, fp.hunks[1].suffix_context) == (3, 3)


def test_parse_real_series_patches():
    """Every patch of the real series parses; each '@@' line becomes one hunk at its line."""
    patches = sorted(SERIES_DIR.glob("*.patch"))
    assert patches
    for path in patches:
        text = path.read_text()
        fps = parse_patch(text, name=path.name)
        lines = text.split("\n")
        assert [i + 1 for i, ln in enumerate(lines) if ln.startswith("@@ ")] == [
            h.patch_line for fp in fps for h in fp.hunks]
        for fp in fps:
            assert lines[fp.header_line - 1].startswith("--- ")
            assert fp.path.startswith("sglang/")


def test_strip_path():
    assert strip_path("a/sglang/srt/x.py") == "sglang/srt/x.py"
    assert strip_path("b/x.py") == "x.py"
    assert strip_path("a/b/c.py", strip=2) == "c.py"
    # absolute paths stay visible to the series layer's safety check
    assert strip_path("/etc/passwd") == "/etc/passwd"
    with pytest.raises(BadInput, match="no leading component"):
        strip_path("x.py")


def test_parse_plain_diff_with_timestamps_and_commit_message():
    text = ("From 123 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] x\n\n---\n f.py | 2 +-\n\n"
            "--- a/f.py\t2026-01-01 00:00:00.000000000 +0000\n"
            "+++ b/f.py\t2026-01-02 00:00:00.000000000 +0000\n"
            "@@ -1 +1 @@\n-old\n+new\n-- \n2.39.5\n\n")
    fp = one(text)
    assert fp.path == "f.py" and fp.header_line == 7
    assert fp.hunks[0].lines == (("-", "old"), ("+", "new"))


def test_parse_new_file_and_deletion_sections():
    new = one("--- /dev/null\n+++ b/n.py\n@@ -0,0 +1,2 @@\n+a\n+b\n")
    assert new.is_new and new.path == "n.py" and new.source_path is None
    gone = one("--- a/n.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n")
    assert gone.is_deletion and gone.path == "n.py"
    empty = one("diff --git a/e.py b/e.py\nnew file mode 100644\nindex 0000000..e69de29\n")
    assert empty.is_new and empty.hunks == () and empty.header_line == 1


def test_parse_no_newline_markers_both_sides():
    fp = one("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n")
    assert fp.hunks[0].old_no_eol and not fp.hunks[0].new_no_eol
    fp = one("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+b\n\\ No newline at end of file\n")
    assert fp.hunks[0].new_no_eol and not fp.hunks[0].old_no_eol


# ----------------------------------------------------------------------------- bad input


def test_bad_empty_patch():
    assert bad("").startswith("p.patch:1: empty patch")
    assert bad("  \n\n").startswith("p.patch:1: empty patch")


def test_bad_garbage_has_no_file_section():
    msg = bad("hello\nthis is not a diff\n", name="patches/x/0002.patch")
    assert msg.startswith("patches/x/0002.patch:1: ") and "no file section" in msg


def test_bad_malformed_hunk_header():
    msg = bad("--- a/f\n+++ b/f\n@@ -1,2 +1,2\n a\n-b\n+c\n")
    assert msg.startswith("p.patch:3: malformed hunk header '@@ -1,2 +1,2'")


def test_bad_truncated_hunk():
    msg = bad("--- a/f\n+++ b/f\n@@ -1,4 +1,4 @@\n a\n-b\n+c\n")
    assert msg.startswith("p.patch:3: truncated hunk @@ -1,4 +1,4 @@")
    assert "2 of 4 old" in msg


def test_bad_wrong_counts_too_few_lines():
    text = TWO_HUNKS.replace("@@ -2,7 +2,7 @@", "@@ -2,8 +2,8 @@")
    msg = bad(text, name="patches/x/0002.patch")
    assert msg.startswith("patches/x/0002.patch:5: hunk @@ -2,8 +2,8 @@ says 8 old lines but has 7 "
                          "and 8 new lines but has 7")
    assert "regenerate the patch" in msg


def test_bad_wrong_counts_too_many_lines():
    text = TWO_HUNKS.replace("@@ -2,7 +2,7 @@", "@@ -2,6 +2,6 @@")
    msg = bad(text)
    assert msg.startswith("p.patch:5: hunk @@ -2,6 +2,6 @@ says 6 old lines but has 7 and 6 new lines but has 7")


def test_bad_wrong_count_one_side():
    msg = bad("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n+d\n")
    assert msg.startswith("p.patch:3: hunk @@ -1,2 +1,2 @@ says 2 new lines but has 3")


def test_bad_git_binary_patch():
    text = ("diff --git a/w.bin b/w.bin\nindex 1..2 100644\nGIT binary patch\nliteral 3\n"
            "KcmZQzfB*mh00aO4\n\nliteral 0\nKcmV+b0RR6000031\n\n")
    assert bad(text).startswith("p.patch:3: binary patch")


def test_bad_binary_files_differ():
    assert bad("diff --git a/w.bin b/w.bin\nBinary files a/w.bin and b/w.bin differ\n").startswith(
        "p.patch:2: binary patch")


def test_bad_rename_only():
    text = "diff --git a/x.py b/y.py\nsimilarity index 100%\nrename from x.py\nrename to y.py\n"
    assert bad(text).startswith("p.patch:3: renames are not supported")


def test_bad_copy():
    text = "diff --git a/x.py b/y.py\nsimilarity index 100%\ncopy from x.py\ncopy to y.py\n"
    assert bad(text).startswith("p.patch:3: copies are not supported")


def test_bad_mode_change():
    assert bad("diff --git a/x.sh b/x.sh\nold mode 100644\nnew mode 100755\n").startswith(
        "p.patch:2: file mode changes are not supported")


def _git_diff(tmp: Path, change, *args: str) -> str:
    """``git diff`` of a real repository before and after ``change(root)`` (git writes the modes)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "GIT_CEILING_DIRECTORIES": str(tmp),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    root = tmp / "repo"
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "spec_info.py").write_text("x = 1\n")
    (root / "sglang" / "run.py").write_text("#!/bin/sh\necho hi\n")
    (root / "sglang" / "run.py").chmod(0o755)
    (root / "sglang" / "link.py").symlink_to("spec_info.py")
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *cmd], cwd=root, env=env, check=True)
    change(root / "sglang")
    subprocess.run(["git", "add", "-A"], cwd=root, env=env, check=True)
    return subprocess.run(["git", "diff", "--cached", *args], cwd=root, env=env, check=True,
                          capture_output=True, text=True).stdout


def _new_link(d: Path) -> None:
    (d / "new_link.py").symlink_to("spec_info.py")


def _new_executable(d: Path) -> None:
    (d / "tool.py").write_text("print(1)\n")
    (d / "tool.py").chmod(0o755)


def _relink(d: Path) -> None:
    (d / "link.py").unlink()
    (d / "link.py").symlink_to("other.py")


def _drop_link(d: Path) -> None:
    (d / "link.py").unlink()


@pytest.mark.parametrize("change,line,says", [
    (_new_link, 2, "the new file is a symlink ('new file mode 120000')"),
    (_new_executable, 2, "the new file is an executable file ('new file mode 100755')"),
    (_relink, 2, "the file is a symlink ('index "),
    (_drop_link, 2, "the deleted file is a symlink ('deleted file mode 120000')"),
])
def test_file_modes_other_than_a_regular_files_are_refused(tmp_path, change, line, says):
    """Issue 21 item 3: a symlink used to become a regular file holding the link's target, and
    mode 100755 was dropped; each is one line now, naming the mode and what to do."""
    msg = bad(_git_diff(tmp_path, change))
    assert msg.startswith(f"p.patch:{line}: {says}"), msg
    assert "regular files (mode 100644) only" in msg


def test_an_executable_files_content_change_is_fine(tmp_path):
    """index ... 100755: the file stays executable on the host (a deploy keeps a file's mode)."""
    text = _git_diff(tmp_path, lambda d: (d / "run.py").write_text("#!/bin/sh\necho bye\n"))
    assert "index " in text and " 100755\n" in text
    (fp,) = parse_patch(text, name="p.patch")
    res = apply_file_patch(fp, "#!/bin/sh\necho hi\n")
    assert res.ok and res.text == "#!/bin/sh\necho bye\n"


def _edit_spec(d: Path) -> None:
    (d / "spec_info.py").write_text("x = 1\ny = 2\n")


@pytest.mark.parametrize("args,line,says", [
    (["--color=always"], 1, "the patch holds terminal colour codes (ESC[...m), as git diff --color writes "
                            "them for a terminal; make it with git diff --no-color"),
    (["--word-diff"], 5, "hunk @@ -1 +1,2 @@ is word-diff output (git diff --word-diff)"),
    (["--word-diff=porcelain"], 5, "hunk @@ -1 +1,2 @@ is word-diff output (git diff --word-diff)"),
    (["--word-diff=color"], 1, "the patch holds terminal colour codes"),
])
def test_output_of_git_diff_options_is_named(tmp_path, args, line, says):
    """Issue 21 item 5: colour output used to be "empty patch", word-diff a line-count message."""
    msg = bad(_git_diff(tmp_path, _edit_spec, *args))
    assert msg.startswith(f"p.patch:{line}: {says}"), msg


def test_one_component_custom_prefixes_read_like_a_and_b(tmp_path):
    """git diff --src-prefix=orig/ --dst-prefix=new/: one component each, stripped as patch -p1 does."""
    text = _git_diff(tmp_path, _edit_spec, "--src-prefix=orig/", "--dst-prefix=new/")
    assert text.startswith("diff --git orig/sglang/spec_info.py new/sglang/spec_info.py\n")
    (fp,) = parse_patch(text, name="p.patch")
    assert fp.path == "sglang/spec_info.py"
    assert apply_file_patch(fp, "x = 1\n").text == "x = 1\ny = 2\n"


def test_a_doubled_slash_in_a_path_is_named():
    msg = bad("--- a//sglang/f.py\n+++ b//sglang/f.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert "path 'a//sglang/f.py' has an empty component (a doubled '/')" in msg, msg


def test_bad_rename_by_headers():
    msg = bad("--- a/x.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert msg.startswith("p.patch:1: the section renames x.py to y.py")


def test_bad_minus_header_without_plus():
    assert bad("--- a/f\n@@ -1 +1 @@\n-a\n+b\n").startswith(
        "p.patch:1: '--- ' file header is not followed by a '+++ ' header")


def test_bad_plus_header_without_minus():
    assert bad("+++ b/f\n@@ -1 +1 @@\n-a\n+b\n").startswith("p.patch:1: '+++ ' file header without")


def test_bad_hunk_outside_section():
    assert bad("@@ -1 +1 @@\n-a\n+b\n").startswith("p.patch:1: hunk header outside a file section")


def test_bad_headers_without_hunks():
    assert bad("--- a/f\n+++ b/f\n").startswith("p.patch:1: file section has headers but no hunk")


def test_bad_misordered_hunks():
    text = "--- a/f\n+++ b/f\n@@ -10,2 +10,2 @@\n a\n-b\n+c\n@@ -5,2 +5,2 @@\n a\n-b\n+c\n"
    msg = bad(text)
    assert msg.startswith("p.patch:7: hunk @@ -5,2 +5,2 @@ starts at old line 5, before the hunk above")


def test_bad_line_after_no_newline_marker():
    text = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n-a\n\\ No newline at end of file\n b\n+c\n"
    assert bad(text).startswith("p.patch:6: line after a '\\ No newline at end of file' marker")


def test_bad_no_newline_marker_in_earlier_hunk():
    text = ("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n\\ No newline at end of file\n"
            "@@ -8,2 +8,2 @@\n a\n-b\n+c\n")
    assert bad(text).startswith("p.patch:3: hunk @@ -1,2 +1,2 @@ marks a line")


def test_bad_stray_no_newline_marker():
    text = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n\nfree text\n\\ No newline at end of file\n"
    assert bad(text).startswith("p.patch:8: '\\ No newline at end of file' marker not directly after")


def test_bad_quoted_path():
    assert bad('--- "a/f\\tx"\n+++ "b/f\\tx"\n@@ -1 +1 @@\n-a\n+b\n').startswith(
        "p.patch:1: quoted (escaped) path")


def test_bad_both_dev_null():
    assert bad("--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+a\n").startswith(
        "p.patch:1: both sides of the file section are /dev/null")


def test_bad_path_without_prefix():
    msg = bad("--- f.py\n+++ f.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert msg.startswith("p.patch:1: path 'f.py' has no leading component to strip")


def test_bad_new_file_with_old_lines():
    assert bad("--- /dev/null\n+++ b/n\n@@ -1,1 +1,1 @@\n-a\n+b\n").startswith(
        "p.patch:3: hunk @@ -1,1 +1,1 @@ of a new file has old lines")


def test_bad_crlf_patch_against_lf_file():
    fp = one("--- a/f\r\n+++ b/f\r\n@@ -1,2 +1,2 @@\r\n a\r\n-b\r\n+c\r\n")
    assert fp.crlf and fp.path == "f"
    with pytest.raises(BadInput) as info:
        apply_file_patch(fp, "a\nb\n")
    assert info.value.message.startswith("p.patch:1: CRLF patch against LF file f")


def test_bad_fuzz_out_of_range():
    with pytest.raises(BadInput, match="fuzz 3 is out of range"):
        apply_file_patch(one(TWO_HUNKS), BASE, fuzz=3)


# ----------------------------------------------------------------------------- statuses


def test_exact():
    res = apply_file_patch(one(TWO_HUNKS), BASE)
    assert res.ok and res.text == PATCHED
    assert [(h.status, h.line, h.offset, h.fuzz) for h in res.hunks] == [
        (HunkStatus.EXACT, 2, 0, 0), (HunkStatus.EXACT, 18, 0, 0)]


def test_offset_accumulates_across_hunks():
    """Three lines above hunk 1: both hunks land 3 lines down; hunk 2's line counts hunk 1's change."""
    drifted = "x\ny\nz\n" + BASE
    res = apply_file_patch(one(TWO_HUNKS), drifted)
    assert res.text == "x\ny\nz\n" + PATCHED
    assert [(h.status, h.line, h.offset) for h in res.hunks] == [
        (HunkStatus.OFFSET, 5, 3), (HunkStatus.OFFSET, 21, 3)]


def test_offset_line_counts_earlier_hunks_changes():
    # hunk 1 adds two lines; hunk 2's landed line is in the text after hunk 1 (as GNU patch prints it)
    patch = TWO_HUNKS.replace("@@ -2,7 +2,7 @@", "@@ -2,7 +2,9 @@").replace("+FIVE\n", "+FIVE\n+5b\n+5c\n")
    patch = patch.replace("@@ -18,6 +18,7 @@", "@@ -18,6 +20,7 @@")
    res = apply_file_patch(one(patch), "w\n" + BASE)
    assert [(h.status, h.line, h.offset) for h in res.hunks] == [
        (HunkStatus.OFFSET, 3, 1), (HunkStatus.OFFSET, 21, 1)]


def test_equal_distance_prefers_the_later_line():
    # The hunk states line 5; its old side "p q r" is at lines 2 and 8, both 3 away.
    text = "o\np\nq\nr\no\no\no\np\nq\nr\no\n"
    fp = one("--- a/f\n+++ b/f\n@@ -5,3 +5,3 @@\n p\n-q\n+Q\n r\n")
    res = apply_file_patch(fp, text)
    assert (res.hunks[0].status, res.hunks[0].line, res.hunks[0].offset) == (HunkStatus.OFFSET, 8, 3)
    assert res.text == "o\np\nq\nr\no\no\no\np\nQ\nr\no\n"


def test_fuzz_1_ignores_one_context_line_at_each_end_and_keeps_the_files_version():
    edited = BASE.replace("line 2\n", "LINE TWO\n")  # hunk 1's first context line
    fp = one(TWO_HUNKS)
    at0 = apply_file_patch(fp, edited)
    assert not at0.ok and at0.text is None and at0.hunks[0].status is HunkStatus.FAILED
    res = apply_file_patch(fp, edited, fuzz=1)
    assert [(h.status, h.fuzz, h.line) for h in res.hunks] == [
        (HunkStatus.FUZZ, 1, 2), (HunkStatus.EXACT, 0, 18)]
    assert res.text == PATCHED.replace("line 2\n", "LINE TWO\n")


def test_fuzz_2():
    edited = BASE.replace("line 2\n", "L2\n").replace("line 3\n", "L3\n")
    fp = one(TWO_HUNKS)
    assert not apply_file_patch(fp, edited, fuzz=1).ok
    res = apply_file_patch(fp, edited, fuzz=2)
    assert (res.hunks[0].status, res.hunks[0].fuzz) == (HunkStatus.FUZZ, 2)
    assert res.text == PATCHED.replace("line 2\n", "L2\n").replace("line 3\n", "L3\n")


def test_fuzz_never_ignores_changed_lines():
    fp = one(TWO_HUNKS)
    res = apply_file_patch(fp, BASE.replace("line 5\n", "line five\n"), fuzz=2)
    assert res.hunks[0].status is HunkStatus.FAILED


def test_already_applied():
    res = apply_file_patch(one(TWO_HUNKS), PATCHED)
    assert [h.status for h in res.hunks] == [HunkStatus.ALREADY_APPLIED] * 2
    assert res.ok and res.text == PATCHED
    assert [h.line for h in res.hunks] == [2, 18]


def test_an_exact_new_side_at_its_line_outranks_a_fuzzy_lookalike_of_the_old_side():
    # The new side matches exactly at line 1, where the patch puts the hunk; at fuzz 1 the old
    # side also matches, at line 6 ("q b c r"). Evidence is ranked (issue 28 item 6): less fuzz
    # and the stated line both speak for line 1, so the change is there (it used to fail as
    # ambiguous, and re-running a patch on a patched tree failed on such lookalikes).
    patch = "--- a/f\n+++ b/f\n@@ -1,4 +1,5 @@\n a\n b\n+X\n c\n d\n"
    text = "a\nb\nX\nc\nd\nq\nb\nc\nr\n"
    res = apply_file_patch(one(patch), text, fuzz=1)
    assert (res.hunks[0].status, res.hunks[0].line, res.text) == (HunkStatus.ALREADY_APPLIED, 1, text)
    # at fuzz 0 the old side is nowhere: already applied
    res = apply_file_patch(one(patch), text)
    assert res.hunks[0].status is HunkStatus.ALREADY_APPLIED and res.text == text


def test_a_fuzzy_old_side_at_its_line_and_an_exact_new_side_elsewhere_rank_alike():
    # The old side matches at line 1, where the patch puts it, but only with fuzz 1 ("q b c r");
    # the new side matches exactly, at line 5. One place has less fuzz, the other is at the
    # stated line: neither outranks the other, so the hunk fails with both places (never
    # skipped for a lookalike, never made twice).
    patch = "--- a/f\n+++ b/f\n@@ -1,4 +1,5 @@\n a\n b\n+X\n c\n d\n"
    text = "q\nb\nc\nr\na\nb\nX\nc\nd\n"
    (h,) = (res := apply_file_patch(one(patch), text, fuzz=1)).hunks
    assert (h.status, h.ambiguous, h.nearest_line, h.new_side_line) == (HunkStatus.FAILED, True, 1, 5)
    assert "old lines match at line 1 (fuzz 1) and its new lines at line 5" in h.reason
    assert res.text is None and not res.ok
    # the evidence check --explain shows: both places, the hunk's lines and the file's there
    old, new = h.places
    assert (old.side, old.line, old.fuzz, old.offset, new.side, new.line, new.fuzz, new.offset) == (
        "old", 1, 1, 0, "new", 5, 0, 4)
    assert old.rows == ((" ", "a", "q"), (" ", "b", "b"), (" ", "c", "c"), (" ", "d", "r"))
    assert new.rows[2] == ("+", "X", "X") and h.stated_line == 1
    # without the already-applied copy, the same hunk does land with fuzz 1 ("q b c r")
    res = apply_file_patch(one(patch), "q\nb\nc\nr\n", fuzz=1)
    assert (res.hunks[0].status, res.hunks[0].line, res.text) == (HunkStatus.FUZZ, 1, "q\nb\nX\nc\nr\n")


def test_partly_applied():
    half = BASE.replace("line 5\n", "FIVE\n")
    res = apply_file_patch(one(TWO_HUNKS), half)
    assert [h.status for h in res.hunks] == [HunkStatus.ALREADY_APPLIED, HunkStatus.EXACT]
    assert res.text == PATCHED
    assert res.partly_applied  # the check layer refuses this unless asked (test_check.py)
    assert not apply_file_patch(one(TWO_HUNKS), BASE).partly_applied
    assert not apply_file_patch(one(TWO_HUNKS), PATCHED).partly_applied


def _words(text: str) -> str:
    return "".join(w + "\n" for w in text.split())


# issue 11 item 10, the minimal case: hunk 1 is already applied (HEAD), hunk 2 inserts X after
# the second "a b c". The file already has that X; a forward search from hunk 2's place used
# to find the first "a b c d e f" (above, still free) and write a second X there.
MIN_FILE = _words("HEAD a b c d e f mid a b c X d e f tail")
MIN_PATCH = ("--- a/f\n+++ b/f\n@@ -1,4 +1,4 @@\n-head\n+HEAD\n a\n b\n c\n"
             "@@ -9,6 +9,7 @@\n a\n b\n c\n+X\n d\n e\n f\n")


def test_never_applies_a_change_twice_minimal_case():
    # Hunk 2's new side is at line 9, where the patch (and hunk 1's offset) puts it; its old side
    # is free at line 2, away from it: the stated line outranks it, so hunk 2 is already there
    # (GNU patch -N says the same of the whole file); nothing is written twice.
    res = apply_file_patch(one(MIN_PATCH), MIN_FILE)
    assert [h.status for h in res.hunks] == [HunkStatus.ALREADY_APPLIED] * 2
    assert [h.line for h in res.hunks] == [1, 9] and res.text == MIN_FILE
    # one line more between the hunks: neither side of hunk 2 is where the patch puts it any
    # more, so they rank alike: failed with both places, nothing written
    res = apply_file_patch(one(MIN_PATCH), MIN_FILE.replace("mid\n", "mid\nmore\n"))
    assert [h.status for h in res.hunks] == [HunkStatus.ALREADY_APPLIED, HunkStatus.FAILED]
    assert (res.hunks[1].nearest_line, res.hunks[1].new_side_line) == (2, 10)
    assert res.text is None


def test_never_applies_a_change_twice_minimal_case_gnu_oracle(tmp_path: Path):
    """GNU patch -N sees hunk 1 reversed and skips the file: nothing may be written twice."""
    (tmp_path / "f").write_text(MIN_FILE)
    (tmp_path / "p.diff").write_text(MIN_PATCH)
    run = subprocess.run(["patch", "-p1", "-N", "-F0", "-r", "-", "-i", "p.diff"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert "Reversed (or previously applied)" in run.stdout
    assert (tmp_path / "f").read_text() == MIN_FILE


# issue 21, the minimal case: the patch was made against a file holding a lookalike of the
# hunk's new side ("a b C d e") above its real place ("a b c d e" at line 10). Applied to that
# file with five lines inserted at the top, the lookalike (line 6) is nearer the expected line
# (10) than the real place (15): the engine used to say already-applied and leave line 17 "c".
LOOK_FILE = _words("a b C d e x1 x2 x3 x4 a b c d e z")
LOOK_PATCH = "--- a/f.txt\n+++ b/f.txt\n@@ -10,5 +10,5 @@\n a\n b\n-c\n+C\n d\n e\n"


def test_a_lookalike_of_the_new_side_is_ambiguous_never_already_applied():
    target = _words("t1 t2 t3 t4 t5") + LOOK_FILE
    res = apply_file_patch(one(LOOK_PATCH), target)
    (h,) = res.hunks
    assert (h.status, h.line, h.nearest_line, h.new_side_line) == (HunkStatus.FAILED, None, 15, 6)
    assert h.reason.startswith("ambiguous: its old lines match at line 15 and its new lines at line 6")
    assert res.text is None and not res.ok
    # on the file it was made against, the old side is at line 10, where the patch puts it: that
    # outranks the lookalike (issue 28 item 6: a hunk on its own base release is never refused)
    res = apply_file_patch(one(LOOK_PATCH), LOOK_FILE)
    assert (res.hunks[0].status, res.hunks[0].line) == (HunkStatus.EXACT, 10)
    assert res.text == LOOK_FILE.replace("c\nd\ne\nz", "C\nd\ne\nz")
    # the lookalike above the stated line and the real place below it, at any distance: alike
    for above in (1, 4, 7):
        (h,) = apply_file_patch(one(LOOK_PATCH), _words("t " * above) + LOOK_FILE).hunks
        assert (h.nearest_line, h.new_side_line) == (10 + above, 1 + above), above
    # without the lookalike the hunk applies where GNU patch applies it; patched, it is there
    clean = target.replace("C\n", "Q\n")
    res = apply_file_patch(one(LOOK_PATCH), clean)
    assert (res.hunks[0].status, res.hunks[0].line, res.hunks[0].offset) == (HunkStatus.OFFSET, 15, 5)
    assert apply_file_patch(one(LOOK_PATCH), res.text).hunks[0].status is HunkStatus.ALREADY_APPLIED


def test_a_lookalike_of_the_new_side_gnu_oracle(tmp_path: Path):
    """GNU patch applies the minimal case at line 15 (offset 5): the real place is unpatched."""
    (tmp_path / "f.txt").write_text(_words("t1 t2 t3 t4 t5") + LOOK_FILE)
    (tmp_path / "p.diff").write_text(LOOK_PATCH)
    run = subprocess.run(["patch", "-p1", "-N", "-F0", "-i", "p.diff"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert "Hunk #1 succeeded at 15 (offset 5 lines)" in run.stdout, run.stdout


def test_a_side_at_the_stated_line_outranks_the_other_elsewhere():
    # One hunk, the line it states holds its new side; the old side is free further up: the
    # stated line outranks it, the change is there (issue 28 item 6; issue 21 failed it).
    patch = "--- a/f\n+++ b/f\n@@ -7,4 +7,5 @@\n p\n q\n+X\n r\n s\n"
    text = _words("p q r s t u p q X r s v")
    (h,) = apply_file_patch(one(patch), text).hunks
    assert (h.status, h.line) == (HunkStatus.ALREADY_APPLIED, 7)
    # the mirror: the old side at the stated line, the new side further up: applied there
    res = apply_file_patch(one(patch), _words("p q X r s u p q r s v"))
    assert (res.hunks[0].status, res.hunks[0].line) == (HunkStatus.EXACT, 7)
    # neither at the stated line (a line more on top): which one is real is not in the text
    (h,) = apply_file_patch(one(patch), _words("top") + text).hunks
    assert (h.status, h.nearest_line, h.new_side_line) == (HunkStatus.FAILED, 2, 8)
    # either side alone decides
    assert apply_file_patch(one(patch), _words("t u t u t u p q X r s v")).hunks[0].status is HunkStatus.ALREADY_APPLIED
    assert apply_file_patch(one(patch), _words("p q r s t u")).hunks[0].status is HunkStatus.OFFSET


def test_fuzzy_reverse_match():
    # The change is in the file, but its outer context lines were edited: exact reverse fails;
    # with fuzz 1 the reverse hunk matches where the patch says.
    patch = "--- a/f\n+++ b/f\n@@ -2,4 +2,5 @@\n k\n m\n+X\n n\n o\n"
    text = _words("a EDITED m X n EDITED2 b")
    res = apply_file_patch(one(patch), text, fuzz=1)
    assert (res.hunks[0].status, res.hunks[0].line, res.hunks[0].fuzz) == (HunkStatus.ALREADY_APPLIED, 2, 1)
    assert res.text == text
    assert apply_file_patch(one(patch), text).hunks[0].status is HunkStatus.FAILED  # fuzz 0
    # At fuzz 2 the old side (an insertion with two lines of context) has no line left to
    # compare, so it matches anywhere, with more fuzz than the new side at the stated line:
    # outranked, the change is there as at fuzz 1.
    res = apply_file_patch(one(patch), text, fuzz=2)
    assert (res.hunks[0].status, res.hunks[0].line, res.hunks[0].fuzz) == (HunkStatus.ALREADY_APPLIED, 2, 1)
    # With the old side's middle lines below too ("k m n z"), fuzz 1 reaches both: the new side
    # is at the stated line, the old side's match is not, so X is there (never added again).
    res = apply_file_patch(one(patch), text + _words("k m n z"), fuzz=1)
    assert (res.hunks[0].status, res.hunks[0].line) == (HunkStatus.ALREADY_APPLIED, 2)
    # a line more on top and neither is at the stated line: the two places rank alike
    (h,) = apply_file_patch(one(patch), _words("top") + text + _words("k m n z"), fuzz=1).hunks
    assert (h.status, h.nearest_line, h.new_side_line) == (HunkStatus.FAILED, 9, 3)


def test_both_sides_match_at_the_same_place_is_ambiguous():
    # Repeated lines: old side "a a a" and new side "a a a a" both match in "a a a a", the old
    # side on lines of the new side's match: one place read both ways, and no hunk above says
    # whether the file is patched (GNU patch applies it; a rule keeping the longer reading
    # would call it applied, one keeping the stated line would apply it: neither is in the text).
    patch = "--- a/f\n+++ b/f\n@@ -2,3 +2,4 @@\n a\n a\n a\n+a\n"
    (h,) = apply_file_patch(one(patch), _words("a a a a")).hunks
    assert (h.status, h.nearest_line, h.new_side_line) == (HunkStatus.FAILED, 2, 1) and h.ambiguous
    # a deletion of the first lines whose new side (one context line, anchored at the start) is
    # read inside the old side's place: the same lines read both ways, and no hunk above it says
    # whether the file is patched: ambiguous (GNU patch applies it)
    patch = "--- a/f\n+++ b/f\n@@ -1,3 +1 @@\n-a\n-b\n a\n"
    (h,) = apply_file_patch(one(patch), _words("a b a a")).hunks
    assert (h.status, h.nearest_line, h.new_side_line) == (HunkStatus.FAILED, 1, 1)
    assert "one inside the other: the same lines read both ways" in h.reason
    # (a file that starts with the old side always starts with this new side: never applied)
    assert apply_file_patch(one(patch), _words("a c d")).hunks[0].status is HunkStatus.ALREADY_APPLIED


# Issue 28 item 6, SGLang 0.5.13.post1 -> 0.5.14's metadata_kernel.py hunk 6 in small: seven
# equal lines where the patch adds an eighth, with three lines of context: six of them are the
# old side, all seven the new side, at the same line.
REPEAT_FILE = _words("p q r s1 s2 s3 s4 s5 s6 T T T T T T T z")
REPEAT_PATCH = ("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n p\n-q\n+Q\n r\n"
                "@@ -10,6 +10,7 @@\n T\n T\n T\n+T\n T\n T\n T\n")


def test_one_place_read_both_ways_follows_the_hunks_above_it():
    # On the file it was made against: hunk 1 applies, so hunk 2 (both readings at line 10) is
    # applied too; the engine used to fail it there, and a rule that keeps the longer reading
    # would skip it (the file would get Q but no eighth T).
    res = apply_file_patch(one(REPEAT_PATCH), REPEAT_FILE)
    assert [h.status for h in res.hunks] == [HunkStatus.EXACT, HunkStatus.EXACT]
    patched = REPEAT_FILE.replace("q\n", "Q\n").replace("T\nz", "T\nT\nz")
    assert res.text == patched
    # on the patched file: hunk 1 is there, so hunk 2 is too (never a ninth T)
    res = apply_file_patch(one(REPEAT_PATCH), patched)
    assert [h.status for h in res.hunks] == [HunkStatus.ALREADY_APPLIED] * 2 and res.text == patched
    # hunk 2 alone: nothing above it tells, so it fails with both readings
    alone = "--- a/f\n+++ b/f\n@@ -10,6 +10,7 @@\n T\n T\n T\n+T\n T\n T\n T\n"
    (h,) = apply_file_patch(one(alone), REPEAT_FILE).hunks
    assert (h.status, h.nearest_line, h.new_side_line) == (HunkStatus.FAILED, 10, 10)


# issue 11 item 11: inside a hunk, lines are read by its counts.
DASH_PATCH = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n x\n--- a\n+++ b\n y\n"


def test_removed_dash_dash_line_and_added_plus_plus_line_are_content():
    (fp,) = parse_patch(DASH_PATCH, name="p.diff")
    assert fp.hunks[0].lines == ((" ", "x"), ("-", "-- a"), ("+", "++ b"), (" ", "y"))
    res = apply_file_patch(fp, "x\n-- a\ny\n")
    assert res.ok and res.text == "x\n++ b\ny\n"


def test_dash_dash_content_lines_agree_with_gnu_patch(tmp_path: Path):
    (tmp_path / "f").write_text("x\n-- a\ny\n")
    (tmp_path / "p.diff").write_text(DASH_PATCH)
    run = subprocess.run(["patch", "-p1", "-F0", "-i", "p.diff"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    (fp,) = parse_patch(DASH_PATCH, name="p.diff")
    assert apply_file_patch(fp, "x\n-- a\ny\n").text == (tmp_path / "f").read_text()


def test_two_sections_after_a_dash_dash_hunk():
    # the counts end the hunk; a real header pair after it still opens the next section
    text = DASH_PATCH + "--- a/g\n+++ b/g\n@@ -1 +1 @@\n-1\n+2\n"
    fps = parse_patch(text, name="p.diff")
    assert [fp.path for fp in fps] == ["f", "g"]


# issue 11 item 13: limits against hostile input, one line each (BadInput: exit 2).
def test_limit_patch_size(monkeypatch):
    from ddtree_deploy.engine import patch_parse

    monkeypatch.setattr(patch_parse, "MAX_PATCH_BYTES", 100)
    with pytest.raises(BadInput, match=r"^p.diff:1: the patch is .* bytes, over the limit of 100 bytes"):
        parse_patch(TWO_HUNKS + "\n" * 100, name="p.diff")


def test_limit_patch_size_counts_bytes_not_characters():
    """Issue 21 item 4: 4 MiB is bytes. 1.5 M two-byte characters (3 MB) pass; 2.2 M (4.4 MB)
    are refused though they are fewer than 4 Mi characters."""
    from ddtree_deploy.engine.patch_parse import MAX_PATCH_BYTES

    def patch(chars: int) -> str:
        line = "é" * 1000
        body = f"+{line}\n" * (chars // 1000)
        return f"--- /dev/null\n+++ b/f\n@@ -0,0 +1,{chars // 1000} @@\n" + body

    assert len(parse_patch(patch(1_500_000), name="p.diff")[0].hunks[0].texts) == 1500
    text = patch(2_200_000)
    assert len(text) < MAX_PATCH_BYTES < len(text.encode())
    with pytest.raises(BadInput, match=r"^p.diff:1: the patch is 4,40\d,\d{3} bytes, over the limit of 4,194,304 bytes"):
        parse_patch(text, name="p.diff")


def test_limit_hunk_count():
    from ddtree_deploy.engine.patch_parse import MAX_HUNKS

    hunks = "".join(f"@@ -{3 * k + 1} +{3 * k + 1} @@\n-a\n+b\n" for k in range(MAX_HUNKS + 1))
    with pytest.raises(BadInput, match=rf"^p.diff:{3 * MAX_HUNKS + 3}: more than {MAX_HUNKS} hunks"):
        parse_patch("--- a/f\n+++ b/f\n" + hunks, name="p.diff")


def test_limit_hunk_lines():
    from ddtree_deploy.engine.patch_parse import MAX_HUNK_LINES

    text = f"--- a/f\n+++ b/f\n@@ -1,1 +1,{MAX_HUNK_LINES} @@\n-a\n" + "+b\n" * MAX_HUNK_LINES
    with pytest.raises(BadInput, match=rf"^p.diff:3: hunk @@ -1,1 \+1,{MAX_HUNK_LINES} @@ has "):
        parse_patch(text, name="p.diff")


def test_limit_line_length():
    from ddtree_deploy.engine.patch_parse import MAX_LINE_BYTES

    text = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+" + "b" * (MAX_LINE_BYTES + 1) + "\n"
    with pytest.raises(BadInput, match=r"^p.diff:5: a line of 65,537 bytes, over the limit of 65,536 bytes"):
        parse_patch(text, name="p.diff")


def test_limit_line_length_counts_the_source_lines_content_in_bytes():
    """Issue 21 item 4: the limit is on the source line (not its tag and newline), in bytes."""
    from ddtree_deploy.engine.patch_parse import MAX_LINE_BYTES

    def one_line(content: str, eol: str = "\n") -> str:
        return f"--- a/f{eol}+++ b/f{eol}@@ -1 +1 @@{eol}-a{eol}+{content}{eol}"

    for content, eol in (("b" * 65_535, "\n"), ("b" * MAX_LINE_BYTES, "\n"), ("b" * MAX_LINE_BYTES, "\r\n")):
        (fp,) = parse_patch(one_line(content, eol), name="p.diff")  # was refused as 65,537 and more
        assert fp.hunks[0].texts[1].removesuffix("\r") == content
    two_bytes = "é" * (MAX_LINE_BYTES // 2 + 1)  # 32,769 characters, 65,538 bytes
    with pytest.raises(BadInput, match=r"^p.diff:5: a line of 65,538 bytes, over the limit"):
        parse_patch(one_line(two_bytes), name="p.diff")
    assert parse_patch(one_line("é" * (MAX_LINE_BYTES // 2)), name="p.diff")  # 65,536 bytes


def test_failed_reports_nearest_location_and_differing_lines():
    edited = BASE.replace("line 4\n", "line four\n").replace("line 6\n", "line six\n")
    res = apply_file_patch(one(TWO_HUNKS), edited)
    h1, h2 = res.hunks
    assert not res.ok and res.text is None
    assert (h1.status, h1.line, h1.nearest_line) == (HunkStatus.FAILED, None, 2)
    assert h1.mismatches == (Mismatch(4, "line 4", "line four"), Mismatch(6, "line 6", "line six"))
    assert h2.status is HunkStatus.EXACT  # later hunks still get their verdict


def test_failed_past_end_of_file():
    res = apply_file_patch(one("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"), "a\nb\n")
    (h,) = res.hunks
    assert h.status is HunkStatus.FAILED and h.nearest_line == 1
    assert h.mismatches == (Mismatch(3, "c", None),)


def test_hunk_never_lands_above_an_earlier_hunks_change():
    # Hunk 2's old side occurs only above hunk 1's change: GNU patch refuses it, so do we.
    text = "k\nm\nA\nB\nC\nq\nr\n"
    patch = ("--- a/f\n+++ b/f\n@@ -3,3 +3,3 @@\n A\n-B\n+b\n C\n"
             "@@ -8,2 +8,2 @@\n k\n-m\n+M\n")
    res = apply_file_patch(one(patch), text)
    assert [h.status for h in res.hunks] == [HunkStatus.EXACT, HunkStatus.FAILED]


def test_hunk_at_start_with_short_leading_context_is_anchored():
    # Leading context 0 < trailing 3 and stated line 1: it may only match line 1.
    patch = "--- a/f\n+++ b/f\n@@ -1,3 +1,4 @@\n+top\n a\n b\n c\n"
    assert apply_file_patch(one(patch), "a\nb\nc\nd\n").text == "top\na\nb\nc\nd\n"
    res = apply_file_patch(one(patch), "new\na\nb\nc\nd\n")
    assert res.hunks[0].status is HunkStatus.FAILED


def test_hunk_at_end_with_short_trailing_context_is_anchored():
    patch = "--- a/f\n+++ b/f\n@@ -2,3 +2,4 @@\n a\n b\n c\n+end\n"
    assert apply_file_patch(one(patch), "z\na\nb\nc\n").text == "z\na\nb\nc\nend\n"
    assert not apply_file_patch(one(patch), "z\na\nb\nc\nmore\n").ok


# ----------------------------------------------------------------------------- line endings


def test_no_final_newline_removed_by_patch():
    patch = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+b\n\\ No newline at end of file\n"
    assert apply_file_patch(one(patch), "a\nb\n").text == "a\nb"


def test_no_final_newline_added_by_patch():
    patch = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"
    assert apply_file_patch(one(patch), "a\nb").text == "a\nb\n"
    # the old side says "no newline": a last line that has one does not match ...
    assert not apply_file_patch(one(patch), "a\nb\nc\n").ok
    # ... and "a\nb\n" is the patched text itself
    assert apply_file_patch(one(patch), "a\nb\n").hunks[0].status is HunkStatus.ALREADY_APPLIED


def test_no_final_newline_kept_when_untouched():
    patch = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n-a\n+A\n b\n c\n"
    assert apply_file_patch(one(patch), "a\nb\nc\nd").text == "A\nb\nc\nd"


def test_no_final_newline_on_both_sides_of_context():
    patch = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\n+A\n b\n\\ No newline at end of file\n"
    assert apply_file_patch(one(patch), "a\nb").text == "A\nb"
    assert not apply_file_patch(one(patch), "a\nb\n").ok


def test_crlf_file_with_lf_patch_keeps_crlf():
    crlf = BASE.replace("\n", "\r\n")
    res = apply_file_patch(one(TWO_HUNKS), crlf)
    assert res.ok and res.text == PATCHED.replace("\n", "\r\n")


def test_crlf_file_with_crlf_patch():
    crlf = BASE.replace("\n", "\r\n")
    body = TWO_HUNKS.split("@@ -2,7", 1)[1]
    patch = TWO_HUNKS.split("@@ -2,7", 1)[0] + "@@ -2,7" + body.replace("\n", "\r\n")
    fp = one(patch)
    assert fp.crlf
    res = apply_file_patch(fp, crlf)
    assert res.ok and res.text == PATCHED.replace("\n", "\r\n")


def test_a_crlf_to_lf_patch_made_on_the_crlf_file_converts_it(tmp_path: Path):
    # SGLang 0.5.13.post1 -> 0.5.14 turned apertus.py from CRLF to LF: the diff's old lines end
    # in CR (it was made on the CRLF file byte for byte), its new lines do not. The added lines
    # end as the patch writes them, as GNU patch writes them; a patch made on an LF copy (no
    # CR anywhere) still gets the file's CRLF (test_crlf_file_with_lf_patch_keeps_crlf).
    from ddtree_deploy.engine.patch_verify import verify_round_trip

    text = "a\r\nb\r\nc\r\nd\r\n"
    patch = "--- a/f\n+++ b/f\n@@ -1,4 +1,4 @@\n a\r\n-b\r\n-c\r\n+b\n+c\n d\r\n"
    res = apply_file_patch(one(patch), text)
    assert res.ok and res.text == "a\r\nb\nc\nd\r\n"
    assert verify_round_trip(one(patch), text, res) is None
    (tmp_path / "f").write_bytes(text.encode())
    (tmp_path / "p.diff").write_bytes(patch.encode())
    subprocess.run(["patch", "-p1", "-s", "-i", "p.diff"], cwd=tmp_path, check=True, timeout=30)
    assert (tmp_path / "f").read_bytes().decode() == res.text


def test_crlf_file_without_final_newline():
    patch = "--- a/f\n+++ b/f\n@@ -1,2 +1,3 @@\n a\n+x\n b\n\\ No newline at end of file\n"
    assert apply_file_patch(one(patch), "a\r\nb").text == "a\r\nx\r\nb"


def test_mixed_line_endings_match_byte_for_byte():
    # Not every line is CRLF, so nothing is converted: CR is content, as for GNU patch.
    text = "a\r\nb\nc\n"
    patch = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\r\n-b\n+B\n c\n"
    assert apply_file_patch(one(patch), text).text == "a\r\nB\nc\n"


# ----------------------------------------------------------------------------- files


def test_new_file():
    fp = one("--- /dev/null\n+++ b/n.py\n@@ -0,0 +1,2 @@\n+a\n+b\n")
    res = apply_file_patch(fp, None)
    assert res.ok and res.text == "a\nb\n" and res.hunks[0].status is HunkStatus.EXACT
    assert apply_file_patch(fp, "a\nb\n").hunks[0].status is HunkStatus.ALREADY_APPLIED
    clash = apply_file_patch(fp, "other\n")
    assert not clash.ok and clash.text is None and "already exists" in clash.hunks[0].reason
    assert clash.hunks[0].mismatches[0] == Mismatch(1, "a", "other")


def test_new_empty_file_from_git():
    fp = one("diff --git a/e.py b/e.py\nnew file mode 100644\nindex 0000000..e69de29\n")
    assert apply_file_patch(fp, None).text == ""
    res = apply_file_patch(fp, "x\n")
    assert not res.ok and "not empty" in res.hunks[0].reason


def test_deletion():
    fp = one("--- a/n.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n")
    res = apply_file_patch(fp, "a\nb\n")
    assert res.ok and res.text is None and res.hunks[0].status is HunkStatus.EXACT
    assert apply_file_patch(fp, None).hunks[0].status is HunkStatus.ALREADY_APPLIED
    more = apply_file_patch(fp, "a\nb\nc\n")
    assert not more.ok and "expecting 2 lines, but it has 3" in more.hunks[0].reason


def test_missing_file_fails_every_hunk():
    res = apply_file_patch(one(TWO_HUNKS), None)
    assert not res.ok and res.text is None
    assert all(h.status is HunkStatus.FAILED and "does not exist" in h.reason for h in res.hunks)


# ----------------------------------------------------------------------------- real series


def test_real_series_against_gnu_patch(tmp_path: Path, release_tree: Path):
    """The series, in order, on SGLang 0.5.12.post1's own files: same verdicts and texts as GNU patch."""
    series = [ln.strip() for ln in (SERIES_DIR / "series").read_text().splitlines()
              if ln.strip() and not ln.startswith("#") and not ln.startswith("add ")]
    texts: dict[str, str | None] = {}
    gnu_root = tmp_path / "gnu"
    for name in series:
        for fp in parse_patch((SERIES_DIR / name).read_text(), name=name):
            if fp.path not in texts:
                src = release_tree / fp.path
                texts[fp.path] = src.read_text() if src.exists() else None
                if src.exists():
                    (gnu_root / fp.path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, gnu_root / fp.path)
    for name in series:
        engine_ok = True
        for fp in parse_patch((SERIES_DIR / name).read_text(), name=name):
            res = apply_file_patch(fp, texts[fp.path])
            engine_ok &= res.ok and all(h.status is not HunkStatus.ALREADY_APPLIED for h in res.hunks)
            if res.ok:
                texts[fp.path] = res.text
        run = subprocess.run(["patch", "-p1", "-F0", "-N", "-r", "-", "--no-backup-if-mismatch",
                              "-i", str(SERIES_DIR / name)], cwd=gnu_root, capture_output=True, text=True)
        assert engine_ok == (run.returncode == 0), f"{name}: engine ok={engine_ok}\n{run.stdout}"
    for path, text in texts.items():
        on_disk = gnu_root / path
        assert (on_disk.read_text() if on_disk.exists() else None) == text, path


# ----------------------------------------------------------------------------- robustness

_REAL = sorted(SERIES_DIR.glob("*.patch"))


@settings(max_examples=int(os.environ.get("DDTREE_MANGLE_EXAMPLES", "400")), deadline=None,
          derandomize=True, database=None)
@given(data=st.data())
def test_mangled_real_patches_raise_only_bad_input(data, release_tree):
    """Cut, drop, duplicate or renumber lines of a real patch: the parser answers with a result or
    one BadInput line naming the patch and a line in it, never another exception."""
    path = data.draw(st.sampled_from(_REAL))
    lines = path.read_text().split("\n")
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["drop", "dup", "cut", "digit", "crlf", "blank"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines = lines[:i]
        elif op == "digit":
            lines[i] = lines[i].replace("3", "4", 1).replace("7", "1", 1)
        elif op == "crlf":
            lines[i] += "\r"
        else:
            lines[i] = ""
        if not lines:
            break
    text = "\n".join(lines)
    try:
        fps = parse_patch(text, name=path.name)
    except BadInput as exc:
        assert exc.message.startswith(f"{path.name}:") and "\n" not in exc.message
        line = int(exc.message.split(":")[1])
        assert 1 <= line <= max(len(lines), 1)
        return
    for fp in fps:  # what parses must also apply (or fail) cleanly on the real file
        src = release_tree / fp.path
        if src.exists():
            try:
                apply_file_patch(fp, src.read_text())
            except BadInput as exc:
                assert "CRLF patch against LF file" in exc.message


@settings(max_examples=300, deadline=None)
@given(file=st.lists(st.sampled_from("abcd"), max_size=40),
       pattern=st.lists(st.sampled_from("abcdz"), min_size=1, max_size=8),
       first=st.integers(-3, 45), no_eol=st.booleans())
def test_nearest_match_equals_a_brute_force_count(file, pattern, first, no_eol):
    """The indexed, pruned nearest-match search (issue 11 item 13) against counting every start."""
    from ddtree_deploy.engine.patch_apply import _Applier, _Lines, _Pattern

    text = "".join(w + "\n" for w in file)
    if no_eol and text:
        text = text[:-1]
    src = _Lines.from_text(text, crlf=False)
    fp = FilePatch("p", 1, "f", "f", ())
    ap = _Applier(fp, src, False, "\n", 0)
    pat = _Pattern(list(pattern), True, 0, 0, [])

    def hits(s):
        return sum(1 for k, w in enumerate(pattern)
                   if 0 <= s - 1 + k < len(file) and file[s - 1 + k] == w
                   and (src.eols[s - 1 + k] != "") == pat.has_nl(k))

    last = max(len(file) - len(pattern) + 1, 1)
    expected = min(range(1, last + 1), key=lambda s: (-hits(s), abs(s - first), -s))
    line, _ = ap._nearest(pat, first)
    assert line == expected
