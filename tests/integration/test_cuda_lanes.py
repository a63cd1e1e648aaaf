"""CUDA lanes per SGLang release, the driver each needs, and the host probe's parsers (pure),
plus the probe itself run here against a stand-in nvidia-smi (ddtree_testkit/standin_nvidia_smi.py:
no machine here has an NVIDIA driver; the stand-in prints the real tool's formats)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_deploy.engine.series import families
from ddtree_deploy.hostprog import gpu_driver
from ddtree_deploy.release import cuda_lanes as cl
from ddtree_deploy.release.cuda_lanes import Driver
from ddtree_testkit import standin_nvidia_smi as standin


def drv(version: str, cuda: str | None = None) -> Driver:
    return cl.driver_from_fact({"found": True, "driver": version, "cuda": cuda})


def registry(tmp_path: Path, **ranges: str) -> list:
    """Real FamilyInfo values read from family.toml files (the registry's coverage)."""
    for name, spec in ranges.items():
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "family.toml").write_text(f'sglang = "{spec}"\ndescription = "x"\n')
    return families(tmp_path)


# ---------------------------------------------------------------- lanes


@pytest.mark.parametrize("release", cl.KNOWN_RELEASES)
def test_every_release_from_0_5_11_has_its_lane(release):
    cuda13 = cl.version(release) >= cl.version("0.5.20")
    assert cl.lanes_of(release) == ((cl.CU130,) if cuda13 else (cl.CU129,))
    assert cl.lane_label(release) == ("cu130" if cuda13 else "cu129")


def test_the_lane_table_edges():
    assert cl.lanes_of("0.5.10.post1") == () and cl.lane_label("0.5.10.post1") == "?"
    assert cl.last_release_of_major(12) == "0.5.19" and cl.first_release_of_major(13) == "0.5.20"
    assert cl.first_release_of_major(12) == "0.5.11"
    assert cl.lanes_of("0.5.24") == (cl.CU130,)  # "SGLang requires CUDA 13" holds for what comes next
    assert cl.KNOWN_RELEASES[-1] == "0.5.23" and len(cl.KNOWN_RELEASES) == 16


# ---------------------------------------------------------------- drivers


@pytest.mark.parametrize(("version", "cu129", "cu130"), [
    ("520.61.05", False, False),
    ("525.60.12", False, False),
    ("525.60.13", True, False),  # CUDA 12.x minor version compatibility floor (Linux)
    ("535.129.03", True, False),
    ("570.124.06", True, False),
    ("575.57.08", True, False),
    ("579.99", True, False),
    ("580.65.06", True, True),  # CUDA 13.x: >= 580
    ("590.44.01", True, True),
    ("1000.1", True, True),
])
def test_which_lanes_a_driver_runs(version, cu129, cu130):
    d = drv(version)
    assert d.runs("0.5.19") is cu129 and d.runs("0.5.12.post1") is cu129
    assert d.runs("0.5.20") is cu130 and d.runs("0.5.23") is cu130
    assert d.newest_lane() == (cl.CU130 if cu130 else cl.CU129 if cu129 else None)


def test_the_cuda_a_driver_supports_comes_from_the_banner_else_the_branch_table():
    assert drv("570.124.06", "12.8").cuda == "12.8" and drv("570.124.06", "12.8").cuda_from == "nvidia-smi"
    assert (drv("570.124.06").cuda, drv("570.124.06").cuda_from) == ("12.8", "driver table")
    assert drv("575.51.03").cuda == "12.9" and drv("580.65.06").cuda == "13.0" and drv("525.60.13").cuda == "12.0"
    assert cl.cuda_of_branch(440) is None


def test_a_fact_that_is_not_a_driver_version_stays_what_was_read():
    d = cl.driver_from_fact({"found": True, "driver": "N/A", "error": None, "read": "N/A, H100"})
    assert d.found and not d.readable and d.error == "cannot read a driver version in nvidia-smi's output: 'N/A'"
    assert not d.runs_major(12)
    assert cl.driver_from_fact({"found": False}) == Driver(found=False)
    assert cl.driver_from_fact(None) is None


# ---------------------------------------------------------------- what DDTree covers, from the registry


