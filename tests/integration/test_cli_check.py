"""`ddtree-deploy check` and `ddtree-deploy snapshot release` through the CLI.

CliRunner for the cases, one real subprocess of the installed console script.
Every bad input: exit 2, exactly one "error:" line naming the problem, and
nothing written anywhere (snapshot folder unchanged, --write folder absent).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.release import snapshot as SN

VERSION = "0.5.12.post1"
SNAP = f"sglang-{VERSION}"
P1 = "0001-spec-info-test-algorithm.patch"
P2 = "0002-wire-test-algorithm.patch"
ARGS = "sglang/srt/server_args.py"


@pytest.fixture
def env(tmp_path, monkeypatch, data_dir, release_wheel):
    """A writable copy of the test family as the repo's only family; snapshots in tmp."""
    patches = tmp_path / "patches"
    shutil.copytree(data_dir / "patches", patches)
    shutil.copytree(data_dir / "payload", tmp_path / "payload")
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(patches))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def snap(env):
    return SN.snapshot_from_release(VERSION)


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    if root.exists():
        for p in sorted(root.rglob("*")):
            h.update(str(p.relative_to(root)).encode())
            if p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


# --- success ----------------------------------------------------------------------


def test_check_snapshot_ok(snap):
    r = _run("check", "--snapshot", SNAP)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("check ok: family test-0.5.12 on sglang-0.5.12.post1: hunks 5 exact")
    assert r.stderr.count("applied") == 5  # the table, for people, on stderr


