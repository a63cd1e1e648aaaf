"""releases.py: PyPI listing, verified download into the cache, reading files from a wheel.

Downloads are tested against a real HTTP server on loopback serving the real
0.5.12.post1 wheel and a real (trimmed) PyPI project document, so the cache and
digest logic run for real without depending on the internet.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import resource
import shutil
import signal
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from packaging.version import Version

from ddtree_deploy.base.digests import sha256_file
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.release import releases

WHEEL_PATH_IN_DOC = "../../packages/{name}"  # relative, as the mirror here writes them


def _doc(data_dir: Path) -> dict:
    return json.loads((data_dir / "pypi" / "sglang-trimmed.json").read_text())


# --- listing (pure) ---------------------------------------------------------


def test_parse_project_sorts_versions_numerically_and_resolves_urls(data_dir):
    rel = releases.parse_project(_doc(data_dir), base_url="https://mirror.example/pypi/sglang/json")
    assert [str(r.version) for r in rel] == ["0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.12.post1"]
    f = rel[-1].files[0]
    assert f.url.startswith("https://mirror.example/packages/packages/")
    assert len(f.sha256) == 64 and f.size > 1_000_000
    assert not any(r.yanked for r in rel)


def test_a_release_is_yanked_only_when_all_its_files_are(data_dir):
    doc = _doc(data_dir)
    # Edited copy of the real document: PyPI marks yanks per file.
    for f in doc["releases"]["0.5.11"]:
        f["yanked"] = True
    doc["releases"]["0.5.12"][0]["yanked"] = True
    rel = {str(r.version): r for r in releases.parse_project(doc, base_url="https://x/pypi/sglang/json")}
    assert rel["0.5.11"].yanked
    assert not rel["0.5.12"].yanked


def test_choose_wheel_prefers_pure_then_cp311_x86_64(data_dir):
    rel = {str(r.version): r for r in releases.parse_project(_doc(data_dir), base_url="https://x/")}
    assert releases.choose_wheel(rel["0.5.10"]).filename == "sglang-0.5.10-py3-none-any.whl"
    assert (releases.choose_wheel(rel["0.5.12.post1"]).filename
            == "sglang-0.5.12.post1-cp311-cp311-manylinux_2_34_x86_64.whl")


def test_choose_wheel_refuses_a_release_without_wheels(data_dir):
    doc = _doc(data_dir)
    doc["releases"]["0.5.9"] = [f for f in doc["releases"]["0.5.9"] if f["filename"].endswith(".tar.gz")]
    rel = {str(r.version): r for r in releases.parse_project(doc, base_url="https://x/")}
    with pytest.raises(BadInput, match="0.5.9 has no wheel"):
        releases.choose_wheel(rel["0.5.9"])


def test_bad_version_is_bad_input():
    with pytest.raises(BadInput, match="not a valid PEP 440 version"):
        releases.parse_version("latest")


# --- reading a wheel (offline) ----------------------------------------------


def test_read_wheel_files_matches_the_extracted_release(release_wheel, release_tree):
    paths = ["sglang/srt/speculative/spec_info.py", "sglang/srt/server_args.py", "sglang/not_there.py"]
    got = releases.read_wheel_files(release_wheel, paths)
    assert set(got) == set(paths[:2])
    for p in paths[:2]:
        assert got[p] == (release_tree / p).read_bytes()


def test_wheel_version_reads_dist_info(release_wheel, release_version):
    assert releases.wheel_version(release_wheel) == release_version


def test_a_damaged_member_is_caught_by_record(release_wheel, tmp_path):
    target = "sglang/srt/speculative/spec_info.py"
    damaged = tmp_path / release_wheel.name
    with zipfile.ZipFile(release_wheel) as src, zipfile.ZipFile(damaged, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == target:
                data = data.replace(b"DFLASH = auto()", b"DFLASH = auto() ")
            dst.writestr(info, data)
    with pytest.raises(DeployError, match="does not match the wheel's RECORD"):
        releases.read_wheel_files(damaged, [target])


# --- download and cache, against a loopback index ---------------------------


class _Index:
    """A real HTTP server on 127.0.0.1 serving a project document and one wheel."""

    def __init__(self, root: Path):
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pypi"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.requests: list[str] = _QuietHandler.log

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class _QuietHandler(SimpleHTTPRequestHandler):
    log: list[str] = []

    def log_message(self, *args):  # keep pytest output clean; remember the path
        _QuietHandler.log.append(self.path)


@pytest.fixture
def index(tmp_path, release_wheel, release_version, data_dir, monkeypatch):
    """Serve the real wheel and a project document naming its real digest; empty cache."""
    root = tmp_path / "www"
    (root / "pypi" / "sglang").mkdir(parents=True)
    (root / "packages").mkdir()
    shutil.copy(release_wheel, root / "packages" / release_wheel.name)
    doc = _doc(data_dir)
    doc["releases"][release_version] = [
        {
            "filename": release_wheel.name,
            "url": WHEEL_PATH_IN_DOC.format(name=release_wheel.name),
            "digests": {"sha256": sha256_file(release_wheel)},
            "size": release_wheel.stat().st_size,
            "packagetype": "bdist_wheel",
            "yanked": False,
        }
    ]
    (root / "pypi" / "sglang" / "json").write_text(json.dumps(doc))
    monkeypatch.setenv("DDTREE_DEPLOY_CACHE", str(tmp_path / "cache"))
    _QuietHandler.log.clear()
    server = _Index(root)
    monkeypatch.setenv("DDTREE_DEPLOY_PYPI", server.url)
    yield server, root
    server.stop()


def test_ensure_wheel_downloads_verifies_and_then_works_offline(index, release_version, release_wheel):
    server, _ = index
    path = releases.ensure_wheel(release_version)
    assert path.parent == releases.wheel_cache()
    assert path.read_bytes() == release_wheel.read_bytes()
    assert any(p.endswith(release_wheel.name) for p in server.requests)
    server.stop()  # from here on, any network call would fail
    assert releases.ensure_wheel(release_version) == path
    assert not list(path.parent.glob(".*"))  # no temp files left behind


def test_a_corrupt_cached_wheel_is_downloaded_again(index, release_version, release_wheel):
    path = releases.ensure_wheel(release_version)
    path.write_bytes(b"PK-not-the-wheel")
    server, _ = index
    server.requests.clear()
    again = releases.ensure_wheel(release_version)
    assert again.read_bytes() == release_wheel.read_bytes()
    assert any(p.endswith(release_wheel.name) for p in server.requests)


def test_a_download_that_does_not_match_the_registry_is_refused(index, release_version, release_wheel):
    _, root = index
    served = root / "packages" / release_wheel.name
    served.write_bytes(served.read_bytes()[:-10] + b"0123456789")  # same size, other bytes
    with pytest.raises(DeployError, match="differs from the registry's") as exc:
        releases.ensure_wheel(release_version)
    assert exc.value.code == "digest"
    assert not list(releases.wheel_cache().iterdir())  # nothing cached, no temp file


def test_an_unknown_release_is_bad_input(index):
    with pytest.raises(BadInput, match="sglang 9.9.9 is not a release"):
        releases.ensure_wheel("9.9.9")


def test_an_unreachable_index_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DDTREE_DEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DDTREE_DEPLOY_PYPI", "http://127.0.0.1:9/pypi")  # discard port: refused
    with pytest.raises(DeployError, match="cannot reach the package index"):
        releases.ensure_wheel("0.5.12.post1")


# The network's failures, each said one way (releases._network, the one place that says them).


def test_an_index_http_error_names_its_status(index):
    _, root = index
    (root / "pypi" / "sglang" / "json").unlink()
    with pytest.raises(DeployError, match=r"/pypi/sglang/json: HTTP 404 from the package index$") as exc:
        releases.list_releases(refresh=True)
    assert exc.value.code != "network"  # the index answered: not an offline machine


def test_a_wheel_the_index_does_not_serve_is_an_http_error(index, release_version, release_wheel):
    _, root = index
    (root / "packages" / release_wheel.name).unlink()
    with pytest.raises(DeployError, match=rf"{re.escape(release_wheel.name)}: HTTP 404$"):
        releases.ensure_wheel(release_version)
    assert not list(releases.wheel_cache().iterdir())  # nothing cached, no temp file


def test_a_download_that_cannot_connect_is_a_network_error(index, release_version):
    release = releases.find_release(release_version, releases.list_releases(refresh=True))
    unreachable = dataclasses.replace(releases.choose_wheel(release), url="http://127.0.0.1:9/w.whl")  # discard port
    with pytest.raises(DeployError, match=r"^http://127.0.0.1:9/w.whl: download failed \(") as exc:
        releases.download(unreachable)
    assert exc.value.code == "network" and exc.value.hint == "check the network and run again"
    assert not list(releases.wheel_cache().iterdir())


def test_a_cache_that_cannot_be_written_is_the_caches_error_not_the_networks(index, release_version):
    """A full disk while the wheel streams in (a real EFBIG: the process's file size limit) is
    said as the cache's failure, with its own code; nothing half-written stays behind."""
    release = releases.find_release(release_version, releases.list_releases(refresh=True))
    wheel = releases.choose_wheel(release)
    cache = releases.wheel_cache()
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, old_limit[1]))
    try:
        with pytest.raises(DeployError, match=rf"^{re.escape(str(cache))}: cannot write the download cache \(") as exc:
            releases.download(wheel)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert exc.value.code == "cache" and "DDTREE_DEPLOY_CACHE" in exc.value.hint
    assert not list(cache.iterdir())


def test_a_cache_folder_that_is_a_file_is_the_caches_error(index, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("DDTREE_DEPLOY_CACHE", str(blocker))
    with pytest.raises(DeployError, match=r"cannot write the download cache") as exc:
        releases.list_releases(refresh=True)
    assert exc.value.code == "cache"


def test_list_releases_uses_the_cached_listing_when_asked(index):
    server, _ = index
    first = releases.list_releases(refresh=True)
    server.stop()
    assert releases.list_releases(refresh=False) == first
    assert Version("0.5.12.post1") in {r.version for r in first}


@pytest.mark.network
def test_live_pypi_lists_the_baseline_release_with_the_cached_wheels_digest(
    monkeypatch, tmp_path, release_wheel
):
    monkeypatch.setenv("DDTREE_DEPLOY_CACHE", str(tmp_path / "cache"))
    try:
        rel = releases.list_releases(refresh=True)
    except DeployError as exc:
        if exc.code == "network":
            pytest.skip(f"PyPI unreachable: {exc.message}")
        raise
    post1 = releases.find_release("0.5.12.post1", rel)
    assert post1 is not None
    by_name = {f.filename: f for f in post1.wheels}
    assert by_name[release_wheel.name].sha256 == sha256_file(release_wheel)