def test_newest_covered_follows_the_family_registry(tmp_path):
    today = registry(tmp_path / "a", **{"v1-12": ">=0.5.12,<0.5.13", "v1-13": ">=0.5.13,<0.5.14",
                                         "v2": ">=0.5.20,<0.5.24"})
    assert cl.newest_covered(drv("570.124.06"), today) == "0.5.13.post1"
    assert cl.newest_covered(drv("580.65.06"), today) == "0.5.23"
    with_cuda12 = registry(tmp_path / "b", **{"v1": ">=0.5.12,<0.5.14", "v2-cuda12": ">=0.5.14,<0.5.20",
                                               "v2": ">=0.5.20,<0.5.24"})
    assert cl.newest_covered(drv("570.124.06"), with_cuda12) == "0.5.19"
    assert cl.newest_covered(drv("520.61.05"), with_cuda12) is None
    # A host's own release counts too (a post-release the table does not list yet).
    assert cl.newest_covered(drv("570.124.06"), with_cuda12, ["0.5.19.post1"]) == "0.5.19.post1"


def test_an_unfinished_port_covers_nothing(tmp_path):
    infos = registry(tmp_path, **{"v1": ">=0.5.12,<0.5.14", "port": ">=0.5.14,<0.5.20"})
    (tmp_path / "port" / "0001-x.patch.rej").write_text("rejected\n")
    assert cl.newest_covered(drv("570.124.06"), families(tmp_path)) == "0.5.13.post1"
    assert cl.newest_covered(drv("570.124.06"), infos) == "0.5.19"


def test_the_refusal_is_one_line_naming_driver_cuda_and_the_way_out(tmp_path):
    infos = registry(tmp_path, **{"v1": ">=0.5.12,<0.5.14", "v2-cuda12": ">=0.5.14,<0.5.20",
                                  "v2": ">=0.5.20,<0.5.24"})
    assert cl.refusal("gpu1", "0.5.23", drv("570.124.06", "12.8"), infos) == (
        "gpu1: runs SGLang 0.5.23: driver 570.x (570.124.06) supports CUDA 12.8; SGLang 0.5.20+ needs CUDA 13 "
        "(driver 580+); the newest release DDTree covers on this host is 0.5.19")
    assert cl.refusal("gpu1", "0.5.19", drv("570.124.06", "12.8"), infos) is None
    assert cl.refusal("gpu1", "0.5.23", drv("580.65.06", "13.0"), infos) is None
    assert cl.refusal("old", "0.5.12.post1", drv("520.61.05", "11.8"), infos) == (
        "old: runs SGLang 0.5.12.post1: driver 520.x (520.61.05) supports CUDA 11.8; SGLang 0.5.11+ needs CUDA 12 "
        "(driver 525.60.13+); no release DDTree covers runs on this host")
    assert cl.refusal("x", "0.5.9", drv("520.61.05"), infos) is None  # no lane recorded: nothing against it


# ---------------------------------------------------------------- the probe's parsers (hostprog)

# NVIDIA's documented CSV query output: the fields asked, in order, ", " between them, one line
# per GPU, no header with noheader (nvidia-smi --help-query-gpu; `man nvidia-smi`, -q/--format).
REAL_QUERY = "570.124.06, NVIDIA H100 80GB HBM3\n570.124.06, NVIDIA H100 80GB HBM3\n"


def test_the_query_parser_reads_the_documented_csv():
    assert gpu_driver.parse_query(REAL_QUERY) == ("570.124.06", ["NVIDIA H100 80GB HBM3"] * 2, None)
    assert gpu_driver.parse_query("550.54, NVIDIA A100-SXM4-80GB\n") == ("550.54", ["NVIDIA A100-SXM4-80GB"], None)
    assert gpu_driver.parse_query(standin.query_lines("580.65.06", ["NVIDIA H200"]))[0] == "580.65.06"


