"""The host's NVIDIA driver on a ``[container]`` host, with REAL containers (podman over a real
sshd on loopback: tests/container_host.py): status's driver line with the CUDA of the image
the container runs, a push refused in one line before the series is chosen, and a forced
push whose built image keeps the image's CUDA label.

The one stand-in: ``nvidia-smi`` (no machine here has an NVIDIA driver), the shell script of
ddtree_testkit/standin_nvidia_smi.py printing the real tool's query CSV and banner, on the
PATH of this module's sshd sessions: on the HOST only. The test image has no nvidia-smi at
all, so a driver that status reports was read on the host, outside the container. The image's
CUDA is what NVIDIA's CUDA base images carry: ``ENV CUDA_VERSION=...``, set here by a layer
over the test image (its SGLang: the real 0.5.12.post1 files). podman is flaky when run in
parallel: run this module without xdist.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from container_host import IMAGE, cli
from ddtree_deploy.sandbox import SSHServer
from ddtree_testkit import containers as ct
from ddtree_testkit import standin_nvidia_smi as standin
from envelope_check import check_envelope
from sshd_host import DEPLOY_SERIES, series_covering_elsewhere

CUDA12 = "localhost/ddtree-test/sglang:cuda12"  # ENV CUDA_VERSION=12.9.1 (what a -cu129 image says)
CUDA13 = "localhost/ddtree-test/sglang:cuda13"  # ENV CUDA_VERSION=13.0.1 (an image of the cu130 lane)
_BIN: dict[str, Path] = {}


@pytest.fixture(scope="module")
def sshd(tmp_path_factory, engine):
    """This module's sshd: podman's storage (``engine``), and every session's PATH starting with
    the stand-in nvidia-smi's folder; the two CUDA images built over the test image."""
    bin_dir = tmp_path_factory.mktemp("standin-bin")
    _BIN["dir"] = bin_dir
    context = tmp_path_factory.mktemp("cuda-layers")
    for tag, version in ((CUDA12, "12.9.1"), (CUDA13, "13.0.1")):
        (context / "Containerfile").write_text(f"FROM {IMAGE}\nENV CUDA_VERSION={version}\n")
        ct.podman(engine, "build", "-t", tag, "-f", str(context / "Containerfile"), str(context))
    # sbin too: the image build's network helper (netavark) runs iptables/nft from there
    env = {**engine, "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    with SSHServer(tmp_path_factory.mktemp("sshd"), env=env) as server:
        yield server


@pytest.fixture
def smi(sshd):
    """The stand-in nvidia-smi's folder (on the host's PATH); emptied after each test."""
    yield _BIN["dir"]
    standin.remove(_BIN["dir"])


def images(engine: dict) -> set[str]:
    return set(ct.podman(engine, "images", "-q", "--no-trunc").stdout.decode().split())


def one_json(r, command: str) -> dict:
    (entry,) = check_envelope(r.stdout, r.returncode, command)["hosts"]
    return entry


def test_status_reads_the_driver_on_the_host_and_the_cuda_of_the_image(box, smi):
    standin.install(smi, driver="570.124.06", cuda="12.8")
    ok = box("ctd-status12", image=CUDA12)
    r = cli("status", "--host", ok.name)
    assert r.returncode == 0, r.stdout + r.stderr
    said = " ".join(r.stdout.split())  # the console wraps its long lines
    assert ("driver: 570.124.06 (CUDA 12.8): the cu129 lane only (SGLang up to 0.5.19); newest release DDTree "
            "covers here: 0.5.12.post1; the container's image: CUDA 12.9 (its env CUDA_VERSION): this driver runs "
            "it phase: never-deployed") in said, r.stdout
    doc = one_json(cli("status", "--host", ok.name, "--json"), "status")["driver"]
    assert (doc["state"], doc["version"], doc["cuda"], doc["gpus"]) == (
        "found", "570.124.06", "12.8", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    assert (doc["image_cuda"], doc["image_cuda_from"], doc["image_runs"]) == ("12.9", "env CUDA_VERSION", True)
    # nvidia-smi is the host's: the container has none (its PATH, its whole tree)
    inside = ct.podman(ok.env, "exec", ok.name, "sh", "-c", "command -v nvidia-smi", check=False)
    assert inside.returncode != 0 and not inside.stdout.strip()
    # a CUDA 13 image on that driver: said, and what push will do about it
    new = box("ctd-status13", image=CUDA13)
    doc = one_json(cli("status", "--host", new.name, "--json"), "status")["driver"]
    assert (doc["image_cuda"], doc["image_runs"]) == ("13.0", False)
    assert doc["line"].endswith("the container's image: CUDA 13.0 (its env CUDA_VERSION): this driver cannot run "
                                "it (push refuses without --force-driver)"), doc["line"]
    # no nvidia-smi on the host: said, the image's CUDA still shown
    standin.remove(smi)
    doc = one_json(cli("status", "--host", ok.name, "--json"), "status")["driver"]
    assert doc["state"] == "none" and doc["image_cuda"] == "12.9" and doc["image_runs"] is None
    assert doc["line"].startswith("driver: none found (no nvidia-smi on the host")


def test_push_of_an_image_the_driver_cannot_run_is_refused_before_the_series(box, smi, engine, tmp_path,
                                                                             monkeypatch):
    """Driver 570 (CUDA 12.8) and an image built for CUDA 13: refused in one line, exit 2,
    nothing changed (no lock, no image built, the same container). Under a registry that
    covers no family for the image's release the refusal is still the driver's: the driver
    check comes before the series is chosen."""
    standin.install(smi, driver="570.124.06", cuda="12.8")
    b = box("ctd-refused", image=CUDA13)
    before, container = images(engine), b.inspect()["Id"]
    r = cli("push", "--host", b.name, "--json")
    doc = check_envelope(r.stdout, r.returncode, "push")
    assert r.returncode == 2 and doc["error"]["code"] == "driver-too-old", r.stdout + r.stderr
    message = doc["error"]["message"]
    assert "\n" not in message and message == (
        f"{b.name}: its container's image {CUDA13} is built for CUDA 13.0 (read from its env CUDA_VERSION): "
        "driver 570.x (570.124.06) supports CUDA 12.8; CUDA 13 needs driver 580+; run an image of SGLang "
        "0.5.12.post1 or older with DDTree's coverage (cu129 lane: CUDA 12.9); nothing was changed"), message
    assert "--force-driver" in doc["error"]["hint"]
    assert not (b.state_dir / "lock").exists() and images(engine) == before and b.inspect()["Id"] == container
    # a registry whose one family covers 0.5.13 only: still the driver's refusal, not the series'
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(series_covering_elsewhere(tmp_path)))
    r = cli("push", "--host", b.name)
    assert r.returncode == 2 and "is built for CUDA 13.0" in r.stderr, r.stdout + r.stderr
    assert "no family covers" not in r.stderr
    # bad input: nvidia-smi that answers no driver version: one line, exit 2, nothing changed
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(DEPLOY_SERIES / "patches"))
    standin.install(smi, query_output="NVIDIA-SMI has failed because it couldn't communicate\n")
    r = cli("push", "--host", b.name, "--json")
    doc = check_envelope(r.stdout, r.returncode, "push")
    assert r.returncode == 2 and doc["error"]["code"] == "driver-unreadable", r.stdout + r.stderr
    assert "\n" not in doc["error"]["message"] and images(engine) == before and b.inspect()["Id"] == container


