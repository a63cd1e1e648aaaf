"""port and series refresh, on real SGLang release files, with GNU patch and git as oracles.

- the diff writer: the real 0.5.12.post1 -> 0.5.13 changes of SGLang files, written by
  us, applied by GNU patch and checked by git apply, must rebuild 0.5.13 exactly;
- identity: porting a family onto the release it was made against, and refreshing
  from an unedited tree, give back its patch files byte for byte (git wrote them);
- the porting workflow the issue asks for: port the test family from 0.5.12.post1 to
  0.5.13 (asserting the ported family's `check` result), fix the rejects in the
  working tree, `series refresh`, and `check` is clean; GNU patch agrees;
- bad input: one line, exit 2, nothing written.

Tests that need a release other than the baseline are marked ``network``: they fill
the wheel cache on the first run and are offline afterwards.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.locations import REPO_ROOT
from ddtree_deploy.cli import app
from ddtree_deploy.engine import patch_apply, patch_parse, patch_write
from ddtree_deploy.engine.check import check_series
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.release import port, releases

DATA = Path(__file__).resolve().parent.parent / "data"
TEST_FAMILY = DATA / "matrix_family"
SERVER_ARGS = "sglang/srt/server_args.py"
WORKER = "sglang/srt/speculative/dflash_worker.py"


@pytest.fixture(scope="module")
def wheel_0513() -> Path:
    try:
        return releases.ensure_wheel("0.5.13")
    except DeployError as exc:
        pytest.skip(f"the 0.5.13 wheel is not cached and PyPI is unreachable: {exc.message}")


@pytest.fixture
def patches(monkeypatch, tmp_path) -> Path:
    """A writable copy of the test family as the repository's patches/."""
    dest = tmp_path / "patches"
    shutil.copytree(TEST_FAMILY / "patches", dest)
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(dest))
    monkeypatch.setenv("DDTREE_DEPLOY_PAYLOAD", str(TEST_FAMILY / "payload"))
    monkeypatch.setenv("DDTREE_DEPLOY_BUILD", str(tmp_path / "build"))
    return dest


def _gnu_patch(root: Path, patch_text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["patch", "-p1", "--batch", "--no-backup-if-mismatch", "-d", str(root)],
                          input=patch_text, text=True, capture_output=True)


def _write(root: Path, files: dict[str, bytes | str | None]) -> None:
    for path, data in files.items():
        if data is None:
            continue
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data if isinstance(data, bytes) else data.encode())


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the diff writer ------------------------------------------------------------------


@pytest.mark.network
def test_real_release_diff_written_by_us_rebuilds_the_new_release_with_gnu_patch_and_git(
        release_wheel, wheel_0513, tmp_path):
    paths = [SERVER_ARGS, "sglang/srt/speculative/spec_info.py", WORKER]
    old = releases.read_wheel_files(release_wheel, paths)
    new = releases.read_wheel_files(wheel_0513, paths)
    text = ""
    for path in paths:
        a, b = old[path].decode(), new[path].decode()
        text += f"--- a/{path}\n+++ b/{path}\n" + "".join(h for _, h in patch_write.diff_hunks(a, b))
    root = tmp_path / "tree"
    _write(root, old)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    check = subprocess.run(["git", "-C", str(root), "apply", "--check", "-"], input=text, text=True,
                           capture_output=True)
    assert check.returncode == 0, check.stderr
    res = _gnu_patch(root, text)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "offset" not in res.stdout and "fuzz" not in res.stdout  # every hunk where it says
    for path in paths:
        assert (root / path).read_bytes() == new[path]


@pytest.mark.parametrize(
    "old, new",
    [
        ("a\nb\nc\n", "a\nB\nc"),  # the new text loses its final newline
        ("a\nb\nc", "a\nb\nc\nd\n"),  # the old text had none
        ("x", "y"),
        ("", "one\ntwo\n"),  # a file that was empty
        ("".join(f"line {i}\n" for i in range(40)), "".join(f"line {i}\n" for i in range(40) if i not in (3, 30))),
    ],
)
def test_diff_hunks_edge_cases_agree_with_gnu_patch(old, new, tmp_path):
    text = "--- a/sglang/f.py\n+++ b/sglang/f.py\n" + "".join(h for _, h in patch_write.diff_hunks(old, new))
    _write(tmp_path, {"sglang/f.py": old})
    res = _gnu_patch(tmp_path, text)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "sglang/f.py").read_text() == new


