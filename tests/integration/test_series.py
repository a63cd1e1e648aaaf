"""series.py: loading a family, its range, its entries, and path safety.

Each bad-input case edits a copy of the real test family (tests/data) and
checks the one-line message names the file, the line and the problem.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import BadInput, EXIT_BAD_INPUT
from ddtree_deploy.engine import series as S

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def fam(tmp_path, test_family_dir, data_dir) -> Path:
    """A writable copy of the test family, laid out as in the repository."""
    dest = tmp_path / "patches" / "test-0.5.12"
    shutil.copytree(test_family_dir, dest)
    shutil.copytree(data_dir / "payload", tmp_path / "payload")
    return dest


def _headers(patch: Path) -> list[str]:
    return [l[6:] for l in patch.read_text().splitlines() if l.startswith("+++ b/")]


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, l in enumerate(path.read_text().splitlines(), 1) if needle in l)


# --- the good family ----------------------------------------------------------


def test_load_test_family(test_family_dir):
    s = S.load_family(test_family_dir)
    assert s.name == "test-0.5.12"
    assert str(s.specifier) == "<0.5.13,>=0.5.12"
    assert [(e.kind, e.line) for e in s.entries] == [("patch", 2), ("patch", 3), ("add", 5)]
    p1, p2 = (test_family_dir / e.name for e in s.entries[:2])
    expected = list(dict.fromkeys(_headers(p1) + _headers(p2)))
    expected.append("sglang/srt/speculative/ddtree_test_utils.py")
    assert list(s.touched_paths()) == expected
    add = s.entries[2]
    assert add.content == (test_family_dir.parent.parent / "payload" / "ddtree_test_utils.py").read_bytes()


def test_origins_name_the_patch_header_line(test_family_dir):
    s = S.load_family(test_family_dir)
    origin = s.origins()["sglang/srt/server_args.py"]
    patch = test_family_dir / "0002-wire-test-algorithm.patch"
    assert origin.endswith(f"0002-wire-test-algorithm.patch:{_line_of(patch, '--- a/sglang/srt/server_args.py')}")


def test_covers_and_pick_family(test_family_dir):
    info = S.read_family_info(test_family_dir)
    assert info.covers("0.5.12.post1") and info.covers("0.5.12")
    assert not info.covers("0.5.13") and not info.covers("0.5.11")
    assert S.pick_family("0.5.12.post1", [info]) is info


def test_pick_family_none_overlap_and_invalid(tmp_path, fam):
    info = S.read_family_info(fam)
    with pytest.raises(BadInput, match="no family covers SGLang 0.5.14"):
        S.pick_family("0.5.14", [info])
    other = tmp_path / "patches" / "wide"
    other.mkdir()
    (other / "family.toml").write_text('sglang = ">=0.5"\n')
    with pytest.raises(BadInput, match="covered by several families"):
        S.pick_family("0.5.12.post1", S.families(tmp_path / "patches"))
    with pytest.raises(BadInput, match="not a valid PEP 440 version"):
        S.pick_family("next", [info])


def test_families_lists_folders_with_family_toml(tmp_path, fam):
    (tmp_path / "patches" / "not-a-family").mkdir()
    assert [f.name for f in S.families(tmp_path / "patches")] == ["test-0.5.12"]


def test_every_family_in_the_repository_loads():
    """Every family in patches/ is complete: a missing or broken entry fails here, never skips."""
    infos = S.families(REPO / "patches")
    assert infos, "the repository has no family"
    for info in infos:
        s = S.load_family(info.folder)
        assert all(p.startswith("sglang/") for p in s.touched_paths())


# --- family.toml --------------------------------------------------------------


@pytest.mark.parametrize(
    "content, message",
    [
        ('sglang = ">=0.5.12,<<0.5.13"\n', "is not a valid PEP 440 specifier"),
        ('sglang = "0.5.12"\n', "is not a valid PEP 440 specifier"),
        ('sglang = ""\n', "is empty"),
        ('sglang = 5\n', "must be a string"),
        ('description = "x"\n', "must be a string holding a PEP 440 specifier"),
        ('sglang = ">=0.5"\nrange = "x"\n', "line 3: range: unknown key"),
        ('sglang = ">=0.5\n', "not valid TOML"),
    ],
)
def test_bad_family_toml(fam, content, message):
    (fam / "family.toml").write_text("# a family\n" + content)
    with pytest.raises(BadInput, match=message) as exc:
        S.load_family(fam)
    assert "family.toml" in exc.value.message
    assert exc.value.exit_code == EXIT_BAD_INPUT


def test_bad_specifier_names_its_line(fam):
    (fam / "family.toml").write_text('# one\n# two\nsglang = ">=0.5.12 <0.5.13"\n')  # no comma
    with pytest.raises(BadInput) as exc:
        S.load_family(fam)
    assert "family.toml: line 3: sglang: " in exc.value.message


def test_missing_family_toml_and_series(fam):
    (fam / "series").unlink()
    with pytest.raises(BadInput, match=r"series: missing"):
        S.load_family(fam)
    (fam / "family.toml").unlink()
    with pytest.raises(BadInput, match=r"family.toml: missing"):
        S.load_family(fam)


# --- series entries -----------------------------------------------------------


def test_entry_that_does_not_exist(fam):
    _edit(fam / "series", "0002-wire-test-algorithm.patch", "0002-nope.patch")
    with pytest.raises(BadInput, match=r"series:3: entry '0002-nope.patch' does not exist"):
        S.load_family(fam)


def test_duplicate_entry(fam):
    with open(fam / "series", "a") as fh:
        fh.write("0001-spec-info-test-algorithm.patch\n")
    with pytest.raises(BadInput, match=r"series:6: duplicate entry .*already on line 2"):
        S.load_family(fam)


def test_duplicate_add_destination(fam):
    with open(fam / "series", "a") as fh:
        fh.write("add payload/ddtree_test_utils.py sglang/srt/speculative/ddtree_test_utils.py\n")
    with pytest.raises(BadInput, match=r"series:6: duplicate entry"):
        S.load_family(fam)


def test_entry_with_a_path_is_refused(fam):
    _edit(fam / "series", "0002-wire-test-algorithm.patch", "../0002-wire-test-algorithm.patch")
    with pytest.raises(BadInput, match=r"series:3: .*not a file name in the family folder"):
        S.load_family(fam)


def test_empty_series(fam):
    (fam / "series").write_text("# nothing yet\n\n")
    with pytest.raises(BadInput, match="has no entries"):
        S.load_family(fam)


@pytest.mark.parametrize(
    "line, message",
    [
        ("add payload/ddtree_test_utils.py", "'add' takes a source and a destination"),
        ("add tests/x.py sglang/x.py", "must be a path inside payload/"),
        ("add payload/../README.md sglang/x.py", "must be a path inside payload/"),
        ("add /etc/passwd sglang/x.py", "must be a path inside payload/"),
        ("add payload/missing.py sglang/x.py", "does not exist"),
        ("add payload/ddtree_test_utils.py /usr/lib/python3/x.py", "absolute path"),
        ("add payload/ddtree_test_utils.py sglang/../../x.py", "contains '..'"),
        ("add payload/ddtree_test_utils.py torch/x.py", "outside the sglang/ package"),
        ("add payload/ddtree_test_utils.py sglang//x.py", "not normalized"),
    ],
)
def test_bad_add_entries(fam, line, message):
    _edit(fam / "series", "add payload/ddtree_test_utils.py sglang/srt/speculative/ddtree_test_utils.py", line)
    with pytest.raises(BadInput, match=message) as exc:
        S.load_family(fam)
    assert "series:5:" in exc.value.message


def test_add_source_symlinked_out_of_payload(fam, tmp_path):
    outside = tmp_path / "secret.py"
    outside.write_text("x = 1\n")
    (tmp_path / "payload" / "link.py").symlink_to(outside)
    _edit(fam / "series", "add payload/ddtree_test_utils.py", "add payload/link.py")
    with pytest.raises(BadInput, match="resolves outside payload/"):
        S.load_family(fam)


@pytest.mark.parametrize("target", ["system", "copy"])
def test_patch_entry_symlinked_out_of_the_family_folder(fam, tmp_path, target):
    """A link to a system file used to read as "empty patch"; a link to a valid patch applied it."""
    if target == "system":
        outside = Path("/etc/hostname") if Path("/etc/hostname").is_file() else Path("/etc/passwd")
    else:
        outside = tmp_path / "elsewhere.patch"
        shutil.copyfile(fam / "0002-wire-test-algorithm.patch", outside)
    (fam / "0002-wire-test-algorithm.patch").unlink()
    (fam / "0002-wire-test-algorithm.patch").symlink_to(outside)
    with pytest.raises(BadInput, match=r"series:3: entry '0002-wire-test-algorithm.patch' is a symlink "
                                       r"to .* outside the family folder") as exc:
        S.load_family(fam)
    assert "\n" not in exc.value.message


def test_patch_entry_symlinked_inside_the_family_folder_is_fine(fam):
    (fam / "real.patch").write_bytes((fam / "0002-wire-test-algorithm.patch").read_bytes())
    (fam / "0002-wire-test-algorithm.patch").unlink()
    (fam / "0002-wire-test-algorithm.patch").symlink_to("real.patch")
    assert len(S.load_family(fam).entries) == 3


# --- paths in patch headers ---------------------------------------------------

P1 = "0001-spec-info-test-algorithm.patch"
HEADER = "sglang/srt/speculative/spec_info.py"


@pytest.mark.parametrize(
    "old, new, message",
    [
        (f"--- a/{HEADER}", "--- /etc/passwd", "absolute path '/etc/passwd'"),
        (f"+++ b/{HEADER}", "+++ /etc/passwd", "absolute path '/etc/passwd'"),
        (f"--- a/{HEADER}", "--- a/sglang/../../../etc/passwd", "contains '..'"),
        (f"+++ b/{HEADER}", "+++ b/sglang/srt/../../../x.py", "contains '..'"),
    ],
)
def test_unsafe_patch_header_paths(fam, old, new, message):
    patch = fam / P1
    _edit(patch, old, new)
    line = _line_of(patch, new)
    with pytest.raises(BadInput, match=message) as exc:
        S.load_family(fam)
    assert f"{P1}:{line}:" in exc.value.message


def _prefixes(patch: Path, src: str, dst: str) -> None:
    """The patch's headers as git diff --src-prefix=SRC --dst-prefix=DST writes them."""
    text = patch.read_text()
    for old, new in ((f"a/{HEADER}", f"{src}{HEADER}"), (f"b/{HEADER}", f"{dst}{HEADER}")):
        text = text.replace(old, new)
    patch.write_text(text)