def test_a_forced_push_warns_first_and_its_image_keeps_the_image_cuda(box, smi, engine):
    """--force-driver past the refusal: the warning is the push's first line; the image it
    builds (FROM a kept tag of ours, which names no CUDA) is labelled with the CUDA read from
    the image the container ran (its CUDA_VERSION), not the release's lane."""
    standin.install(smi, driver="570.124.06", cuda="12.8")
    b = box("ctd-forced", image=CUDA13)
    r = cli("push", "--host", b.name, "--force-driver")
    assert r.returncode == 0, r.stdout + r.stderr
    said = " ".join(r.stdout.split())  # the console wraps its long lines
    assert said.startswith(f"{b.name}: its container's image {CUDA13} is built for CUDA 13.0"), r.stdout
    assert said.index("; pushing anyway (--force-driver)") < said.index(f"{b.name}: built "), r.stdout
    after = b.inspect()
    labels = json.loads(ct.podman(engine, "image", "inspect", after["Image"]).stdout)[0]["Config"]["Labels"]
    assert labels["io.ddtree-deploy.series"] == "sglang-0.5.12"
    assert (labels["io.ddtree-deploy.cuda"], labels["io.ddtree-deploy.cuda.source"]) == ("13.0", "env CUDA_VERSION")
    # and status reads the built image's CUDA as before (its CUDA_VERSION, inherited)
    doc = one_json(cli("status", "--host", b.name, "--json"), "status")["driver"]
    assert (doc["image_cuda"], doc["image_cuda_from"], doc["image_runs"]) == ("13.0", "env CUDA_VERSION", False)