def test_check_json_is_one_document_on_stdout(snap):
    r = _run("check", "--snapshot", SNAP, "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["snapshot"]["name"] == SNAP
    assert doc["snapshot"]["sglang_version"] == VERSION
    assert doc["hunks"]["exact"] == 5


def test_check_release_builds_the_snapshot(env):
    r = _run("check", "--release", VERSION)
    assert r.exit_code == 0, r.stderr
    assert (env / "snapshot" / SNAP / "MANIFEST.json").is_file()


def test_check_write_writes_what_gnu_patch_makes(snap, env, release_tree):
    out = env / "out"
    r = _run("check", "--snapshot", SNAP, "--write", str(out))
    assert r.exit_code == 0, r.stderr
    oracle = env / "oracle"
    series = load_family(env / "patches" / "test-0.5.12")
    for p in series.touched_paths():
        if (release_tree / p).exists():
            (oracle / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(release_tree / p, oracle / p)
    for name in (P1, P2):
        subprocess.run(["patch", "-p1", "--batch", "-i", str(env / "patches" / "test-0.5.12" / name)],
                       cwd=oracle, check=True, capture_output=True)
    for p in series.touched_paths():
        expected = (oracle / p).read_bytes() if (oracle / p).exists() else (env / "payload" / "ddtree_test_utils.py").read_bytes()
        assert (out / p).read_bytes() == expected


def test_forced_family_outside_its_range_is_checked_with_a_note(snap, env):
    _edit(env / "patches" / "test-0.5.12" / "family.toml", '">=0.5.12,<0.5.13"', '">=0.6"')
    r = _run("check", "--snapshot", SNAP, "--family", "test-0.5.12")
    assert r.exit_code == 0, r.stderr
    assert "does not cover" in r.stderr


# --- the check fails: exit 1 ------------------------------------------------------


def test_a_failing_hunk_exits_1_and_names_the_patch_line(snap, env):
    patch = env / "patches" / "test-0.5.12" / P1
    _edit(patch, "     EAGLE = auto()\n", "     EAGLE_ELSEWHERE = auto()\n")
    r = _run("check", "--snapshot", SNAP, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False
    hunk = doc["entries"][0]["files"][0]["hunks"][0]
    assert hunk["status"] == "failed"
    assert f"{P1}:{hunk['patch_line']}" in r.stderr
    assert "EAGLE_ELSEWHERE" in r.stderr  # the mismatch evidence
    assert "Traceback" not in r.stderr and "Exit" not in r.stderr  # a verdict, not a crash



def test_failure_evidence_is_never_wrapped_on_a_narrow_console(snap, env, monkeypatch):
    """A CI log (stderr piped, COLUMNS=40): the quoted source lines stay whole, one per line."""
    import importlib

    app_module = importlib.import_module("ddtree_deploy.cli.app")
    monkeypatch.setattr(app_module.err, "width", 40)  # what COLUMNS=40 gives the console at start
    long_name = "EAGLE_SOMEWHERE_ELSE_WITH_A_VERY_LONG_NAME_THAT_PASSES_FORTY_COLUMNS"
    patch = env / "patches" / "test-0.5.12" / P1
    _edit(patch, "     EAGLE = auto()\n", f"     {long_name} = auto()\n")
    r = _run("check", "--snapshot", SNAP)
    assert r.exit_code == 1
    evidence = [line for line in r.stderr.splitlines() if long_name in line]
    assert evidence and all(f"expected '    {long_name} = auto()'" in line for line in evidence), r.stderr
    failed = [line for line in r.stderr.splitlines() if f"{P1}:" in line and "failed on" in line]
    assert failed and "spec_info.py" in failed[0]  # the hunk line is whole too


LOOKALIKE = "sglang/srt/speculative/lookalike.py"


def _lookalike_family(env: Path) -> Path:
    """Issue 21's minimal case as a family: 0001 creates a module that holds a lookalike of
    0002's new side ("C = 0" among a b d e) five lines above 0002's real place."""
    words = "t1 t2 t3 t4 t5 a b C d e x1 x2 x3 x4 a b c d e z".split()
    body = "".join(f"+{w} = 0\n" for w in words)
    fam = env / "patches" / "lookalike"
    fam.mkdir()
    (fam / "family.toml").write_text('sglang = ">=9"\n')
    (fam / "series").write_text("0001-module.patch\n0002-change.patch\n")
    (fam / "0001-module.patch").write_text(
        f"--- /dev/null\n+++ b/{LOOKALIKE}\n@@ -0,0 +1,{len(words)} @@\n{body}")
    (fam / "0002-change.patch").write_text(
        f"--- a/{LOOKALIKE}\n+++ b/{LOOKALIKE}\n@@ -10,5 +10,5 @@\n a = 0\n b = 0\n-c = 0\n+C = 0\n d = 0\n e = 0\n")
    return fam


def test_a_lookalike_of_a_hunks_new_side_fails_the_check_naming_both_places(env):
    """Issue 21: `check ok ... 1 already-applied` with the change missing; now exit 1, both places."""
    _lookalike_family(env)
    out = env / "out"
    r = _run("check", "--release", VERSION, "--family", "lookalike", "--json", "--write", str(out))
    assert r.exit_code == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    (hunk,) = doc["entries"][1]["files"][0]["hunks"]
    assert (hunk["status"], hunk["nearest_line"], hunk["new_side_line"]) == ("failed", 15, 6)
    assert doc["hunks"]["already-applied"] == 0 and doc["ok"] is False
    flat = " ".join(r.stderr.split())
    assert ("0002-change.patch:3 hunk 1 @@ -10,5 +10,5 @@ failed on sglang/srt/speculative/lookalike.py: "
            "ambiguous: its old lines match at line 15 and its new lines at line 6") in flat, flat
    assert not (out / LOOKALIKE).exists()  # a file the series failed on is never written
    r = _run("check", "--release", VERSION, "--family", "lookalike")
    assert r.exit_code == 1 and r.stdout.startswith("check FAILED"), r.stdout


def test_check_explain_shows_both_places_of_an_ambiguous_hunk_side_by_side(env):
    """Issue 28 item 6: --explain puts the two places a refused hunk matches beside each other,
    as the file has them, so the engineer sees which one is the real place."""
    _lookalike_family(env)
    r = _run("check", "--release", VERSION, "--family", "lookalike", "--explain")
    assert r.exit_code == 1, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    top = next(k for k, line in enumerate(lines) if "old lines at line 15" in line)
    left, right = zip(*(line.split(" | ") for line in lines[top:top + 6]))
    assert lines[top - 1].strip() == "the patch puts hunk 1 at line 10; its two places rank alike:"
    assert (left[0].strip(), right[0].strip()) == ("old lines at line 15 (+5)", "new lines at line 6 (-4)")
    assert [c.split() for c in left[1:]] == [["15", "a", "=", "0"], ["16", "b", "=", "0"],
                                            ["-", "17", "c", "=", "0"], ["18", "d", "=", "0"],
                                            ["19", "e", "=", "0"]]
    assert [c.split() for c in right[1:]] == [["6", "a", "=", "0"], ["7", "b", "=", "0"],
                                             ["+", "8", "C", "=", "0"], ["9", "d", "=", "0"],
                                             ["10", "e", "=", "0"]]
    assert "'~' the file differs from the hunk there" in r.stderr
    # the JSON document carries the same evidence
    doc = json.loads(_run("check", "--release", VERSION, "--family", "lookalike", "--json").stdout)
    (hunk,) = doc["entries"][1]["files"][0]["hunks"]
    assert hunk["stated_line"] == 10
    assert [(p["side"], p["line"], p["offset"], p["fuzz"]) for p in hunk["places"]] == [
        ("old", 15, 5, 0), ("new", 6, -4, 0)]
    assert hunk["places"][1]["rows"][2] == {"tag": "+", "hunk": "C = 0", "file": "C = 0"}
    # without --explain, no side-by-side view
    r = _run("check", "--release", VERSION, "--family", "lookalike")
    assert " | " not in r.stderr


SPEC = "sglang/srt/speculative/spec_info.py"
HUNK1_DONE = ("    DFLASH = auto()\n"
              "    # Test series only: a stand-in algorithm name exercising the check flow.\n"
              "    DDTREE_TEST = auto()\n")


def _half_patched_snapshot(snap) -> None:
    """A host where someone applied hunk 1 of P1 by hand (spec_info.py), hunk 2 not."""
    files = snap.read_files()
    text = files[SPEC].decode()
    assert text.count("    DFLASH = auto()\n") == 1
    files[SPEC] = text.replace("    DFLASH = auto()\n", HUNK1_DONE).encode()
    SN.snapshot_from_files("half", VERSION, {"kind": "host", "host": "half"}, files)


def test_a_partly_applied_file_fails_the_check(snap, env):
    _half_patched_snapshot(snap)
    r = _run("check", "--snapshot", "half", "--json")
    assert r.exit_code == 1, r.stderr
    doc = json.loads(r.stdout)
    spec = doc["entries"][0]["files"][0]
    assert doc["ok"] is False and spec["status"] == "partly applied" and spec["ok"] is False
    # hunk 2 lands 2 lines down: the lines hunk 1 added are in the file already
    assert [(h["status"], h["offset"]) for h in spec["hunks"]] == [("already-applied", 0), ("offset", 2)]
    flat = " ".join(r.stderr.split())  # the console folds long lines
    assert "partly applied: hunk 1 already in the file, hunk 2 not" in flat
    assert "--allow-partly-applied" in flat
    assert "Traceback" not in r.stderr
    assert "is partly applied on this file" in flat  # P2's section on the same file: skipped
    r = _run("check", "--snapshot", "half")
    assert r.exit_code == 1 and r.stdout.startswith("check FAILED")
    assert "1 file partly applied" in r.stdout


def test_allow_partly_applied_applies_the_rest(snap, env, release_tree):
    _half_patched_snapshot(snap)
    out = env / "out"
    r = _run("check", "--snapshot", "half", "--allow-partly-applied", "--write", str(out))
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("check ok") and "partly applied" in r.stderr
    # the rest applied: the same file GNU patch makes from the pristine release
    oracle = env / "oracle"
    for p in load_family(env / "patches" / "test-0.5.12").touched_paths():
        if (release_tree / p).exists():
            (oracle / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(release_tree / p, oracle / p)
    for name in (P1, P2):
        subprocess.run(["patch", "-p1", "--batch", "-i", str(env / "patches" / "test-0.5.12" / name)],
                       cwd=oracle, check=True, capture_output=True)
    assert (out / SPEC).read_bytes() == (oracle / SPEC).read_bytes()


def test_a_compile_error_exits_1(snap, env):
    (env / "payload" / "ddtree_test_utils.py").write_text("def broken(:\n")
    r = _run("check", "--snapshot", SNAP)
    assert r.exit_code == 1
    assert "does not compile" in r.stderr and "ddtree_test_utils.py:1" in r.stderr
    assert r.stdout.startswith("check FAILED")


# --- bad input: exit 2, one line, nothing written ---------------------------------


def _family(env: Path) -> Path:
    return env / "patches" / "test-0.5.12"


def _absolute(env):
    p = _family(env) / P1
    text = p.read_text().replace("diff --git a/sglang/srt/speculative/spec_info.py b/sglang/srt/speculative/spec_info.py\n", "")
    p.write_text(text.replace("--- a/sglang/srt/speculative/spec_info.py", "--- /usr/lib/python3/spec_info.py"))


def _dotdot(env):
    _edit(_family(env) / P1, "+++ b/sglang/srt/speculative/spec_info.py", "+++ b/sglang/../../../../tmp/x.py")


def _truncated(env):
    p = _family(env) / P1
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[:-3]))  # the second hunk loses its last context lines


def _malformed(env):
    _edit(_family(env) / P1, "@@ -103,6 +105,9 @@", "@@ -103,six +105,9 @@")


def _not_in_snapshot(env):
    # A snapshot that does not cover server_args.py (taken for another series).
    SN.snapshot_from_release(VERSION, paths=["sglang/srt/speculative/spec_info.py"])


def _symlinked_entry(env: Path) -> None:
    """P2 replaced by a link to a copy of it outside the family folder (a valid patch, refused)."""
    outside = env / "elsewhere.patch"
    shutil.copyfile(_family(env) / P2, outside)
    (_family(env) / P2).unlink()
    (_family(env) / P2).symlink_to(outside)


def _long_line(env: Path) -> None:
    from ddtree_deploy.engine.patch_parse import MAX_LINE_BYTES

    _edit(_family(env) / P1, "+    DDTREE_TEST = auto()\n", "+    DDTREE_TEST = auto()  # " + "x" * MAX_LINE_BYTES + "\n")


def _many_hunks(env: Path) -> None:
    from ddtree_deploy.engine.patch_parse import MAX_HUNKS

    hunks = "".join(f"@@ -{3 * k + 1} +{3 * k + 1} @@\n-a\n+b\n" for k in range(MAX_HUNKS + 1))
    path = "sglang/srt/speculative/spec_info.py"
    (_family(env) / P2).write_text(f"--- a/{path}\n+++ b/{path}\n" + hunks)


def _new_file_with_mode(mode: str, body: str):
    """P2 replaced by git's patch creating sglang/srt/x.py with ``mode`` (as git diff writes it)."""
    def mutate(env: Path) -> None:
        (_family(env) / P2).write_text(
            f"diff --git a/sglang/srt/x.py b/sglang/srt/x.py\nnew file mode {mode}\nindex 0000000..f0a330b\n"
            f"--- /dev/null\n+++ b/sglang/srt/x.py\n@@ -0,0 +1 @@\n+{body}\n\\ No newline at end of file\n")
    return mutate


BAD = {
    "symlink-new-file": ([], _new_file_with_mode("120000", "spec_info.py"),
                         f"{P2}:2: the new file is a symlink ('new file mode 120000')"),
    "executable-new-file": ([], _new_file_with_mode("100755", "print(1)"),
                            f"{P2}:2: the new file is an executable file ('new file mode 100755')"),
    "symlinked-entry": ([], _symlinked_entry, f"series:3: entry '{P2}' is a symlink to"),
    "long-line": ([], _long_line, f"{P1}:9: a line of 65,56"),
    "too-many-hunks": ([], _many_hunks, f"{P2}:30003: more than 10000 hunks in one patch"),
    "neither": ([], None, "give exactly one of --snapshot NAME or --release VERSION"),
    "both": (["--release", VERSION], None, "give exactly one"),
    "missing-snapshot": (None, None, "no such snapshot"),
    "bad-range": ([], lambda env: _edit(_family(env) / "family.toml", '">=0.5.12,<0.5.13"', '">=0.5.12 <0.5.13"'),
                  "family.toml: line 3: sglang: '>=0.5.12 <0.5.13' is not a valid PEP 440 specifier; e.g. sglang = "),
    "missing-entry": ([], lambda env: (_family(env) / P2).unlink(), f"series:3: entry '{P2}' does not exist"),
    "duplicate-entry": ([], lambda env: open(_family(env) / "series", "a").write(P1 + "\n"),
                        "series:6: duplicate entry"),
    "absolute-path": ([], _absolute, "absolute path '/usr/lib/python3/spec_info.py'"),
    "dotdot-path": ([], _dotdot, "contains '..'"),
    "not-in-snapshot": ([], _not_in_snapshot, f"{ARGS} is not in the snapshot"),
    "malformed-diff": ([], _malformed, P1),
    "truncated-hunk": ([], _truncated, P1),
    "unknown-family": (["--family", "nope"], None, "no such family"),
    "tampered-snapshot": ([], lambda env: (env / "snapshot" / SNAP / "files" / ARGS).write_text("x = 1\n"),
                          "does not match MANIFEST.json"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(snap, env, case):
    extra, mutate, message = BAD[case]
    if mutate is not None:
        mutate(env)
    if case == "missing-snapshot":
        args = ["check", "--snapshot", "nope"]
    elif case == "neither":
        args = ["check"]
    else:
        args = ["check", "--snapshot", SNAP, *extra]
    before = _tree_digest(env / "snapshot")
    out = env / "written"
    r = _run(*args, "--write", str(out))
    assert r.exit_code == 2, (r.stdout, r.stderr)
    errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert message in errors[0], errors[0]
    assert _tree_digest(env / "snapshot") == before
    assert not out.exists()
    assert r.stdout == ""


def test_bad_input_with_json_prints_an_error_document(env):
    r = _run("check", "--json")
    assert r.exit_code == 2
    assert json.loads(r.stdout)["error"]["code"] == "bad-input"


def test_bad_family_with_release_writes_no_snapshot(env):
    open(_family(env) / "series", "a").write(P1 + "\n")
    r = _run("check", "--release", VERSION)
    assert r.exit_code == 2
    assert not (env / "snapshot").exists()


def test_fuzz_out_of_range_is_a_usage_error(snap):
    r = _run("check", "--snapshot", SNAP, "--fuzz", "3")
    assert r.exit_code == 2 and "--fuzz" in r.stderr


# --- snapshot release -------------------------------------------------------------


def test_snapshot_release(env):
    r = _run("snapshot", "release", VERSION)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith(f"snapshot {SNAP}: sglang {VERSION}, 3 files, 1 absent")
    r = _run("snapshot", "release", VERSION, "--name", "mine", "--json")
    doc = json.loads(r.stdout)
    assert doc["snapshot"] == "mine" and doc["manifest"]["sglang_version"] == VERSION
    assert (env / "snapshot" / "mine" / "MANIFEST.json").is_file()


@pytest.mark.parametrize("version, message", [("latest", "not a valid PEP 440 version")])
def test_snapshot_release_bad_version(env, version, message):
    r = _run("snapshot", "release", version)
    assert r.exit_code == 2 and message in r.stderr


# --- the installed console script, for real -----------------------------------------


def test_console_script_check_release(env):
    exe = Path(sys.executable).parent / "ddtree-deploy"
    proc = subprocess.run([str(exe), "check", "--release", VERSION, "--json"], capture_output=True,
                          text=True, env=dict(os.environ), timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and doc["family"] == "test-0.5.12"


def test_a_version_no_family_covers_is_bad_input(env):
    SN.snapshot_from_files("old", "0.4.0", {"kind": "host", "host": "old"},
                           {"sglang/srt/server_args.py": b"x = 1\n"})
    r = _run("check", "--snapshot", "old")
    assert r.exit_code == 2
    errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert errors == ["error: no family covers SGLang 0.4.0; families: test-0.5.12 (<0.5.13,>=0.5.12)"]


def test_a_symlink_escaping_the_snapshot_is_bad_input(snap, tmp_path):
    spec_dir = snap.files_dir / "sglang" / "srt" / "speculative"
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(spec_dir), elsewhere)
    os.symlink(elsewhere, spec_dir)
    r = _run("check", "--snapshot", SNAP)
    assert r.exit_code == 2
    assert "outside the package root" in r.stderr
