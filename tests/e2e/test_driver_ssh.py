"""The host's NVIDIA driver over a real sshd: status's driver line, push refused before any change.

Real parts: OpenSSH on loopback (tests/sshd_host.py's host fixture, on this module's own sshd),
real SGLang release files (0.5.12.post1; 0.5.23 for the host whose driver cannot run it), the
real agent and CLI. The one stand-in: ``nvidia-smi`` (no machine here has an NVIDIA driver), a
shell script printing the real tool's query CSV and banner (ddtree_testkit/standin_nvidia_smi.py),
on every session's PATH through sshd's SetEnv, with the driver version each test sets.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from ddtree_deploy.sandbox import SandboxHost, SSHServer
from ddtree_deploy.sandbox.hostenv import make_python_env
from ddtree_testkit import standin_nvidia_smi as standin

from envelope_check import check_envelope
# host (conftest.py's): one per test, on this module's sshd (below)
from sshd_host import DEPLOY_FAMILY, DEPLOY_SERIES, SPEC, UTILS, cli

_BIN: dict[str, Path] = {}


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """This module's sshd: every session's PATH starts with the stand-in nvidia-smi's folder."""
    bin_dir = tmp_path_factory.mktemp("standin-bin")
    _BIN["dir"] = bin_dir
    with SSHServer(tmp_path_factory.mktemp("sshd"), env={"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"}) as s:
        yield s


@pytest.fixture
def smi(sshd):
    """The stand-in nvidia-smi's folder (on the hosts' PATH); emptied after each test."""
    yield _BIN["dir"]
    standin.remove(_BIN["dir"])


def files_of(h: SandboxHost) -> dict[str, str]:
    """sha256 of every file under the host's package root."""
    return {str(p.relative_to(h.site)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(h.site.rglob("*")) if p.is_file()}


def untouched(h: SandboxHost, before: dict[str, str]) -> None:
    assert files_of(h) == before
    state = h.state_dir
    assert not (state / "journal.json").exists() and not list(state.rglob("journal.json"))
    assert not list(state.rglob("backups")) and not list(state.rglob("lock")) and not list(state.rglob("staging"))


def registry(folder: Path, **ranges: str) -> Path:
    """A family registry: the small real test series (tests/data/deploy_series) copied once per
    ``name=range``, each with that range (what "the newest release DDTree covers" reads)."""
    shutil.copytree(DEPLOY_SERIES, folder)
    patches = folder / "patches"
    for name, spec in ranges.items():
        shutil.copytree(DEPLOY_FAMILY, patches / name)
        (patches / name / "family.toml").write_text(f'sglang = "{spec}"\ndescription = "coverage only"\n')
    shutil.rmtree(patches / DEPLOY_FAMILY.name)
    return patches


@pytest.fixture
def host_0523(sshd, tmp_path, monkeypatch):
    """A host whose SGLang is the real 0.5.23 (CUDA 13 only), under a registry whose families
    cover 0.5.12 - 0.5.13 and 0.5.14 - 0.5.19 (the CUDA 12 releases) and 0.5.20 - 0.5.23."""
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(registry(
        tmp_path / "series", **{"v1": ">=0.5.12,<0.5.14", "v2-cuda12": ">=0.5.14,<0.5.20",
                                 "v2": ">=0.5.20,<0.5.24"})))
    root = tmp_path / "h0523"
    python, site = make_python_env(root / "env", [SPEC, UTILS], version="0.5.23")
    h = SandboxHost(name="gpu0523", server=sshd, python=python, site=site, state_dir=root / "state")
    h.inventory(smoke_levels=[])
    return h


def one_json(result, command: str | None = None) -> dict:
    """The one host's entry of a --json run, its envelope checked against docs/json-schema.json."""
    doc = check_envelope(result.stdout, result.exit_code, command) if command else json.loads(result.stdout)
    (entry,) = doc["hosts"]
    return entry


# ---------------------------------------------------------------- status


def test_status_says_the_driver_its_cuda_and_the_lane_it_allows(host, smi):
    standin.install(smi, driver="570.124.06", cuda="12.8")
    result = cli("status", "--host", host.name)
    assert result.exit_code == 0, result.output
    # The test registry (tests/data/deploy_series) covers 0.5.12 only: the newest it covers.
    assert ("  driver: 570.124.06 (CUDA 12.8): the cu129 lane only (SGLang up to 0.5.19); "
            "newest release DDTree covers here: 0.5.12.post1") in result.stdout.splitlines()
    doc = one_json(cli("status", "--host", host.name, "--json"), "status")["driver"]
    assert doc == {
        "state": "found", "version": "570.124.06", "cuda": "12.8", "cuda_from": "nvidia-smi",
        "gpus": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"], "lane": "cu129",
        "newest_covered": "0.5.12.post1", "release_runs": True, "error": None, "read": None,
        "image_cuda": None, "image_cuda_from": None, "image_runs": None,  # a venv host: no image
        "line": doc["line"],
    }


