"""Sandbox host environments: a Python with a REAL SGLang release installed.

A "host environment" stands in for a GPU host's interpreter, minus the GPU: a venv
made from the base interpreter (no pip), whose site-packages holds the SGLang
release wheel's files exactly as pip would install them (``--no-deps``), optionally
overlaid with patched files, plus a ``.pth`` file that adds the running venv's
site-packages (torch, transformers, ... are shared, never reinstalled per host).
The host's own site-packages comes first on ``sys.path``, so its ``sglang`` wins.

Used by the demo (``python -m ddtree_deploy.demo``), the benchmarks and the tests:

    release_wheel(version)                      -> Path of the cached wheel (downloads once)
    pristine_files(version, paths=None)         -> {package-relative path: bytes}
    make_host_env(dest, *, overlay=None, version, read_only=False, reuse=False)
                                                -> HostEnv(python, site_packages)
    make_python_env(dest, files=None, version)  -> (python, site-packages): only some files,
                                                   no shared venv (for deploy tests: fast)
    write_kernel_standin(dest)                  -> folder to put on PYTHONPATH (see there)
    run_python(env, args, ...)                  -> subprocess.CompletedProcess

Built once, copied after (``SHARE_ENV``): when ``DDTREE_DEPLOY_SANDBOX_SHARE`` names a
folder (the test suite sets it to one folder per pytest run, shared by its xdist workers),
each distinct environment (same kind, release, files or overlay, interpreter) is built
there once, under a file lock, and every later call copies it to ``dest`` (``cp -a``: a
copy is the caller's to change, as a host's files are changed by a push).
``make_host_env(..., read_only=True)`` hands out the shared build itself instead of a copy,
for callers that only run the interpreter (probes, imports): nothing may write into it.
Unset, every call builds its own, as the demo and the benchmarks do.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ddtree_deploy.base.locations import cache_dir

#: The release the DDTree series was made against (the seeds' host ran it).
BASELINE_RELEASE = "0.5.12.post1"

#: A folder where each distinct environment is built once and shared (see the module doc).
SHARE_ENV = "DDTREE_DEPLOY_SANDBOX_SHARE"


@dataclass(frozen=True)
class HostEnv:
    python: Path  # the host interpreter (dest/bin/python)
    site_packages: Path  # where sglang/ lives for this host


def wheel_dir() -> Path:
    return cache_dir() / "wheels"


def release_wheel(version: str = BASELINE_RELEASE) -> Path:
    """The cached SGLang wheel for ``version``; fetched from PyPI on first use.

    Only the wheel itself (``--no-deps``): SGLang publishes wheels only from 0.5.11 on.
    """
    found = sorted(wheel_dir().glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    # Not cached yet: the toolkit's own downloader (sha256-verified against PyPI).
    from ddtree_deploy.release.releases import ensure_wheel

    return ensure_wheel(version)


def pristine_files(
    version: str = BASELINE_RELEASE, paths: Iterable[str] | None = None
) -> dict[str, bytes]:
    """The release's files as shipped, keyed by site-packages-relative path.

    ``paths`` selects files (a missing one raises KeyError naming it); default: all
    regular files of the wheel, dist-info included.
    """
    with zipfile.ZipFile(release_wheel(version)) as zf:
        if paths is None:
            return {n: zf.read(n) for n in zf.namelist() if not n.endswith("/")}
        return {p: zf.read(p) for p in paths}


_KERNEL_STANDIN = '''"""STAND-IN for SGLang's CUDA kernel package (sglang-kernel), for CPU test hosts only.