@pytest.mark.parametrize("src, dst, message, hint", [
    ("", "", f"path '{HEADER}' has no prefix before sglang/ (git diff --no-prefix?); the engine strips "
             "one leading component, as patch -p1 does", "git diff without --no-prefix"),
    ("a/x/", "b/x/", f"path 'a/x/{HEADER}' has a prefix of several components ('a/x/', a custom git diff "
                     "--src-prefix/--dst-prefix?)", "git's a/ and b/ prefixes"),
    ("a//", "b//", f"path 'a//{HEADER}' has an empty component (a doubled '/')", "single slashes"),
])
def test_patch_path_prefixes_are_named(fam, src, dst, message, hint):
    """Issue 21 item 5: these used to read 'outside the sglang/ package' or 'absolute path'."""
    _prefixes(fam / P1, src, dst)
    with pytest.raises(BadInput) as exc:
        S.load_family(fam)
    assert f"{P1}:1: {message}" in exc.value.message, exc.value.message
    assert hint in exc.value.hint


def test_one_component_custom_prefixes_load(fam):
    """git diff --src-prefix=orig/ --dst-prefix=new/ strips like a/ and b/ (patch -p1 does too)."""
    _prefixes(fam / P1, "orig/", "new/")
    series = S.load_family(fam)
    assert series.entries[0].file_patches[0].path == HEADER