def test_status_on_a_cuda_13_driver(host, smi):
    standin.install(smi, driver="580.95.05", cuda="13.0", names=["NVIDIA H200"])
    line = [x for x in cli("status", "--host", host.name).stdout.splitlines() if "driver:" in x]
    assert line == ["  driver: 580.95.05 (CUDA 13.0): every SGLang lane (cu130: SGLang 0.5.20+); "
                    "newest release DDTree covers here: 0.5.12.post1"]


def test_status_without_nvidia_smi_says_no_driver_was_found(host, smi):
    standin.remove(smi)
    result = cli("status", "--host", host.name)
    assert result.exit_code == 0, result.output
    assert ("  driver: none found (no nvidia-smi on the host: a CPU or demo host); push proceeds with a warning"
            in result.stdout.splitlines())
    assert one_json(cli("status", "--host", host.name, "--json"), "status")["driver"]["state"] == "none"


def test_status_with_output_that_is_no_driver_version_says_what_was_read(host, smi):
    standin.install(smi, query_output="NVRM: API mismatch, NVIDIA H100\n")
    result = cli("status", "--host", host.name)
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stdout.splitlines() if "driver:" in x]
    assert line == ("  driver: unreadable: cannot read a driver version in nvidia-smi's output: "
                    "'NVRM: API mismatch, NVIDIA H100'; it printed 'NVRM: API mismatch, NVIDIA H100'; "
                    "push refuses this host without --force-driver")


# ---------------------------------------------------------------- push


def test_push_of_a_release_the_driver_cannot_run_is_refused_before_any_change(host_0523, smi):
    standin.install(smi, driver="570.124.06", cuda="12.8")
    before = files_of(host_0523)
    result = cli("push", "--host", host_0523.name)
    assert result.exit_code == 2, result.output
    line = ("gpu0523: runs SGLang 0.5.23: driver 570.x (570.124.06) supports CUDA 12.8; SGLang 0.5.20+ needs "
            "CUDA 13 (driver 580+); the newest release DDTree covers on this host is 0.5.19; nothing was changed")
    assert line in result.output, result.output.splitlines()
    untouched(host_0523, before)
    doc = one_json(cli("push", "--host", host_0523.name, "--json"), "push")
    assert doc["error"]["code"] == "driver-too-old" and doc["error"]["message"] == line
    assert "--force-driver" in doc["error"]["hint"]
    dry = cli("push", "--host", host_0523.name, "--dry-run")  # says what a push would do: the same refusal
    assert dry.exit_code == 2 and line in dry.output, dry.output
    untouched(host_0523, before)