The real package is a CUDA build that cannot load on a machine without a GPU, yet
modules such as sglang.srt.mem_cache.memory_pool_host import names from it at module
top on every non-NPU/XPU/MPS device. Any sgl_kernel.<module>.<name> resolves to a
function that raises when called, so imports succeed and nothing pretends to compute.
"""
import importlib.abc
import importlib.machinery
import sys
import types

STANDIN = True


class _StandIn:
    """A missing kernel (or kernel-side constant): attributes give more stand-ins,
    calling one raises."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._name}: CPU stand-in, the CUDA kernel is not available here"
        )

    def __repr__(self):
        return f"<sgl_kernel stand-in {self._name}>"


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StandInModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.append(_Finder())
sys.modules[__name__].__class__ = _StandInModule
'''


def write_kernel_standin(dest: Path) -> Path:
    """Write a NAMED STAND-IN ``sgl_kernel`` package under ``dest``; return ``dest``.

    Put ``dest`` on PYTHONPATH (``run_python(..., extra_env={"PYTHONPATH": ...})``) only
    for probes that must IMPORT modules pulling in sgl_kernel (dflash_worker does, via
    the scheduler); every call into it raises. Never part of a host env by default.
    """
    pkg = Path(dest) / "sgl_kernel"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(_KERNEL_STANDIN)
    return Path(dest)


def _shared_site_packages() -> Path:
    # The interpreter running the tests is the project venv's; its purelib holds
    # torch, transformers and the rest of SGLang's CPU dependencies.
    return Path(sysconfig.get_paths()["purelib"])


def _base_python() -> str:
    # A venv must be made from a real interpreter, not from another venv's shim.
    return getattr(sys, "_base_executable", None) or sys.executable


def make_host_env(
    dest: Path,
    *,
    overlay: Mapping[str, bytes] | None = None,
    version: str = BASELINE_RELEASE,
    read_only: bool = False,
    reuse: bool = False,
) -> HostEnv:
    """Build a host environment in ``dest`` (a new or empty folder).

    ``overlay`` maps site-packages-relative paths (``sglang/srt/server_args.py``) to
    the bytes that replace (or add) that file after the release is installed.
    ``read_only``: the caller never writes into the environment (it only runs its
    interpreter); with a share folder it gets the shared build itself, not a copy, and
    ``dest`` stays unused.
    ``reuse``: when ``dest`` already holds a host environment of ``version`` (a marker file
    says so), only write the overlay again (the mutant runner, scripts/mutants_v2.py,
    rebuilds nothing between mutants of the payload); never shared. A file the previous
    overlay wrote and this one does not is put back as the release ships it (or removed when
    the release has none), and each rewritten module's cached bytecode is dropped (a
    same-size rewrite within the second would otherwise import the previous code).
    """
    overlay = dict(overlay or {})
    if reuse:
        return _build_host_env(Path(dest), overlay, version, reuse=True)
    key = {"release": release_wheel(version).name, "python": _base_python(),
           "shared": str(_shared_site_packages()),
           "overlay": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(overlay.items())}}
    built = _shared_build("host", key, lambda d: _build_host_env(d, overlay, version))
    if built is None:
        return _build_host_env(Path(dest), overlay, version)
    site = _site_packages(built)
    if read_only:
        return HostEnv(python=built / "bin" / "python", site_packages=site)
    _copy_tree(built, Path(dest))
    return HostEnv(python=Path(dest) / "bin" / "python", site_packages=Path(dest) / site.relative_to(built))


def _reused_overlay(marker: Path, version: str) -> list[str] | None:
    """The overlay paths the environment behind ``marker`` was last given, when it holds
    ``version``; None when it must be built afresh (no marker, another release, the marker
    of an older toolkit)."""
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("release") != version:
        return None
    paths = record.get("overlay")
    return list(paths) if isinstance(paths, list) else None


def _restore_release_files(site_packages: Path, paths: Iterable[str], version: str) -> None:
    """Put ``paths`` back as the release ships them; remove those it does not ship."""
    paths = list(paths)
    if not paths:
        return
    with zipfile.ZipFile(release_wheel(version)) as zf:
        shipped = set(zf.namelist())
        for rel in paths:
            target = site_packages / rel
            if rel in shipped:
                target.write_bytes(zf.read(rel))
            else:
                target.unlink(missing_ok=True)
            _drop_bytecode(target)


def _drop_bytecode(source: Path) -> None:
    for cached in source.parent.glob(f"__pycache__/{source.stem}.*.pyc"):
        cached.unlink(missing_ok=True)


def _build_host_env(dest: Path, overlay: Mapping[str, bytes], version: str, reuse: bool = False) -> HostEnv:
    marker = dest / "ddtree-host-env.txt"
    python = dest / "bin" / "python"
    previous = _reused_overlay(marker, version) if reuse else None
    fresh = previous is None
    if fresh:
        subprocess.run(
            [_base_python(), "-m", "venv", "--without-pip", str(dest)], check=True
        )
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )
    for rel in overlay:
        if site_packages.resolve() not in (site_packages / rel).resolve().parents:
            raise ValueError(f"overlay path escapes site-packages: {rel!r}")
    if fresh:
        with zipfile.ZipFile(release_wheel(version)) as zf:
            zf.extractall(site_packages)
    else:
        _restore_release_files(site_packages, sorted(set(previous) - set(overlay)), version)
    for rel, data in overlay.items():
        target = site_packages / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if not fresh:
            _drop_bytecode(target)
    # addsitedir (not a bare path line) so the shared venv's own .pth files run too.
    (site_packages / "zz_ddtree_shared_venv.pth").write_text(
        f"import site; site.addsitedir({str(_shared_site_packages())!r})\n"
    )
    marker.write_text(json.dumps({"release": version, "overlay": sorted(overlay)}))
    return HostEnv(python=python, site_packages=site_packages)


def make_python_env(dest: Path, files: list[str] | None = None,
                    version: str = BASELINE_RELEASE) -> tuple[Path, Path]:
    """A bare venv at ``dest`` whose site-packages holds SGLang's real files and dist-info,
    without the shared venv (nothing there imports torch): what push/status/rollback need.

    ``files``: package-relative paths to extract (plus every ``__init__.py`` on their way
    and sglang/version.py); None extracts the whole package. Returns (python, site-packages).
    """
    dest = Path(dest)
    key = {"release": release_wheel(version).name, "python": sys.executable,
           "files": None if files is None else sorted(set(files))}
    built = _shared_build("python", key, lambda d: _build_python_env(d, files, version))
    if built is None:
        _build_python_env(dest, files, version)
    else:
        _copy_tree(built, dest)
    return dest / "bin" / "python", _site_packages(dest)


def _build_python_env(dest: Path, files: list[str] | None, version: str) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = _site_packages(dest)
    wanted = None
    if files is not None:
        wanted = set(files) | {"sglang/__init__.py", "sglang/version.py"}
        for f in files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                wanted.add("/".join(parts[:i]) + "/__init__.py")
    with zipfile.ZipFile(release_wheel(version)) as whl:
        for name in whl.namelist():
            if ".dist-info/" in name or (name.startswith("sglang/") and (wanted is None or name in wanted)):
                whl.extract(name, site)


def _site_packages(env: Path) -> Path:
    (site,) = env.glob("lib/python3*/site-packages")
    return site


def _shared_build(kind: str, key: dict, build: Callable[[Path], object]) -> Path | None:
    """The shared build of this environment (built now if no one has), or None without a
    share folder. One builder at a time (flock); the build is renamed into place whole, so
    a folder that exists under its final name is complete. A venv moves with its folder:
    its interpreter finds its prefix from where it is started (pyvenv.cfg beside it)."""
    share = os.environ.get(SHARE_ENV)
    if not share:
        return None
    root = Path(share)
    name = f"{kind}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]}"
    ready = root / name
    if ready.is_dir():
        return ready
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not ready.is_dir():
            tmp = root / f".{name}.{os.getpid()}.building"
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp)
            os.rename(tmp, ready)
    return ready


def _copy_tree(src: Path, dest: Path) -> None:
    """``cp -a src/. dest/``: symlinks (the venv's interpreter) stay links, times and modes
    kept; several times faster than shutil.copytree on a release's few thousand files."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", f"{src}/.", f"{dest}/"], check=True)


def run_python(
    env: HostEnv,
    args: list[str],
    *,
    timeout: float = 300,
    cwd: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run the host interpreter with ``args`` (e.g. ``["-c", code]``), output captured."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # (extra_env may set PYTHONPATH again, e.g. to a kernel stand-in folder.)
    # No GPU here: keep torch and SGLang from probing for one, and stay offline.
    environ.update({"CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    environ.update(extra_env or {})
    return subprocess.run(
        [str(env.python), *args], capture_output=True, text=True,
        timeout=timeout, cwd=cwd, env=environ,
    )
