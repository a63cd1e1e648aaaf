"""patch_verify: placement proven after the fact (issue 21).

Reversing the hunks the engine reports applied, at the reported lines and fuzz, must give the
original back. The engine's real results pass (here, on every generated case of
test_patch_differential.py, and on every real corpus in test_patch_corpora.py); a result that
was tampered with the way a writer bug would (a line moved, doubled, dropped, a line outside
the hunks rewritten, a fuzzed context line replaced by the patch's) fails, naming the hunk. The
tampering stands in for an engine bug: a correct engine cannot produce one.
"""

from __future__ import annotations

import dataclasses

from ddtree_deploy.engine.patch_apply import HunkStatus, apply_file_patch
from ddtree_deploy.engine.patch_parse import parse_patch
from ddtree_deploy.engine.patch_verify import verify_round_trip

WORDS = "".join(f"line {i}\n" for i in range(1, 31))
TWO_HUNKS = ("--- a/f\n+++ b/f\n"
             "@@ -2,7 +2,7 @@\n line 2\n line 3\n line 4\n-line 5\n+FIVE\n line 6\n line 7\n line 8\n"
             "@@ -18,6 +18,7 @@\n line 18\n line 19\n line 20\n+added\n line 21\n line 22\n line 23\n")


def _applied(patch: str, text: str, fuzz: int = 0):
    (fp,) = parse_patch(patch, name="p.diff")
    res = apply_file_patch(fp, text, fuzz=fuzz)
    assert res.ok and all(h.status is not HunkStatus.FAILED for h in res.hunks)
    return fp, res


def test_a_real_result_is_proven():
    fp, res = _applied(TWO_HUNKS, WORDS)
    assert verify_round_trip(fp, WORDS, res) is None
    shifted = "x\n" * 4 + WORDS  # offset
    fp, res = _applied(TWO_HUNKS, shifted)
    assert res.hunks[0].status is HunkStatus.OFFSET and verify_round_trip(fp, shifted, res) is None


def test_a_hunk_reported_at_the_wrong_line_is_named():
    fp, res = _applied(TWO_HUNKS, WORDS)
    moved = dataclasses.replace(res, hunks=(dataclasses.replace(res.hunks[0], line=3), res.hunks[1]))
    err = verify_round_trip(fp, WORDS, moved)
    assert (err.index, err.line, err.patch_line) == (1, 3, 3)
    assert str(err).startswith("reversing hunk 1 @@ -2,7 +2,7 @@ (patch line 3) at line 3 does not give "
                               "the original back: its new lines are not at line 3")


def test_a_line_doubled_dropped_or_rewritten_outside_the_hunks_is_caught():
    fp, res = _applied(TWO_HUNKS, WORDS)
    for broken, hunk in ((res.text.replace("line 12\n", "line 12\nline 12\n"), 2),  # doubled: hunk 2 moved
                         (res.text.replace("line 12\n", ""), 2),                     # dropped: hunk 2 moved
                         (res.text.replace("line 3\n", "line 3\nline 3\n"), 1),    # doubled inside hunk 1
                         (res.text.replace("line 29\n", "line 29 \n"), 2),           # rewritten below hunk 2
                         (res.text.replace("added\n", "added\nadded\n"), 2)):        # the added line doubled
        err = verify_round_trip(fp, WORDS, dataclasses.replace(res, text=broken))
        assert err is not None and err.index == hunk, (broken, err)


def test_a_fuzzed_context_line_must_stay_the_files():
    # fuzz 1 ignores "line 2" and "line 8"; the file has "LINE 2": the result keeps the file's.
    text = WORDS.replace("line 2\n", "LINE 2\n")
    fp, res = _applied(TWO_HUNKS, text, fuzz=1)
    assert res.hunks[0].status is HunkStatus.FUZZ and verify_round_trip(fp, text, res) is None
    # a writer that put the patch's context line there instead changed a byte the patch may not
    wrong = dataclasses.replace(res, text=res.text.replace("LINE 2\n", "line 2\n"))
    err = verify_round_trip(fp, text, wrong)
    assert err is not None and err.index == 1 and "line 2 of the rebuilt text" in err.problem


def test_no_newline_crlf_and_new_files_round_trip():
    cases = [
        ("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n", "a\nb"),
        ("--- a/f\n+++ b/f\n@@ -1,2 +1,3 @@\n a\n b\n+c\n", "a\r\nb\r\n"),  # LF patch, CRLF file
        ("--- /dev/null\n+++ b/f\n@@ -0,0 +1,2 @@\n+x\n+y\n", None),
    ]
    for patch, text in cases:
        fp, res = _applied(patch, text)
        assert verify_round_trip(fp, text, res) is None, patch
    # the documented newline rule: lines written after a last line without one (fuzz ignored it)
    text = "p\nr\ns"
    fp, res = _applied("--- a/f\n+++ b/f\n@@ -2,4 +2,5 @@\n r\n s\n+t\n u\n w\n", text, fuzz=2)
    assert res.text == "p\nr\ns\nt\n" and verify_round_trip(fp, text, res) is None
    # any other newline change is not allowed
    err = verify_round_trip(fp, text, dataclasses.replace(res, text="p\nr\n\ns\nt\n"))
    assert err is not None and err.index == 1


def test_nothing_written_nothing_to_prove():
    (fp,) = parse_patch(TWO_HUNKS, name="p.diff")
    res = apply_file_patch(fp, "nothing like it\n")
    assert not res.ok and verify_round_trip(fp, "nothing like it\n", res) is None