@pytest.mark.parametrize(("text", "error"), [
    ("", "nvidia-smi listed no GPU (empty output)"),
    ("N/A, NVIDIA H100\n", "cannot read a driver version in nvidia-smi's output: 'N/A, NVIDIA H100'"),
    ("570, NVIDIA H100\n", "cannot read a driver version in nvidia-smi's output: '570, NVIDIA H100'"),
    ("570.124.06.1, x\n", "cannot read a driver version in nvidia-smi's output: '570.124.06.1, x'"),
    ("No devices were found\n", "cannot read a driver version in nvidia-smi's output: 'No devices were found'"),
    ("570.124.06, A\n575.51.03, B\n", "nvidia-smi reports different drivers per GPU: 570.124.06, 575.51.03"),
    ("x" * 500, "cannot read a driver version in nvidia-smi's output: '" + "x" * 200 + "...'"),
])
def test_a_bad_driver_string_is_one_line_saying_what_was_read(text, error):
    driver, _names, said = gpu_driver.parse_query(text)
    assert driver is None and said == error and "\n" not in said


def test_the_banner_gives_the_cuda_version():
    assert gpu_driver.parse_cuda(standin.banner("570.124.06", "12.8", ["NVIDIA H100"])) == "12.8"
    # The older layout (drivers 450-535): "| NVIDIA-SMI 535.129.03   Driver Version: ... CUDA Version: 12.2 |"
    assert gpu_driver.parse_cuda("| NVIDIA-SMI 535.129.03   Driver Version: 535.129.03   CUDA Version: 12.2     |") \
        == "12.2"
    assert gpu_driver.parse_cuda("| NVIDIA-SMI 570.1  Driver Version: 570.1  CUDA Version: N/A |") is None


# ---------------------------------------------------------------- the probe, run here


def test_probe_without_nvidia_smi_says_so():
    assert gpu_driver.probe(which=lambda _name: None) == {
        "found": False, "path": None, "driver": None, "cuda": None, "gpus": [], "error": None, "read": None}


def test_probe_reads_the_stand_in(tmp_path):
    exe = standin.install(tmp_path, driver="570.124.06", cuda="12.8")
    got = gpu_driver.probe(which=lambda _name: str(exe))
    assert (got["driver"], got["cuda"], got["error"]) == ("570.124.06", "12.8", None)


def test_probe_of_a_failing_or_silent_nvidia_smi(tmp_path):
    exe = standin.install(tmp_path, exit_code=9)
    got = gpu_driver.probe(which=lambda _name: str(exe))
    assert got["error"] == "nvidia-smi failed (exit 9)" and got["read"].startswith("NVIDIA-SMI has failed")
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    got = gpu_driver.probe(timeout_s=0.5, which=lambda _name: str(slow))
    assert got["found"] and got["driver"] is None and got["error"] == "nvidia-smi did not answer within 0.5 s"


# ---------------------------------------------------------------- status's line, per state


def test_status_line_per_driver_state(tmp_path):
    infos = registry(tmp_path, **{"v1": ">=0.5.12,<0.5.14", "v2": ">=0.5.20,<0.5.24"})

    def line(driver, release="0.5.23"):
        return cl.driver_line(cl.driver_json(driver, release, infos), release)

    assert line(drv("570.124.06", "12.8")) == (
        "driver: 570.124.06 (CUDA 12.8): the cu129 lane only (SGLang up to 0.5.19); SGLang 0.5.23 here needs "
        "CUDA 13 (driver 580+); newest release DDTree covers here: 0.5.13.post1")
    assert line(drv("580.65.06")) == ("driver: 580.65.06 (CUDA 13.0 by the driver table): every SGLang lane "
                                      "(cu130: SGLang 0.5.20+); newest release DDTree covers here: 0.5.23")
    assert line(drv("520.61.05", "11.8")) == ("driver: 520.61.05 (CUDA 11.8): no SGLang CUDA lane (0.5.11+ needs "
                                              "CUDA 12: driver 525.60.13+); SGLang 0.5.23 here needs CUDA 13 "
                                              "(driver 580+)")
    assert line(Driver(found=False)).startswith("driver: none found (no nvidia-smi on the host")
    assert line(None) == "driver: not read (the host's agent did not report it)"
    doc = cl.driver_json(cl.driver_from_fact({"found": True, "driver": None, "error": "nvidia-smi failed (exit 9)",
                                              "read": "NVIDIA-SMI has failed"}), "0.5.23", infos)
    assert (doc["state"], doc["lane"], doc["newest_covered"], doc["release_runs"]) == ("unreadable", None, None, None)
    assert cl.driver_line(doc, "0.5.23") == ("driver: unreadable: nvidia-smi failed (exit 9); it printed "
                                             "'NVIDIA-SMI has failed'; push refuses this host without --force-driver")