def test_blob_id_is_gits(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("print('ddtree')\n")
    git = subprocess.run(["git", "hash-object", str(f)], capture_output=True, text=True, check=True).stdout
    assert patch_write.blob_id(f.read_text()) == git[:7]


def test_next_micro():
    assert [port.next_micro(v) for v in ("0.5.13", "0.5.13.post1", "0.6")] == ["0.5.14", "0.5.14", "0.6.1"]


# --- identity: onto the release a family was made for ------------------------------------


def _families_to_check_for_identity() -> list[Path]:
    """The test family, and the real series when every one of its entries exists."""
    out = [TEST_FAMILY / "patches" / "sglang-0.5.12"]
    try:
        load_family(REPO_ROOT / "patches" / "sglang-0.5.12")
        out.append(REPO_ROOT / "patches" / "sglang-0.5.12")
    except BadInput:
        pass
    return out


@pytest.mark.parametrize("folder", _families_to_check_for_identity(), ids=lambda p: p.parent.parent.name)
def test_port_and_refresh_onto_the_same_release_give_back_git_s_patches(folder, release_wheel, release_version,
                                                                      monkeypatch):
    if folder.is_relative_to(TEST_FAMILY):
        monkeypatch.setenv("DDTREE_DEPLOY_PAYLOAD", str(TEST_FAMILY / "payload"))
    series = load_family(folder)
    files = port.release_files(release_version, series.touched_paths())
    result = port.port_series(series, files, version=release_version)
    assert result.ok
    originals = {e.name: e.file.read_text() for e in series.entries if e.kind == "patch"}
    ported = {e.entry: e.text for e in result.entries if e.kind == "patch"}
    tree = {path: text.encode() for path, text in result.tree.items()}
    refreshed = {r.entry: r.text for r in port.refresh_series(series, files, tree)}
    if folder.is_relative_to(TEST_FAMILY):
        # Made with git diff: regenerated byte for byte (headers, index lines, hunk placement).
        assert ported == originals and refreshed == originals
    else:
        # The real series may be edited by hand: same effect, entry by entry, is what must hold.
        for texts in (ported, refreshed):
            state = {p: (d.decode() if d is not None else None) for p, d in files.items()}
            ref = dict(state)
            for name, original in originals.items():
                for fp_new, fp_old in zip(patch_parse.parse_patch(texts[name], name=name),
                                          patch_parse.parse_patch(original, name=name)):
                    state[fp_new.path] = patch_apply.apply_file_patch(fp_new, state[fp_new.path]).text
                    ref[fp_old.path] = patch_apply.apply_file_patch(fp_old, ref[fp_old.path]).text
                assert state == ref, name


# --- the porting workflow -------------------------------------------------------------------


@pytest.mark.network
def test_port_to_0513_then_fix_then_refresh(patches, release_wheel, wheel_0513, tmp_path):
    runner = CliRunner()
    tree = tmp_path / "tree"
    res = runner.invoke(app, ["port", "--to", "0.5.13", "--family", "sglang-0.5.12", "--tree", str(tree)])
    assert res.exit_code == 1, res.output  # hunks were rejected
    assert "what to edit:" in res.stderr
    assert f"{SERVER_ARGS} near line" in res.stderr and "series refresh --family sglang-0.5.13" in res.stderr
    new = patches / "sglang-0.5.13"
    assert sorted(p.name for p in new.iterdir()) == [
        "0001-enum.patch", "0002-server-args.patch", "0002-server-args.patch.rej", "0003-worker.patch",
        "0003-worker.patch.rej", "0004-server-args-help.patch", "family.toml", "series"]
    assert 'sglang = ">=0.5.13,<0.5.14"' in (new / "family.toml").read_text()
    rej = (new / "0002-server-args.patch.rej").read_text()
    assert "# sglang/srt/server_args.py hunk 2 (@@ -3607,6 +3608,7 @@, patch line 17): no match; nearest at line" in rej
    assert "#   line " in rej and "expected '            # RoPE reservation)." in rej
    assert "+            # DDTREE keeps the same rule: one draft step, verified as a tree.\n" in rej

    # The ported family's check on 0.5.13: the landed hunks now apply exactly, the
    # rejected ones still fail (the family does not pretend to be complete).
    ported = load_family(new)
    files = port.release_files("0.5.13", ported.touched_paths())
    report = check_series(ported, files)
    got = [(e.name, [(f.status, [h.status.value for h in f.hunks]) for f in e.files]) for e in report.entries]
    assert got == [
        ("0001-enum.patch", [("applied", ["exact", "exact"])]),
        ("0002-server-args.patch", [("failed", ["exact", "failed"])]),
        ("0003-worker.patch", [("failed", ["failed"])]),
        ("0004-server-args-help.patch", [("skipped", [])]),
        ("add payload/ddtree_marker.py", [("applied", [])]),
    ]

    # An engineer applies the rejected hunks by hand in the working tree.
    sa, worker = tree / SERVER_ARGS, tree / WORKER
    anchor = '            help="DFLASH only. Block size (verify window length).'
    text = sa.read_text()
    assert text.count(anchor) == 1
    sa.write_text(text.replace(anchor, "            # DDTREE keeps the same rule: one draft step, verified as a tree.\n"
                               + anchor))
    text = worker.read_text()
    assert text.count('"Invariant broken: DFLASH batch') == 2  # 0.5.13 has it twice; the test family edits one
    worker.write_text(text.replace('"Invariant broken: DFLASH batch', '"Invariant broken: DFLASH/DDTREE batch', 1))

    # Refresh refuses while the .rej files are there, unless told they are resolved.
    before = _digest(new)
    res = runner.invoke(app, ["series", "refresh", "--family", "sglang-0.5.13", "--from", str(tree)])
    assert res.exit_code == 2 and "still has reject files" in res.stderr
    assert _digest(new) == before
    res = runner.invoke(app, ["series", "refresh", "--family", "sglang-0.5.13", "--from", str(tree), "--resolved"])
    assert res.exit_code == 0, res.output
    assert not list(new.glob("*.rej"))

    # Each change went to the entry it belongs to (two entries share server_args.py).
    p2, p4 = (new / "0002-server-args.patch").read_text(), (new / "0004-server-args-help.patch").read_text()
    assert "+            # DDTREE keeps the same rule" in p2 and "DDTREE keeps" not in p4
    assert '+                "NGRAM, DFLASH, DDTREE. Or any name' in p4 and "NGRAM, DFLASH, DDTREE" not in p2
    assert p2.startswith("Subject: DDTREE budget field and validation note (matrix test family)\n")

    refreshed = load_family(new)
    report = check_series(refreshed, files)
    assert report.ok
    assert {h.status.value for e in report.entries for f in e.files for h in f.hunks} == {"exact"}

    # GNU patch agrees: the refreshed series turns 0.5.13's files into the edited tree.
    oracle = tmp_path / "oracle"
    _write(oracle, {p: d for p, d in files.items()})
    for entry in refreshed.entries:
        if entry.kind == "patch":
            res = _gnu_patch(oracle, entry.file.read_text())
            assert res.returncode == 0, res.stdout + res.stderr
    for path in (SERVER_ARGS, WORKER, "sglang/srt/speculative/spec_info.py"):
        assert (oracle / path).read_bytes() == (tree / path).read_bytes()


# --- bad input ---------------------------------------------------------------------------------


def test_port_refuses_an_existing_folder_and_a_covered_release(patches, release_wheel, tmp_path):
    runner = CliRunner()
    (patches / "taken").mkdir()
    before = _digest(patches)
    res = runner.invoke(app, ["port", "--to", "0.5.13", "--into", "taken", "--tree", str(tmp_path / "t")])
    assert res.exit_code == 2 and "already exists" in res.stderr
    res = runner.invoke(app, ["port", "--to", "0.5.12.post1", "--into", "x", "--tree", str(tmp_path / "t")])
    assert res.exit_code == 2 and "already covered by family sglang-0.5.12" in res.stderr
    res = runner.invoke(app, ["port", "--to", "not-a-version", "--tree", str(tmp_path / "t")])
    assert res.exit_code == 2 and "not a valid PEP 440 version" in res.stderr
    assert _digest(patches) == before and not (tmp_path / "t").exists()


def test_refresh_without_a_release_to_compare_with_is_bad_input(patches, tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    before = _digest(patches)
    res = CliRunner().invoke(app, ["series", "refresh", "--family", "sglang-0.5.12", "--from", str(tree)])
    assert res.exit_code == 2 and "no .ddtree-port.json naming the SGLang release" in res.stderr
    assert _digest(patches) == before


def test_refresh_of_a_tree_missing_an_entry_s_changes_is_bad_input(patches, release_wheel, release_version,
                                                                  tmp_path):
    series = load_family(patches / "sglang-0.5.12")
    files = port.release_files(release_version, series.touched_paths())
    tree = tmp_path / "tree"
    pristine = {p: d.decode() for p, d in files.items() if d is not None}
    port.write_tree(tree, pristine, {"sglang": release_version})  # no entry applied at all
    before = _digest(patches)
    res = CliRunner().invoke(app, ["series", "refresh", "--family", "sglang-0.5.12", "--from", str(tree)])
    assert res.exit_code == 2 and "holds none of the changes of 0001-enum.patch" in res.stderr
    assert _digest(patches) == before


@pytest.mark.network
def test_port_of_the_real_series_to_0513_is_consistent_with_check(release_wheel, wheel_0513, tmp_path,
                                                                  monkeypatch):
    """The real DDTree series ported to 0.5.13: `check` on the new family agrees with the port.

    Every hunk the port re-anchored applies exactly; every file with a rejected hunk
    fails (the rejected hunk is kept as it was); and every .rej names a nearest line.
    """
    real = REPO_ROOT / "patches" / "sglang-0.5.12"
    series = load_family(real)  # the series is complete: a broken one fails here
    monkeypatch.setenv("DDTREE_DEPLOY_PAYLOAD", str(REPO_ROOT / "payload"))
    outcome = port.port_family(series, "0.5.13", into=tmp_path / "patches" / "sglang-0.5.13",
                               tree_dir=tmp_path / "tree")
    ported = load_family(outcome.family_dir)
    report = check_series(ported, port.release_files("0.5.13", ported.touched_paths()))
    rejected = {(r.entry, r.path) for r in outcome.result.rejects}
    broken: set[str] = set()
    for entry in report.entries:
        for f in entry.files:
            if (entry.name, f.path) in rejected:
                assert f.status == "failed", (entry.name, f.path)
                broken.add(f.path)
            elif f.path in broken:
                assert f.status == "skipped", (entry.name, f.path)  # an earlier entry failed on this file
            else:
                assert f.status in ("applied", "already-applied"), (entry.name, f.path, f.message)
                assert {h.status.value for h in f.hunks} <= {"exact"}, (entry.name, f.path)
    assert report.ok == (not rejected)
    for rej in outcome.rej_files:
        assert "nearest at line" in rej.read_text() or "does not exist" in rej.read_text()


def test_port_refuses_a_tree_folder_it_did_not_write_before_writing_anything(patches, tmp_path):
    tree = tmp_path / "mine"
    tree.mkdir()
    (tree / "notes.txt").write_text("not a port tree")
    before = _digest(patches)
    res = CliRunner().invoke(app, ["port", "--to", "0.5.13", "--tree", str(tree)])
    assert res.exit_code == 2 and "is not a working tree written by port" in res.stderr
    assert _digest(patches) == before and sorted(p.name for p in tree.iterdir()) == ["notes.txt"]


def test_an_entry_already_in_the_release_is_dropped_from_the_ported_series(release_wheel, release_version,
                                                                          monkeypatch):
    # A release that already contains entry 0001 (made by applying it to the real files).
    monkeypatch.setenv("DDTREE_DEPLOY_PAYLOAD", str(TEST_FAMILY / "payload"))
    series = load_family(TEST_FAMILY / "patches" / "sglang-0.5.12")
    files = port.release_files(release_version, series.touched_paths())
    first = series.entries[0]
    upstream = dict(files)
    for fp in first.file_patches:
        upstream[fp.path] = port.apply_partial(fp, files[fp.path].decode(), fuzz=0)[0].encode()
    result = port.port_series(series, upstream, version="9.9.9")
    assert result.ok
    dropped = result.entries[0]
    assert dropped.text is None and {h.status.value for _, h in dropped.results} == {"already-applied"}
    text = port._ported_series_text(series, result)
    assert "# 0001-enum.patch  (every hunk already in SGLang 9.9.9: dropped by port)\n" in text
    assert "\n0002-server-args.patch\n" in text


@pytest.mark.network
def test_port_writes_its_tree_where_the_readme_says_refresh_reads_it(patches, release_wheel, wheel_0513, tmp_path):
    """docs/releases.md's `series refresh --from build/port-<family>` is the folder `port` writes by
    default (build/ is DDTREE_DEPLOY_BUILD here), and the hint port prints says the same."""
    import re

    from ddtree_deploy.base import next_step

    readme = (Path(__file__).resolve().parent.parent.parent / "docs" / "releases.md").read_text()
    family, tree = re.search(r"ddtree-deploy series refresh --family (\S+) --from (\S+)", readme).groups()
    assert tree == f"build/port-{family}" and family == "sglang-0.5.13"
    res = CliRunner().invoke(app, ["port", "--to", "0.5.13", "--family", "sglang-0.5.12"])
    assert res.exit_code == 1, res.output  # rejects: the hint to refresh follows
    written = tmp_path / tree
    assert (written / port.TREE_MANIFEST).is_file()
    assert next_step.series_refresh(family, str(written)) in " ".join(res.stderr.split())


# --- the user's own families (issue 21 item 6) ------------------------------------------------


def _fix_rejects_by_hand(tree: Path) -> None:
    """What an engineer does in port's working tree for the test family on 0.5.13 (see above)."""
    sa, worker = tree / SERVER_ARGS, tree / WORKER
    anchor = '            help="DFLASH only. Block size (verify window length).'
    sa.write_text(sa.read_text().replace(
        anchor, "            # DDTREE keeps the same rule: one draft step, verified as a tree.\n" + anchor))
    worker.write_text(worker.read_text().replace('"Invariant broken: DFLASH batch',
                                                 '"Invariant broken: DFLASH/DDTREE batch', 1))


@pytest.mark.network
def test_a_port_is_the_users_family_and_an_unfinished_one_is_never_picked_by_range(
        patches, release_wheel, wheel_0513, tmp_path, monkeypatch):
    """port writes the new family to the user's own folder (never the toolkit's patches/), every
    listing labels it as the user's, and while it has .rej files no version range picks it:
    check names it and says how to finish it, --family checks it with a warning, push and the
    matrix leave it out. Once refreshed (--resolved) it is picked by its range."""
    import json

    from ddtree_deploy.release.matrix_run import run_matrix
    from ddtree_deploy.session.desired import Want

    mine = tmp_path / "data" / "patches"
    monkeypatch.setenv("DDTREE_DEPLOY_USER_PATCHES", str(mine))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    toolkit = _digest(patches)
    runner = CliRunner()
    tree = tmp_path / "tree"
    res = runner.invoke(app, ["port", "--to", "0.5.13", "--tree", str(tree), "--json"])
    assert res.exit_code == 1, res.output  # hunks were rejected
    doc = json.loads(res.stdout)
    new = mine / "sglang-0.5.13"
    assert (doc["family"], doc["family_dir"], doc["family_origin"]) == ("sglang-0.5.13", str(new), "user")
    assert sorted(p.name for p in new.glob("*.rej")) == ["0002-server-args.patch.rej", "0003-worker.patch.rej"]
    assert _digest(patches) == toolkit  # nothing written into the toolkit's families
    label = f"sglang-0.5.13 (yours, in {mine}; an unfinished port: 2 .rej files)"
    res = runner.invoke(app, ["port", "--to", "0.5.13", "--into", "again", "--tree", str(tmp_path / "t2")])
    assert res.exit_code == 2 and "already covered by family sglang-0.5.13" in res.stderr

    # By version range: never the unfinished port.
    res = runner.invoke(app, ["check", "--release", "0.5.13"])
    assert res.exit_code == 2, res.output
    flat = " ".join(res.stderr.split())
    assert f"no finished family covers SGLang 0.5.13: {label} is not chosen by its range" in flat, flat
    assert "--family sglang-0.5.13" in flat
    # By name: checked, with a warning and the label; its rejected hunks fail.
    res = runner.invoke(app, ["check", "--release", "0.5.13", "--family", "sglang-0.5.13", "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert (doc["family_origin"], len(doc["family_rejects"])) == ("user", 2)
    assert "is an unfinished port" in " ".join(res.stderr.split())
    res = runner.invoke(app, ["check", "--release", "0.5.13", "--family", "sglang-0.5.13"])
    assert res.stdout.startswith(f"check FAILED: family {label} on sglang-0.5.13"), res.stdout
    with pytest.raises(BadInput, match="push refuses an unfinished port"):
        Want("sglang-0.5.13")
    warnings = []
    m = run_matrix(from_version="0.5.13", to_version="0.5.13", offline=True, jobs=1, warn=warnings.append)
    assert [r.family for r in m.rows] == ["sglang-0.5.12"]  # the newest finished family, as a probe
    assert any(f"family {label} is not chosen by its range" in w for w in warnings), warnings
    assert m.to_json()["rows"][0]["family_origin"] == "toolkit"

    # Finished: the rejects placed by hand, refreshed; now its range picks it, labelled as yours.
    _fix_rejects_by_hand(tree)
    res = runner.invoke(app, ["series", "refresh", "--family", "sglang-0.5.13", "--from", str(tree), "--resolved"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["check", "--release", "0.5.13"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"check ok: family sglang-0.5.13 (yours, in {mine}) on sglang-0.5.13"), res.stdout
    m = run_matrix(from_version="0.5.13", to_version="0.5.13", offline=True, jobs=1)
    assert m.to_json()["rows"][0]["family"] == "sglang-0.5.13"
    assert m.to_json()["rows"][0]["family_origin"] == "user"
    assert _digest(patches) == toolkit


# --- port --context: an ambiguous hunk made again with more context (issue 28 item 6) ---------

WIDE = "sglang/srt/wide.py"


def _lines(*words: str) -> str:
    return "".join(f"{w} = 0\n" for w in words)


# The release the family was made for: the change (c -> C) in its own place.
SOURCE = _lines(*(f"p{i}" for i in range(1, 9)), "x4", "a", "b", "c", "d", "e", "z1", *(f"q{i}" for i in range(1, 9)))
# A new release: a copy of the hunk's new side (with 3 lines of context) near the top, and the
# real place moved down: the two rank alike (neither at the stated line, both exact).
TARGET = _lines("k1", "k2", "k3", "x4", "a", "b", "C", "d", "e", "z1", "m1", "m2") + SOURCE


def _wide_family(tmp_path: Path) -> Path:
    fam = tmp_path / "wide-family"
    fam.mkdir()
    (fam / "family.toml").write_text('sglang = ">=1,<2"\n')
    (fam / "series").write_text("0001-change.patch\n")
    hunk = patch_write.diff_hunks(SOURCE, SOURCE.replace("c = 0", "C = 0"))[0][1]
    (fam / "0001-change.patch").write_text(f"--- a/{WIDE}\n+++ b/{WIDE}\n" + hunk)
    return fam


def test_port_context_makes_an_ambiguous_hunk_again_with_more_context(tmp_path):
    series = load_family(_wide_family(tmp_path))
    # As written (3 lines of context) the hunk is ambiguous on the new release: a reject.
    plain = port.port_series(series, {WIDE: TARGET.encode()}, version="1.5")
    (reject,) = plain.rejects
    assert reject.hunk.ambiguous and reject.reason.startswith("ambiguous: its old lines match at line 21")
    # Made again from the family's release with 8 lines of context, it has one place: it lands,
    # and the ported patch keeps that much context, so that check finds one place too.
    wide = port.port_series(series, {WIDE: TARGET.encode()}, version="1.5", context=8,
                            source={WIDE: SOURCE.encode()})
    assert wide.ok and wide.entries[0].widened == ((WIDE, 1),)
    (_, h), = wide.entries[0].results
    assert (h.status, h.line) == (patch_apply.HunkStatus.OFFSET, 16)  # its 8 lines of context start at p3
    assert wide.tree[WIDE] == TARGET.replace("p8 = 0\nx4 = 0\na = 0\nb = 0\nc = 0", "p8 = 0\nx4 = 0\na = 0\nb = 0\nC = 0")
    text = wide.entries[0].text
    (fp,) = patch_parse.parse_patch(text, name="0001-change.patch")
    assert (fp.hunks[0].prefix_context, fp.hunks[0].suffix_context) == (8, 8)
    res = patch_apply.apply_file_patch(fp, TARGET)
    assert [r.status for r in res.hunks] == [patch_apply.HunkStatus.EXACT] and res.text == wide.tree[WIDE]
    # GNU patch, the oracle, gives the same file from the ported patch
    (tmp_path / "gnu" / WIDE).parent.mkdir(parents=True)
    (tmp_path / "gnu" / WIDE).write_text(TARGET)
    assert _gnu_patch(tmp_path / "gnu", text).returncode == 0
    assert (tmp_path / "gnu" / WIDE).read_text() == wide.tree[WIDE]
    # a source on which the hunk cannot be made again: the reject stays as it was
    kept = port.port_series(series, {WIDE: TARGET.encode()}, version="1.5", context=8, source={WIDE: None})
    assert [r.reason for r in kept.rejects] == [reject.reason] and kept.entries[0].widened == ()


NPU = "sglang/srt/hardware_backend/npu/attention/ascend_torch_native_backend.py"


@pytest.mark.network
def test_port_offers_context_for_an_ambiguous_hunk_and_context_lands_it(patches, tmp_path, monkeypatch):
    """Real code: a family for 0.5.13.x whose patch is hunk 3 of SGLang's own change to
    ascend_torch_native_backend.py in 0.5.14 (made by GNU diff from 0.5.13.post1). On 0.5.14,
    which has the change, its new side is at one place and its old side (3 lines of context)
    still at another, neither where it states: port rejects it as ambiguous and says how to make
    it again with more context; with --context 8 (from 0.5.13.post1, the newest release the family
    covers) it has one place: already in 0.5.14, and the entry is dropped."""
    import json

    from ddtree_deploy.sandbox import pristine_files

    for v in ("0.5.13.post1", "0.5.14"):
        try:
            releases.ensure_wheel(v)
        except DeployError as exc:
            pytest.skip(f"the {v} wheel is not cached and PyPI is unreachable: {exc.message}")
    monkeypatch.setenv("DDTREE_DEPLOY_USER_PATCHES", str(tmp_path / "mine"))
    for side, v in (("a", "0.5.13.post1"), ("b", "0.5.14")):
        (tmp_path / side).write_bytes(pristine_files(v, [NPU])[NPU])
    diff = subprocess.run(["diff", "-u", "--label", f"a/{NPU}", "--label", f"b/{NPU}", "a", "b"],
                          cwd=tmp_path, capture_output=True, text=True).stdout
    head, *hunks = diff.split("\n@@")
    fam = tmp_path / "npu-family"
    fam.mkdir()
    (fam / "family.toml").write_text('sglang = ">=0.5.13,<0.5.14"\n')
    (fam / "series").write_text("0001-npu.patch\n")
    (fam / "0001-npu.patch").write_text(head + "\n@@" + hunks[2] + "\n")
    runner = CliRunner()
    res = runner.invoke(app, ["port", "--to", "0.5.14", "--family", str(fam), "--into", str(tmp_path / "p1"),
                              "--tree", str(tmp_path / "t1")])
    assert res.exit_code == 1, res.output
    flat = " ".join(res.stderr.split())
    assert "ambiguous: its old lines match at line 234 and its new lines at line 92" in flat, flat
    assert "1 of them is ambiguous (both sides match)" in flat and "--context 8" in flat, flat
    res = runner.invoke(app, ["port", "--to", "0.5.14", "--family", str(fam), "--into", str(tmp_path / "p2"),
                              "--tree", str(tmp_path / "t2"), "--context", "8", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (entry,) = doc["entries"]
    assert doc["context_from"] == "0.5.13.post1" and entry["widened"] == [{"path": NPU, "hunk": 1}]
    assert [h["status"] for h in entry["hunks"]] == ["already-applied"] and not entry["written"]
    assert "made again with 8 lines of context from SGLang 0.5.13.post1, it landed" in " ".join(res.stderr.split())
    # --context-from alone is bad input, nothing written
    res = runner.invoke(app, ["port", "--to", "0.5.14", "--family", str(fam), "--into", str(tmp_path / "p3"),
                              "--tree", str(tmp_path / "t3"), "--context-from", "0.5.14"])
    assert res.exit_code == 2 and "give --context N too" in res.stderr
    assert not (tmp_path / "p3").exists()
