"""Installable anywhere: the built wheel carries the families, payload and release manifests.

Builds the real wheel (setup.py's build hook), installs it into a fresh venv outside the
checkout and runs the installed `ddtree-deploy` from a temporary folder: `check` and
`matrix --offline` must find the families from the wheel, not from the checkout, `port`
must write the user's new family to the XDG data folder and leave site-packages byte for
byte as it was, and the demo (`python -m ddtree_deploy.demo`) must run its whole flow from
the wheel alone.
The fresh venv reuses the project venv's dependencies through a .pth line (a plain path,
so the project's editable ddtree_deploy is NOT importable there: only the wheel's is).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.release import releases

REPO = Path(__file__).resolve().parent.parent.parent


def tomllib_load(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())
RELEASE = "0.5.12.post1"
# What the build needs from the checkout; copied so the build never writes into it.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "ddtree_deploy", "patches", "payload", "hosts")
DEMO_MODELS = ("tiny-llama", "tiny-dflash-draft")
DEMO_RELEASE, DEMO_FAMILY = "0.5.23", "sglang-0.5.20"  # today's newest covered release, the v2 family


def _copy_sources(dest: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=skip)
        else:
            shutil.copy2(src, dest / name)
    for manifest in (REPO / "snapshot").glob("*/MANIFEST.json"):
        (dest / "snapshot" / manifest.parent.name).mkdir(parents=True)
        shutil.copy2(manifest, dest / "snapshot" / manifest.parent.name / "MANIFEST.json")
    for model in DEMO_MODELS:  # the demo's tiny model configs (setup.py ships them)
        shutil.copytree(REPO / "tests" / "data" / "models" / model, dest / "tests" / "data" / "models" / model)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    try:
        wheels = releases.ensure_wheel(RELEASE).parent
    except DeployError as exc:  # offline with an empty cache
        pytest.skip(f"the {RELEASE} wheel is not cached and PyPI is unreachable: {exc.message}")
    root = tmp_path_factory.mktemp("install")
    src, dist, venv = root / "src", root / "dist", root / "venv"
    src.mkdir()
    _copy_sources(src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(src)], check=True, timeout=120)
    (wheel,) = dist.glob("ddtree_deploy-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=120)
    # A cache of its own (snapshots are written there) that shares the downloaded wheels.
    cache = root / "cache"
    cache.mkdir()
    (cache / "wheels").symlink_to(wheels)
    listing = releases.cached_project()  # the demo's release choice works offline with it, as after a first run
    if listing is not None:
        (cache / "pypi").mkdir()
        (cache / "pypi" / "sglang.json").write_text(json.dumps(listing))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_DEPLOY_")}
    env.update(DDTREE_DEPLOY_CACHE=str(cache), XDG_CONFIG_HOME=str(root / "config"),
               XDG_DATA_HOME=str(root / "data"), COLUMNS="200")
    cwd = root / "elsewhere"
    cwd.mkdir()
    return {"wheel": wheel, "exe": venv / "bin" / "ddtree-deploy", "python": venv / "bin" / "python",
            "env": env, "cwd": cwd, "cache": cache, "site": site, "data": root / "data"}


def _run(installed: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(installed["exe"]), *args], cwd=installed["cwd"], env=installed["env"],
                          capture_output=True, text=True, timeout=120)


def test_the_wheel_carries_families_payload_and_manifests(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for family in (REPO / "patches").iterdir():
        if (family / "family.toml").is_file():
            for f in family.iterdir():
                assert f"ddtree_deploy/_data/patches/{family.name}/{f.name}" in names
    for f in (REPO / "payload").glob("*.py"):
        assert f"ddtree_deploy/_data/payload/{f.name}" in names
    for m in (REPO / "snapshot").glob("*/MANIFEST.json"):
        assert f"ddtree_deploy/_data/snapshot/{m.parent.name}/MANIFEST.json" in names
    for model in DEMO_MODELS:
        assert f"ddtree_deploy/_data/models/{model}/config.json" in names
    for example in (REPO / "hosts").glob("*.toml"):  # the example inventory
        assert f"ddtree_deploy/_data/examples/hosts/{example.name}" in names
    assert "ddtree_deploy/demo.py" in names and "ddtree_deploy/sandbox/sshd.py" in names
    # Every module of every room: package discovery (pyproject) finds each room's __init__.py.
    modules = [f.relative_to(REPO).as_posix() for f in (REPO / "ddtree_deploy").rglob("*.py")]
    assert "ddtree_deploy/session/push.py" in modules
    assert [m for m in modules if "/_data/" not in m and m not in names] == []
    assert not any(n.startswith(("ddtree_testkit/", "tests/", "bench/")) for n in names), "test support is not shipped"
    assert not any("/files/" in n for n in names), "SGLang's own files are never shipped"


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    where = subprocess.run([str(installed["python"]), "-c", "import ddtree_deploy.base.locations as l; "
                            "print(l.__file__); print(l.in_checkout()); print(l.repo_dir('patches'))"],
                           cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, check=True)
    module, checkout, patches = where.stdout.split("\n")[:3]
    assert not module.startswith(str(REPO)), module
    assert checkout == "False"
    assert patches.endswith("ddtree_deploy/_data/patches")


def test_installed_check_finds_the_family_from_the_wheel(installed):
    r = _run(installed, "check", "--release", RELEASE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"check ok: family sglang-0.5.12 on sglang-{RELEASE}"), r.stdout
    # The release snapshot went to the user's cache, under the shipped manifest (byte for byte).
    made = installed["cache"] / "snapshot" / f"sglang-{RELEASE}" / "MANIFEST.json"
    assert made.read_bytes() == (REPO / "snapshot" / f"sglang-{RELEASE}" / "MANIFEST.json").read_bytes()


def test_installed_matrix_offline_sees_the_families(installed):
    r = _run(installed, "matrix", "--from", "0.5.12", "--to", "0.5.13", "--offline")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no family covers" not in r.stdout + r.stderr
    assert "3 release(s): 3 ok" in r.stdout, r.stdout + r.stderr
    # The per-family tables (stderr): both families came from the wheel.
    for family in ("sglang-0.5.12", "sglang-0.5.13"):
        assert f"DDTree family {family} vs SGLang releases" in r.stderr, r.stderr


def test_installed_hosts_list_and_init_work_without_a_checkout(installed):
    """An installed toolkit's inventory folder is the user's config folder: `hosts list` says
    so and points to the example the wheel carries, `hosts init` writes the first host there."""
    config_hosts = Path(installed["env"]["XDG_CONFIG_HOME"]) / "ddtree-deploy" / "hosts"
    empty = _run(installed, "hosts", "list")
    assert empty.returncode == 0, empty.stderr
    assert f"inventory folder: {config_hosts} (your config folder): 0 host file(s)" in " ".join(empty.stdout.split())
    example = re.search(r"an example: (\S+?)\)", " ".join(empty.stderr.split())).group(1)
    assert "/ddtree_deploy/_data/examples/hosts" in example and Path(example, "ct200.toml").is_file()
    assert not example.startswith(str(REPO))
    made = _run(installed, "hosts", "init", "gpu1", "--python", "/usr/bin/python3")
    assert made.returncode == 0 and made.stdout.strip() == str(config_hosts / "gpu1.toml"), made.stderr
    listed = _run(installed, "hosts", "list")
    assert listed.returncode == 0 and re.search(r"^  gpu1 +ssh gpu1 +python /usr/bin/python3", listed.stdout, re.M)
    missing = _run(installed, "status", "--host", "nosuch")
    assert missing.returncode == 2 and "`ddtree-deploy hosts init nosuch`" in missing.stderr
    assert "hosts/ct200.toml" not in missing.stderr


def _hashes(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (links and all) -> its sha256: what 'byte-identical' means."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.network  # the 0.5.14 wheel, once
def test_installed_port_writes_the_users_family_outside_site_packages(installed):
    """Issue 21 item 6, as a user met it: after `pipx install`, `port --to 0.5.14` wrote a family
    with .rej files into site-packages, and `check --release 0.5.14` then picked it. Now the
    family goes to $XDG_DATA_HOME/ddtree-deploy/patches/, site-packages is byte-identical, and
    the unfinished port is named, labelled as the user's, and never picked by its range.
    (Every release from 0.5.12 has a family now: the port goes to 0.5.11, which none covers.)"""
    try:
        releases.ensure_wheel("0.5.11")
    except DeployError as exc:
        pytest.skip(f"the 0.5.11 wheel is not cached and PyPI is unreachable: {exc.message}")
    site = installed["site"]
    before = _hashes(site)
    assert any(name.startswith("ddtree_deploy/_data/patches/") for name in before)
    r = _run(installed, "port", "--to", "0.5.11", "--family", "sglang-0.5.12")
    assert r.returncode == 1, r.stdout + r.stderr  # some hunks do not land on 0.5.11
    mine = installed["data"] / "ddtree-deploy" / "patches" / "sglang-0.5.11"
    assert (mine / "family.toml").is_file() and list(mine.glob("*.rej")), r.stderr
    assert r.stdout.startswith("port ") and f"family sglang-0.5.11 (yours, in {mine.parent};" in r.stdout, r.stdout
    r = _run(installed, "check", "--release", "0.5.11")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no finished family covers SGLang 0.5.11: sglang-0.5.11 (yours" in " ".join(r.stderr.split())
    # a refresh of a family the toolkit ships is refused: it would write into site-packages;
    # so is a port into it, named as a folder
    r = _run(installed, "series", "refresh", "--family", "sglang-0.5.13", "--from", str(installed["cwd"]))
    assert r.returncode == 2 and "part of the installed toolkit" in r.stderr, r.stderr
    inside = site / "ddtree_deploy" / "_data" / "patches" / "sglang-0.5.15"
    r = _run(installed, "port", "--to", "0.5.15", "--family", "sglang-0.5.13", "--into", str(inside))
    assert r.returncode == 2 and "is inside the installed toolkit" in r.stderr, r.stderr
    assert _hashes(site) == before, "the installed toolkit was written"


def test_installed_version_is_the_wheels(installed):
    r = _run(installed, "--version")
    wheel_version = installed["wheel"].name.split("-")[1]
    assert (r.returncode, r.stdout) == (0, f"ddtree-deploy {wheel_version}\n")


def test_installed_demo_without_its_extra_names_the_one_pipx_line(installed, tmp_path):
    """`python -m ddtree_deploy.demo` from a pipx install without SGLang's CPU dependencies
    (issue 28: it asked for requirements files the wheel does not ship): exit 2 and one line
    naming the `pipx inject` command that adds what is missing, the `demo` extra's own
    requirements as the wheel's metadata declares them. The pipx venv is made here: the
    wheel, the toolkit's dependencies without torch and torchvision, pipx's metadata file."""
    venv, shared = tmp_path / "pipx-venv", tmp_path / "deps-without-torch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    shared.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if not entry.name.lower().startswith("torch"):
            (shared / entry.name).symlink_to(entry)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "deps.pth").write_text(f"{shared}\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(installed["wheel"])], check=True, timeout=120)
    (venv / "pipx_metadata.json").write_text("{}\n")  # what pipx writes in each app's venv
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "ddtree_deploy.demo", "--release", "0.5.23"],
                       cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    said = " ".join(r.stdout.split())
    assert ("demo: torch==2.14.1, torchvision==0.29.1 not installed here; the sandbox host imports SGLang's CPU "
            "dependencies from this Python environment: install them (the demo extra) where ddtree-deploy runs: "
            "`pipx inject ddtree-deploy ") in said, said
    line = said.split("`pipx inject ddtree-deploy ")[1].split("`")[0]
    declared = tomllib_load(REPO / "pyproject.toml")["project"]["optional-dependencies"]["demo"]
    assert line.split() == [shlex.quote(req) for req in declared]  # the wheel's metadata: the extra, whole
    assert "requirements/" not in said and "pip install" not in said


@pytest.mark.sshd
def test_installed_demo_runs_the_whole_flow_from_a_temp_folder(installed):
    """`python -m ddtree_deploy.demo` with only the wheel: today's SGLang (0.5.23) and the v2
    family, said with why; sandbox host, loopback sshd, check, push + the compile/import/cli
    smoke levels, status, history, rollback, status; nothing left behind."""
    from ddtree_deploy.sandbox import require_openssh

    require_openssh()  # one line naming openssh-server when sshd is missing, not a LOCAL fallback
    try:
        releases.ensure_wheel(DEMO_RELEASE)
    except DeployError as exc:
        pytest.skip(f"the {DEMO_RELEASE} wheel is not cached and PyPI is unreachable: {exc.message}")
    tmp = installed["cwd"].parent / "demo-tmp"
    tmp.mkdir()
    env = {**installed["env"], "TMPDIR": str(tmp)}
    r = subprocess.run([str(installed["python"]), "-m", "ddtree_deploy.demo"], cwd=installed["cwd"], env=env,
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    said = " ".join(out.split())
    assert (f"SGLang {DEMO_RELEASE}: the newest release a DDTree family covers (" in said
            and f"; family {DEMO_FAMILY}, because it covers " in said), said[:600]
    assert "transport: SSH to a real sshd on 127.0.0.1" in out, out[-4000:]
    assert f"check ok: family {DEMO_FAMILY} on sglang-{DEMO_RELEASE}" in out, out[-4000:]
    for level in ("compile", "import", "cli"):  # the smoke levels push ran (cli read the shipped models)
        assert re.search(rf"^ +{level} +passed ", out, re.M), (level, out[-4000:])
    # The import level proved the v2 tree: DDTREE resolves to the family's worker.
    assert "DDTREE -> DDTreeWorkerV2 (DDTREE_TREE_VERIFY = True)" in said, out[-4000:]  # lines fitted to COLUMNS
    assert "smoke passed: journal marked deployed" in out
    history = said.split("$ ddtree-deploy history")[1].split("$ ddtree-deploy rollback")[0]
    assert re.search(rf"push {DEMO_FAMILY} \(\w+\) ok -> switched", history), history
    assert "phase: rolled-back" in out.split("$ ddtree-deploy status")[-1]  # back to pristine
    assert "demo: done in" in out and "the sandbox and its sshd are gone" in out
    assert list(tmp.iterdir()) == [], "the demo leaves nothing in its temp folder"
    assert list(installed["cwd"].iterdir()) == [], "nor in the folder it ran from"