# ---------------------------------------------------------------- image --base against target drivers


def test_image_base_check_names_every_host_that_cannot_run_it(tmp_path, monkeypatch):
    from ddtree_deploy.base.errors import BadInput
    from ddtree_deploy.interop.image import check_base_for_drivers

    registry(tmp_path, **{"v1": ">=0.5.12,<0.5.14", "v2-cuda12": ">=0.5.14,<0.5.20", "v2": ">=0.5.20,<0.5.24"})
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(tmp_path))
    drivers = {"a": drv("580.65.06", "13.0"), "b": drv("570.124.06", "12.8"), "c": Driver(found=False),
               "d": cl.driver_from_fact({"found": True, "driver": "??"})}
    with pytest.raises(BadInput) as refused:
        check_base_for_drivers("lmsysorg/sglang:v0.5.23", "0.5.23", drivers)
    assert refused.value.code == "driver-too-old" and "\n" not in refused.value.message
    assert refused.value.message == (
        "--base lmsysorg/sglang:v0.5.23 needs CUDA 13.0 (driver 580+), from its release lane: b's driver "
        "570.124.06 supports CUDA 12.8; d: cannot read a driver version in nvidia-smi's output: '??'; the newest "
        "release DDTree covers on those hosts is 0.5.19; nothing was written")
    # A CUDA 12 base runs on a and b; d still cannot be judged; c has no driver to judge (a warning).
    with pytest.raises(BadInput, match="^--base lmsysorg/sglang:v0.5.19-cu129 needs CUDA 12.9 "):
        check_base_for_drivers("lmsysorg/sglang:v0.5.19-cu129", "0.5.19", drivers)
    said = check_base_for_drivers("lmsysorg/sglang:v0.5.19-cu129", "0.5.19", {k: drivers[k] for k in "abc"})
    assert said == ["c: no NVIDIA driver found (no nvidia-smi on the host): --base not checked against it"]
    forced = check_base_for_drivers("lmsysorg/sglang:v0.5.23", "0.5.23", drivers, force=True)
    assert forced[-1].endswith("; writing it anyway (--force-driver)") and len(forced) == 2
    assert check_base_for_drivers("lmsysorg/sglang:v0.5.23", "0.5.23", {}) == []


# ---------------------------------------------------------------- a [container] host: the image's CUDA

# What the container program reports of an image (hostprog/container.py _image_summary): the
# engine's inspect document's Config.Env (CUDA_VERSION only), Config.Labels and RepoTags.
NVIDIA_BASED = {"env": ["CUDA_VERSION=12.9.1"], "labels": {"io.ddtree-deploy.cuda": "13.0"},
                "tags": ["lmsysorg/sglang:v0.5.23"]}


def test_the_image_cuda_is_read_from_its_env_then_label_then_tag_then_the_release_lane():
    assert cl.image_cuda(NVIDIA_BASED, "lmsysorg/sglang:v0.5.23", "0.5.23") == ("12.9", "env CUDA_VERSION")
    labelled = dict(NVIDIA_BASED, env=[])
    assert cl.image_cuda(labelled, "x", "0.5.23") == ("13.0", "label io.ddtree-deploy.cuda")
    nvidia = {"labels": {"com.nvidia.cuda.version": "12.8.0"}}
    assert cl.image_cuda(nvidia, "x", "0.5.23") == ("12.8", "label com.nvidia.cuda.version")
    # the container's image reference first, then any of the image's tags
    assert cl.image_cuda({}, "lmsysorg/sglang:v0.5.19-cu129", "0.5.23") == ("12.9", "tag")
    assert cl.image_cuda({"tags": ["a/b:latest", "lmsysorg/sglang:v0.5.23-cu130"]}, "sha256:1", "0.5.19") \
        == ("13.0", "tag")
    assert cl.image_cuda({"tags": ["a/b:latest"]}, "a/b:latest", "0.5.23") == ("13.0", "release lane")
    assert cl.image_cuda({"tags": ["a/b:latest"]}, "a/b:latest", "0.5.19") == ("12.9", "release lane")
    # what says nothing is skipped, not read as a CUDA: an empty label, N/A, a release unrecorded
    blank = {"env": ["CUDA_VERSION="], "labels": {"io.ddtree-deploy.cuda": "", "com.nvidia.cuda.version": "N/A"}}
    assert cl.image_cuda(blank, "x", "0.5.9") == ("", "unknown")
    assert cl.image_cuda(None, "", None) == ("", "unknown")
    assert cl.image_cuda({}, "", "not-a-version") == ("", "unknown")


