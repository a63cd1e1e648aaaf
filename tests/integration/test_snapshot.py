"""snapshot.py: snapshots from the real release wheel and from a path -> bytes mapping."""

from __future__ import annotations

import json
import shutil

import pytest

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.release import snapshot as SN

SPEC = "sglang/srt/speculative/spec_info.py"
NEW = "sglang/srt/speculative/ddtree_test_utils.py"


@pytest.fixture
def env(tmp_path, monkeypatch, data_dir):
    """The test family as the only family, snapshots in a temp folder."""
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(data_dir / "patches"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    return tmp_path / "snapshot"


@pytest.fixture
def touched(test_family_dir):
    return load_family(test_family_dir).touched_paths()


def test_snapshot_from_release(env, release_wheel, release_tree, release_version, touched):
    snap = SN.snapshot_from_release(release_version)
    assert snap.folder == env / "sglang-0.5.12.post1"
    doc = json.loads((snap.folder / "MANIFEST.json").read_text())
    assert doc["format"] == 1 and doc["name"] == "sglang-0.5.12.post1"
    assert doc["sglang_version"] == release_version
    assert doc["source"]["kind"] == "pypi" and doc["source"]["wheel"] == release_wheel.name
    paths = [f["path"] for f in doc["files"]]
    assert paths == sorted(touched)
    assert {"path": NEW, "absent": True} in doc["files"]
    files = SN.load_snapshot("sglang-0.5.12.post1").read_files()
    for p in touched:
        assert files[p] == ((release_tree / p).read_bytes() if (release_tree / p).exists() else None)
    assert not (snap.files_dir / NEW).exists()


def test_default_paths_are_the_union_of_all_families(env, tmp_path, data_dir, monkeypatch, release_wheel):
    patches = tmp_path / "patches"
    shutil.copytree(data_dir / "patches", patches)
    shutil.copytree(data_dir / "payload", tmp_path / "payload")
    second = patches / "other"
    shutil.copytree(patches / "test-0.5.12", second)
    # A second family touching one more file: a patch-free 'add' is enough.
    (second / "series").write_text("add payload/ddtree_test_utils.py sglang/srt/speculative/other_utils.py\n")
    (second / "family.toml").write_text('sglang = ">=0.6"\n')
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(patches))
    assert "sglang/srt/speculative/other_utils.py" in SN.all_touched_paths()
    snap = SN.snapshot_from_release("0.5.12.post1")
    assert "sglang/srt/speculative/other_utils.py" in snap.manifest.paths()
    assert SPEC in snap.manifest.paths()


def test_retaking_an_unchanged_snapshot_keeps_the_manifest_byte_identical(env, release_wheel):
    first = SN.snapshot_from_release("0.5.12.post1")
    before = (first.folder / "MANIFEST.json").read_bytes()
    again = SN.snapshot_from_release("0.5.12.post1")
    assert (again.folder / "MANIFEST.json").read_bytes() == before
    assert not [p for p in env.iterdir() if p.name.startswith(".") and p.is_dir()]  # no temp folders left


def test_a_tampered_file_is_refused(env, release_wheel):
    snap = SN.snapshot_from_release("0.5.12.post1")
    target = snap.files_dir / SPEC
    target.write_bytes(target.read_bytes().replace(b"DFLASH", b"DFLASH2", 1))
    with pytest.raises(BadInput, match=r"spec_info.py: sha256 .* does not match MANIFEST.json"):
        SN.load_snapshot("sglang-0.5.12.post1").read_files()


def test_a_file_recorded_absent_that_appears_is_refused(env, release_wheel):
    snap = SN.snapshot_from_release("0.5.12.post1")
    (snap.files_dir / NEW).write_text("x = 1\n")
    with pytest.raises(BadInput, match="records it as absent"):
        snap.read_files()


def test_fresh_release_snapshot_restores_files_of_a_committed_manifest(env, release_wheel, touched):
    snap = SN.snapshot_from_release("0.5.12.post1")
    manifest = (snap.folder / "MANIFEST.json").read_bytes()
    shutil.rmtree(snap.files_dir)  # what a fresh clone has: the manifest only
    again = SN.fresh_release_snapshot("0.5.12.post1", touched)
    assert (again.folder / "MANIFEST.json").read_bytes() == manifest
    assert set(again.read_files()) == set(touched)