def test_a_push_the_driver_refuses_measures_no_speed_baseline(sshd, smi, tmp_path, monkeypatch):
    """A served host with [analysis]: the speed gate samples the old server before the lock,
    but a push its driver check refuses is refused first (exit 2), no window taken. The server
    is the named STAND-IN under supervisord (tests/serve_host.py), with metrics."""
    pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in")
    from ddtree_testkit.standin_metrics import write_names
    from serve_host import Served
    from sshd_host import ADDED

    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(DEPLOY_SERIES / "patches"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    names = tmp_path / "names.json"
    write_names(names, "0.5.12.post1")
    s = Served(sshd, tmp_path, "gpu-served", package_file=ADDED,
               tables="\n[analysis]\nwindow_s = 3\ninterval_s = 1\nmin_samples = 3\n",
               extra_argv=["--enable-metrics", "--metric-names", str(names), "--traffic", "2", "--accept-length", "3.0"])
    s.sup.start()
    try:
        s.wait_healthy()
        standin.install(smi, driver="520.61.05", cuda="11.8")  # CUDA 11: runs no SGLang lane
        before = files_of(s.host)
        result = cli("push", "--host", s.name)
        assert result.exit_code == 2, result.output
        assert "gpu-served: runs SGLang 0.5.12.post1: driver 520.x (520.61.05) supports CUDA 11.8" in result.output
        assert "speed baseline:" not in result.output, result.output  # refused before any window
        untouched(s.host, before)
    finally:
        s.sup.stop()


def test_push_where_nvidia_smi_prints_no_driver_is_refused_saying_what_it_read(host, smi):
    standin.install(smi, query_output="??, NVIDIA H100\n")
    before = files_of(host)
    result = cli("push", "--host", host.name, "--json")
    assert result.exit_code == 2, result.output
    error = one_json(result, "push")["error"]
    assert error["code"] == "driver-unreadable"
    assert error["message"] == (f"{host.name}: cannot read a driver version in nvidia-smi's output: "
                                "'??, NVIDIA H100'; it printed '??, NVIDIA H100'; nothing was changed")
    untouched(host, before)


def test_force_driver_pushes_past_the_refusal_with_a_warning(host, smi):
    # Driver 520 supports CUDA 11.8: no SGLang lane from 0.5.11 on (CUDA 12 needs 525.60.13+).
    standin.install(smi, driver="520.61.05", cuda="11.8")
    before = files_of(host)
    refused = cli("push", "--host", host.name)
    assert refused.exit_code == 2 and "SGLang 0.5.11+ needs CUDA 12 (driver 525.60.13+)" in refused.output
    assert "no release DDTree covers runs on this host" in refused.output
    untouched(host, before)
    forced = cli("push", "--host", host.name, "--force-driver")
    assert forced.exit_code == 0, forced.output
    assert "; pushing anyway (--force-driver)" in forced.stdout.splitlines()[0]
    assert json.loads((host.state_dir / "journal.json").read_text())["phase"] == "deployed"


def test_push_on_a_host_without_nvidia_smi_proceeds_with_a_warning_line(host, smi):
    standin.remove(smi)
    result = cli("push", "--host", host.name, "--json")
    assert result.exit_code == 0, result.output
    assert one_json(result, "push")["driver_warning"] == (f"{host.name}: no NVIDIA driver found (no nvidia-smi on the "
                                                  "host): pushing without the driver check")


def test_push_on_a_driver_that_runs_the_release_says_nothing_of_it(host, smi):
    standin.install(smi, driver="570.124.06", cuda="12.8")
    result = cli("push", "--host", host.name, "--json")
    assert result.exit_code == 0, result.output
    entry = one_json(result, "push")
    assert "driver_warning" not in entry and entry["outcome"] == "pushed"


# ---------------------------------------------------------------- image --base, for target hosts


def test_image_for_hosts_refuses_a_base_their_driver_cannot_run(host, smi, tmp_path):
    standin.install(smi, driver="570.124.06", cuda="12.8")
    out = tmp_path / "ctx"
    base = "lmsysorg/sglang:v0.5.12.post1-cu130"  # the tag says CUDA 13
    refused = cli("image", "--base", base, "--release", "0.5.12.post1", "--out", str(out), "--host", host.name)
    assert refused.exit_code == 2, refused.output
    assert (f"--base {base} needs CUDA 13.0 (driver 580+), from its tag: {host.name}'s driver 570.124.06 supports "
            "CUDA 12.8; the newest release DDTree covers on those hosts is 0.5.12.post1; nothing was written"
            ) in " ".join(refused.output.split())
    assert not out.exists()
    forced = cli("image", "--base", base, "--release", "0.5.12.post1", "--out", str(out), "--host", host.name,
                 "--force-driver", "--json")
    assert forced.exit_code == 0, forced.output
    doc = check_envelope(forced.stdout, 0, "image")
    assert doc["labels"]["io.ddtree-deploy.cuda"] == "13.0" and doc["labels"]["io.ddtree-deploy.cuda.source"] == "tag"
    assert doc["drivers"] == {host.name: "570.124.06"} and "writing it anyway (--force-driver)" in forced.stderr


def test_image_for_hosts_whose_driver_runs_the_base_records_its_cuda(host, smi, tmp_path):
    standin.install(smi, driver="570.124.06", cuda="12.8")
    r = cli("image", "--base", "lmsysorg/sglang:v0.5.12.post1-cu129", "--release", "0.5.12.post1",
            "--out", str(tmp_path / "ctx"), "--host", host.name, "--json")
    assert r.exit_code == 0, r.output
    labels = check_envelope(r.stdout, 0, "image")["labels"]
    assert (labels["io.ddtree-deploy.cuda"], labels["io.ddtree-deploy.cuda.source"]) == ("12.9", "tag")
    assert 'io.ddtree-deploy.cuda="12.9"' in (tmp_path / "ctx" / "Dockerfile").read_text()
    # A host without nvidia-smi is not refused: one line says its driver was not checked.
    standin.remove(smi)
    r = cli("image", "--base", "lmsysorg/sglang:v0.5.12.post1-cu130", "--release", "0.5.12.post1",
            "--out", str(tmp_path / "ctx2"), "--host", host.name)
    assert r.exit_code == 0, r.output
    assert (f"{host.name}: no NVIDIA driver found (no nvidia-smi on the host): --base not checked against it"
            in " ".join(r.stderr.split()))
