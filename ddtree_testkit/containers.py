"""Real containers on this machine for the tests (tests/e2e/test_container_ssh.py): Debian's podman
with Debian's runc, images built from a local root filesystem (no registry is reachable).

What it took (docs/containers.md):

- ``apt-get install -y podman runc debootstrap`` (scripts/system-deps.sh does it as root);
- runc as the runtime: podman's default, crun, fails on this kernel's cgroup layout
  ("cgroups in hybrid mode not supported");
- ``default_ulimits = []``: podman's default RLIMIT_NOFILE/NPROC settings are refused here
  ("error setting rlimit type 7");
- a storage of the test's own (``CONTAINERS_STORAGE_CONF``): nothing the tests make lands in
  the machine's own image store, and one ``podman system reset`` removes all of it;
- the base image: a minimal Debian tree with python3 (``debootstrap --variant=minbase``),
  made ONCE per machine and kept as a tar in the user's cache folder, keyed by its recipe,
  then ``podman import``-ed; a layer on top holds a release's real SGLang files from its
  wheel and the named stand-in server (ddtree_testkit/standin_server.py: NOT SGLang).

Every function here runs the engine on this machine; the tests reach it as a host would,
through the container program over a real sshd on loopback.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from ddtree_deploy.base.locations import cache_dir

TOOLS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}
RUNC = "/usr/sbin/runc"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# The base tree's recipe: its key names the cached tar, so a changed recipe builds anew.
ROOTFS_RECIPE = {"suite": "bookworm", "variant": "minbase", "include": ["python3"], "mirror": DEBIAN_MIRROR}
SITE = "usr/local/lib/python3.11/dist-packages"  # where Debian's python3 finds local packages
STANDIN_DIR = "opt/standin"


def require_podman() -> None:
    """podman, runc and debootstrap are installed, else the test fails in one line saying what
    to install (never a silent skip: scripts/system-deps.sh installs them as root)."""
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None and not
               (tool == "runc" and os.path.exists(RUNC))]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: the container tests run real containers; install them "
                    f"with `apt-get install -y {' '.join(missing)}` (or `make system-deps` as root)", pytrace=False)


def engine_env(folder: Path) -> dict[str, str]:
    """The environment variables that make podman work here, with a storage of ``folder``'s own."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n')
    storage = folder / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{folder / "graph"}"\n'
                       f'runroot = "{folder / "run"}"\n')
    return {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}


def podman(env: dict[str, str], *args: str, check: bool = True, input: bytes | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], env={**os.environ, **env}, capture_output=True, input=input,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:4])} failed ({proc.returncode}): "
                             f"{proc.stderr.decode(errors='replace')[-800:]}")
    return proc


def debian_rootfs() -> Path:
    """The minimal Debian tree with python3 as a tar, built once per machine (about 2 minutes,
    from Debian's packages) and kept in the cache folder under its recipe's key."""
    key = hashlib.sha256(json.dumps(ROOTFS_RECIPE, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_dir() / "container-rootfs" / key
    tar = folder / "rootfs.tar"
    if tar.is_file():
        return tar
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per machine; the others wait for its tar
        if tar.is_file():
            return tar
        tree = folder / "tree.building"
        shutil.rmtree(tree, ignore_errors=True)
        r = ROOTFS_RECIPE
        proc = subprocess.run(["debootstrap", f"--variant={r['variant']}", "--include=" + ",".join(r["include"]),
                               r["suite"], str(tree), r["mirror"]], capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(tree, ignore_errors=True)
            pytest.fail(f"debootstrap could not make the test image's Debian tree: {proc.stdout[-400:]} "
                        f"{proc.stderr[-400:]}", pytrace=False)
        shutil.rmtree(tree / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        subprocess.run(["tar", "-C", str(tree), "-cf", str(folder / "rootfs.tar.tmp"), "."], check=True)
        os.rename(folder / "rootfs.tar.tmp", tar)
        shutil.rmtree(tree, ignore_errors=True)
    return tar


def sglang_layer(wheel: Path, files: list[str], out: Path) -> Path:
    """A build context (``out``) whose image adds SGLang's real files ``files`` (with every
    ``__init__.py`` on their way, version.py and the dist-info) from ``wheel``, and the named
    stand-in server, to the base image: FROM ``BASE`` (a build argument)."""
    out.mkdir(parents=True, exist_ok=True)
    site = out / "site"
    wanted = set(files) | {"sglang/__init__.py", "sglang/version.py"}
    for f in files:
        parts = f.split("/")
        wanted.update("/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts)))
    with zipfile.ZipFile(wheel) as whl:
        for name in whl.namelist():
            if ".dist-info/" in name or name in wanted:
                whl.extract(name, site)
    standin = out / "standin"
    standin.mkdir(exist_ok=True)
    here = Path(__file__).resolve().parent
    for name in ("standin_server.py", "standin_metrics.py", "standin_bench.py"):
        shutil.copy(here / name, standin / name)
    # The pinned metric names of the wheel's release, for the stand-in's --metric-names (the
    # speed gate's container test): the stand-in cannot import the toolkit's table itself.
    from ddtree_testkit.standin_metrics import write_names

    write_names(standin / "metric_names.json", wheel.name.split("-")[1])
    (out / "Dockerfile").write_text(f"ARG BASE\nFROM $BASE\nCOPY site/ /{SITE}/\nCOPY standin/ /{STANDIN_DIR}/\n")
    return out


def build_images(env: dict[str, str], wheel: Path, files: list[str], work: Path, tag: str) -> str:
    """The base image imported from the cached tree, then the SGLang layer as ``tag``; its id."""
    base = tag.rsplit(":", 1)[0] + ":debian"
    with open(debian_rootfs(), "rb") as fh:
        podman(env, "import", "-", base, input=fh.read())
    context = sglang_layer(wheel, files, work / "sglang-layer")
    podman(env, "build", "--build-arg", f"BASE={base}", "-t", tag, str(context))
    return podman(env, "image", "inspect", "--format", "{{.Id}}", tag).stdout.decode().strip()


def reset(env: dict[str, str]) -> None:
    """Everything the tests made in their storage: containers, images, mounts."""
    podman(env, "system", "reset", "--force", check=False, timeout=300)


__all__ = ["build_images", "debian_rootfs", "engine_env", "podman", "require_podman", "reset", "sglang_layer"]