def test_patch_outside_the_package(fam):
    patch = fam / P1
    _edit(patch, f"--- a/{HEADER}", "--- a/torch/spec_info.py")
    _edit(patch, f"+++ b/{HEADER}", "+++ b/torch/spec_info.py")
    with pytest.raises(BadInput, match="outside the sglang/ package") as exc:
        S.load_family(fam)
    assert f"{P1}:{_line_of(patch, '--- a/torch')}:" in exc.value.message


def test_check_package_path_accepts_normal_paths():
    assert S.check_package_path("sglang/srt/server_args.py", where="x") == "sglang/srt/server_args.py"
    for bad in ["", "/sglang/x.py", "sglang/./x.py", "sglang\\x.py", "sglang", "sglang/x\x00.py"]:
        with pytest.raises(BadInput):
            S.check_package_path(bad, where="x")


# --- symlinks in a snapshot -----------------------------------------------------


def _tree(root: Path, test_family_dir: Path, release_tree: Path) -> None:
    s = S.load_family(test_family_dir)
    for p in s.touched_paths():
        src = release_tree / p
        if src.exists():
            (root / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, root / p)


def test_symlink_escaping_the_package_root(tmp_path, test_family_dir, release_tree):
    root = tmp_path / "files"
    _tree(root, test_family_dir, release_tree)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root / "sglang" / "srt" / "speculative", elsewhere)
    shutil.rmtree(root / "sglang" / "srt" / "speculative")
    os.symlink(elsewhere, root / "sglang" / "srt" / "speculative")
    s = S.load_family(test_family_dir)
    with pytest.raises(BadInput, match=r"passes through a symlink .* outside the package root") as exc:
        S.check_no_symlink_escape(s, root)
    assert P1 in exc.value.message