def test_fresh_release_snapshot_widens_to_new_paths(env, release_wheel, touched):
    SN.snapshot_from_release("0.5.12.post1", paths=[SPEC])
    again = SN.fresh_release_snapshot("0.5.12.post1", touched)
    assert set(again.manifest.paths()) == set(touched)


def test_snapshot_from_files_for_a_host(env):
    files = {SPEC: b"x = 1\n", NEW: None}
    snap = SN.snapshot_from_files("ct200", "0.5.12.post1", {"kind": "host", "host": "ct200"}, files,
                                  package_root="/opt/venv/lib/python3.11/site-packages")
    loaded = SN.load_snapshot("ct200")
    assert loaded.manifest == snap.manifest
    assert loaded.manifest.package_root == "/opt/venv/lib/python3.11/site-packages"
    assert loaded.read_files() == files


@pytest.mark.parametrize(
    "name, files, message",
    [
        ("ok", {"/etc/passwd": b""}, "absolute path"),
        ("ok", {"sglang/../x.py": b""}, "contains '..'"),
        ("ok", {"torch/x.py": b""}, "outside the sglang/ package"),
        ("../up", {SPEC: b""}, "not a plain folder name"),
        ("a/b", {SPEC: b""}, "not a plain folder name"),
    ],
)
def test_snapshot_from_files_refuses_bad_input_and_writes_nothing(env, name, files, message):
    with pytest.raises(BadInput, match=message):
        SN.snapshot_from_files(name, "0.5.12.post1", {"kind": "host"}, files)
    assert not env.exists() or not any(env.iterdir())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format=2), "format 2 is not 1"),
        (lambda d: d.pop("sglang_version"), "'sglang_version' missing"),
        (lambda d: d["files"].append({"path": "../../etc/passwd", "sha256": "0" * 64, "size": 1}), "contains '..'"),
        (lambda d: d["files"].append({"path": "sglang/x.py"}), "needs sha256 and size"),
        (lambda d: d.update(source={"kind": "ftp"}), "kind 'pypi' or 'host'"),
    ],
)
def test_a_malformed_manifest_is_bad_input(env, mutate, message):
    SN.snapshot_from_files("h", "0.5.12.post1", {"kind": "host"}, {SPEC: b"x = 1\n"})
    path = env / "h" / "MANIFEST.json"
    doc = json.loads(path.read_text())
    mutate(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput, match=message) as exc:
        SN.load_snapshot("h")
    assert "MANIFEST.json" in exc.value.message


def test_a_missing_snapshot_is_bad_input(env):
    with pytest.raises(BadInput, match="no such snapshot"):
        SN.load_snapshot("nope")


def _rewrite_snapshot_repeatedly(snapshot_dir: str, rounds: int, barrier) -> str:
    """One writer process: re-take the host snapshot ``rounds`` times, each with new content
    (so each is a real folder swap)."""
    import os

    os.environ["DDTREE_DEPLOY_SNAPSHOT"] = snapshot_dir
    from ddtree_deploy.release import snapshot

    barrier.wait()
    try:
        for i in range(rounds):
            snapshot.snapshot_from_files("ct200", "0.5.12.post1", {"kind": "host", "host": "ct200"},
                                         {SPEC: f"x = '{os.getpid()}-{i}'\n".encode()})
    except Exception as exc:  # reported to the parent, which fails the test with it
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_concurrent_writers_of_one_snapshot_all_succeed(env):
    # Two `snapshot pull`s, `check --release`s or fleet pushes in separate processes may
    # rewrite the same snapshot at once: each swap must wait for the other, none may fail.
    import multiprocessing

    SN.snapshot_from_files("ct200", "0.5.12.post1", {"kind": "host", "host": "ct200"}, {SPEC: b"x = 0\n"})
    ctx = multiprocessing.get_context("spawn")
    writers = 4
    with ctx.Manager() as manager:
        barrier = manager.Barrier(writers)
        with ctx.Pool(writers) as pool:
            results = pool.starmap(_rewrite_snapshot_repeatedly, [(str(env), 150, barrier)] * writers)
    assert results == ["ok"] * writers
    assert SN.load_snapshot("ct200").read_files()[SPEC].startswith(b"x = '")  # intact: sha256 matches
    # no half-swapped folders left (the writers' lock file stays: it is how they take turns)
    assert sorted(p.name for p in env.iterdir()) == [".ct200.lock", "ct200"]