def test_the_image_refusal_is_one_line_naming_the_image_its_cuda_and_the_driver(tmp_path):
    infos = registry(tmp_path, **{"v1": ">=0.5.12,<0.5.14", "v2-cuda12": ">=0.5.14,<0.5.20",
                                  "v2": ">=0.5.20,<0.5.24"})
    assert cl.image_refusal("ct1", "lmsysorg/sglang:v0.5.23", "13.0", "env CUDA_VERSION", drv("570.124.06", "12.8"),
                            infos) == (
        "ct1: its container's image lmsysorg/sglang:v0.5.23 is built for CUDA 13.0 (read from its env "
        "CUDA_VERSION): driver 570.x (570.124.06) supports CUDA 12.8; CUDA 13 needs driver 580+; run an image "
        "of SGLang 0.5.19 or older with DDTree's coverage (cu129 lane: CUDA 12.9)")
    # the image's CUDA decides, not the release's lane: a CUDA 12 build of any release runs on 570
    assert cl.image_refusal("ct1", "x", "12.9", "tag", drv("570.124.06", "12.8"), infos) is None
    assert cl.image_refusal("ct1", "x", "13.0", "tag", drv("580.65.06", "13.0"), infos) is None
    assert cl.image_refusal("ct1", "x", "", "unknown", drv("520.61.05", "11.8"), infos) is None  # nothing known
    assert cl.image_refusal("ct1", "x", "12.9", "tag", drv("520.61.05", "11.8"), infos).endswith(
        "CUDA 12 needs driver 525.60.13+; no release DDTree covers runs on this host")


def test_a_container_hosts_status_says_the_image_cuda_and_whether_the_driver_runs_it(tmp_path):
    infos = registry(tmp_path, **{"v1": ">=0.5.12,<0.5.14", "v2": ">=0.5.20,<0.5.24"})
    doc = cl.driver_json(drv("570.124.06", "12.8"), "0.5.23", infos, ("13.0", "env CUDA_VERSION"))
    assert (doc["image_cuda"], doc["image_cuda_from"], doc["image_runs"]) == ("13.0", "env CUDA_VERSION", False)
    assert cl.driver_line(doc, "0.5.23").endswith(
        "; the container's image: CUDA 13.0 (its env CUDA_VERSION): this driver cannot run it (push refuses "
        "without --force-driver)")
    ok = cl.driver_json(drv("570.124.06", "12.8"), "0.5.12.post1", infos, ("12.9", "tag"))
    assert ok["image_runs"] is True
    assert cl.driver_line(ok, "0.5.12.post1").endswith("; the container's image: CUDA 12.9 (its tag): this driver "
                                                      "runs it")
    none = cl.driver_json(Driver(found=False), "0.5.12.post1", infos, ("12.9", "tag"))
    assert none["image_runs"] is None and cl.driver_line(none, "0.5.12.post1").endswith(
        "; the container's image: CUDA 12.9 (its tag)")
    unknown = cl.driver_json(drv("570.124.06", "12.8"), "0.5.9", infos, ("", "unknown"))
    assert (unknown["image_cuda"], unknown["image_runs"]) == (None, None)
    assert "the container's image: CUDA unknown" in cl.driver_line(unknown, "0.5.9")
    venv = cl.driver_json(drv("570.124.06", "12.8"), "0.5.23", infos)  # a venv host: the three are null
    assert (venv["image_cuda"], venv["image_cuda_from"], venv["image_runs"]) == (None, None, None)
    assert "image" not in cl.driver_line(venv, "0.5.23")