def test_symlink_inside_the_package_root_is_fine(tmp_path, test_family_dir, release_tree):
    root = tmp_path / "files"
    _tree(root, test_family_dir, release_tree)
    real = root / "sglang" / "srt" / "server_args_real.py"
    (root / "sglang" / "srt" / "server_args.py").rename(real)
    os.symlink(real, root / "sglang" / "srt" / "server_args.py")
    S.check_no_symlink_escape(S.load_family(test_family_dir), root)


def test_header_scan_skips_hunk_bodies():
    """A removed line that reads like a header ("-- /etc/passwd") is content, not a path."""
    text = (
        "diff --git a/sglang/x.py b/sglang/x.py\n"
        "--- a/sglang/x.py\n"
        "+++ b/sglang/x.py\n"
        "@@ -1,2 +1,2 @@\n"
        "--- /etc/passwd\n"
        "+++ /etc/shadow\n"
        " same\n"
    )
    assert S.header_paths(text) == [(1, "a/sglang/x.py"), (1, "b/sglang/x.py"), (2, "a/sglang/x.py"),
                                    (3, "b/sglang/x.py")]


def test_git_rename_lines_are_checked():
    text = "diff --git a/sglang/x.py b/sglang/y.py\nrename from sglang/x.py\nrename to ../y.py\n"
    paths = S.header_paths(text)
    assert (3, "x/../y.py") in paths
    with pytest.raises(BadInput, match="contains '..'"):
        for line, raw in paths:
            S.check_header_path(raw, where=f"p:{line}")


# --- naming and choosing a family: one rule, one text (issue #14) --------------


def test_family_folder_is_one_rule(tmp_path, monkeypatch):
    patches = tmp_path / "patches"
    monkeypatch.chdir(tmp_path)
    assert S.family_folder("fam", patches) == patches / "fam"  # a bare name: under patches/
    assert S.family_folder("some/where/fam", patches) == Path("some/where/fam")  # a path: as given
    (tmp_path / "here").mkdir()
    assert S.family_folder("here", patches) == Path("here")  # a bare name that is a folder here
    from ddtree_deploy.cli import port_cmd  # port/series refresh use the same rule (was its own)
    assert not hasattr(port_cmd, "_family_path")


def test_no_such_family_is_one_text_for_a_name_a_folder_and_the_matrix(tmp_path, fam, monkeypatch):
    from ddtree_deploy.release import matrix_run

    patches = fam.parent
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(patches))
    with pytest.raises(BadInput) as by_name:
        S.load_family("nope")
    with pytest.raises(BadInput) as in_matrix:
        matrix_run.run_matrix(family="nope", patches_dir=patches, offline=True)
    for exc in (by_name.value, in_matrix.value):
        assert re.fullmatch(r"no such family '[^']*nope' \(families here: test-0\.5\.12\)", exc.message), exc.message
        assert exc.hint == "name a family under patches/ or give a family folder (family.toml + series)"


def test_known_family_takes_names_only(tmp_path, fam):
    patches = fam.parent
    assert S.known_family("test-0.5.12", patches) == fam
    assert S.known_family(str(fam), patches) is None  # a path from a host is never followed
    assert S.known_family(None, patches) is None


def test_choose_series_forced_or_by_version(tmp_path, fam, monkeypatch):
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(fam.parent))
    assert S.choose_series("0.5.12.post1").name == "test-0.5.12"
    assert S.choose_series("0.4.0", str(fam)).name == "test-0.5.12"  # forced: coverage is the caller's call
    with pytest.raises(BadInput, match=r"^no family covers SGLang 0.4.0; families: test-0.5.12 "):
        S.choose_series("0.4.0")
