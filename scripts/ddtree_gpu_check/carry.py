"""What travels to the GPU machine besides the repository: SGLang's own files, read from the
release wheel, in a git-ignored folder (never committed), and the size of it all.

    prepare(wheel, carry_dir)   extract the closure below into carry_dir/<release>/ and write
                                MANIFEST.json (each file's sha256, the wheel's name)
    verify(carry_dir)           on the GPU machine: the manifest is there and every file still
                                has its recorded sha256 (stdlib only)
    travel_bytes(repo, extra)   tracked + untracked-not-ignored files + the carried folders

The closures are computed from the wheel, not listed by hand, so a release that adds an
include or an import is seen at prepare time:

- CUDA: ``speculative/tree.cuh`` and every header it includes, transitively, that the wheel
  holds (SGLang's ``sgl_kernel/*``). Headers the wheel does not hold are either ours (the
  tvm-ffi / DLPack pieces in csrc/shim/), the CUDA toolkit's or the C++ library's, or HIP-only
  (never compiled for CUDA). Anything else stops the preparation with its name.
- Triton: ``kernels/ops/attention/extend_attention.py`` and the SGLang modules it imports;
  ``sglang.srt.environ`` and ``sglang.srt.utils`` (which pull in the whole server) are
  replaced by our stand-ins (attention.py), which must provide every name imported from them.
- Hybrid: the recurrent kernels' files scripts/gpu_check_hybrid.py loads by path
  (``KERNEL_FILES``: the causal conv, the GDN/KDA recurrent update, Mamba2's selective state
  update, the commit's state scatters); every SGLang name they import at module level must be
  one that script stands in for (``STUBBED``).

Standard library only (the GPU machine runs ``verify`` and ``travel_bytes`` without the
toolkit); ``prepare`` takes a wheel path, found by the caller through ddtree_deploy.release.releases.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import posixpath
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

RELEASE = "0.5.23"
TRAVEL_LIMIT = 64 * 1024 * 1024  # the device tool's limit on what travels with a command
MANIFEST = "MANIFEST.json"

CUDA_ENTRY = "sglang/kernels/jit/csrc/speculative/tree.cuh"
JIT_INCLUDE = "sglang/kernels/jit/include/"
JIT_CSRC = "sglang/kernels/jit/csrc/"
TRITON_ENTRY = "sglang/kernels/ops/attention/extend_attention.py"

SHIM = Path(__file__).resolve().parent / "csrc" / "shim"
HYBRID_SCRIPT = Path(__file__).resolve().parent.parent / "gpu_check_hybrid.py"
# Modules replaced by our stand-ins (attention.py) and the names they provide.
STANDIN_MODULES = {
    "sglang.srt.environ": {"envs"},
    "sglang.srt.utils": {"is_cuda", "is_hip", "is_gfx95_supported", "is_gfx1250_supported",
                         "get_device_core_count"},
}

_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
_CUDA_TOOLKIT = re.compile(r"^(cuda[\w]*\.h|cuda/.*|cub/.*|thrust/.*|cooperative_groups.*|"
                           r"mma\.h|crt/.*)$")
_HIP = re.compile(r"^hip/")


class CarryError(Exception):
    """The carried folder is missing, stale or damaged, or the wheel's closure changed."""


def shim_headers() -> set[str]:
    return {p.relative_to(SHIM).as_posix() for p in SHIM.rglob("*.h")}


def _is_std_header(name: str) -> bool:
    return "/" not in name and "." not in name  # <cstdint>, <ranges>, <source_location>, ...


@dataclass
class Closure:
    files: list[str]  # wheel paths to carry
    shimmed: set[str] = field(default_factory=set)  # includes our csrc/shim answers
    toolkit: set[str] = field(default_factory=set)  # CUDA toolkit / C++ library headers
    hip_only: set[str] = field(default_factory=set)
    standins: dict[str, set[str]] = field(default_factory=dict)  # module -> names used
    not_called: set[str] = field(default_factory=set)  # modules imported inside functions


def _walk(entry: str, read: Callable[[str], Optional[bytes]], follow) -> list:
    """Every file reachable from entry: ``follow(path, data)`` names the files it needs."""
    files, todo, seen = [], [entry], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        data = read(path)
        if data is None:
            raise CarryError(f"{path}: not in the wheel")
        files.append(path)
        todo.extend(follow(path, data))
    return sorted(files)


def cuda_closure(read: Callable[[str], Optional[bytes]]) -> Closure:
    """tree.cuh and what it includes. ``read(path)``: the wheel's bytes of path, or None."""
    shim = shim_headers()
    out = Closure(files=[])

    def includes(path: str, text: bytes):
        for name in _INCLUDE.findall(text.decode("utf-8", errors="replace")):
            local = posixpath.normpath(posixpath.join(posixpath.dirname(path), name))
            found = next((c for c in (local, JIT_INCLUDE + name, JIT_CSRC + name)
                          if read(c) is not None), None)
            if found is not None:
                yield found
            elif name in shim:
                out.shimmed.add(name)
            elif _is_std_header(name) or _CUDA_TOOLKIT.match(name):
                out.toolkit.add(name)
            elif _HIP.match(name):
                out.hip_only.add(name)
            else:
                raise CarryError(
                    f"{path} includes <{name}>, which neither the wheel nor our shim "
                    f"({SHIM}) provides; add a stand-in for it there")

    out.files = _walk(CUDA_ENTRY, read, includes)
    return out


def _imports(source: bytes, path: str):
    """(module, names, top_level) for every ``from sglang... import`` in a module."""
    tree = ast.parse(source, filename=path)
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
            yield node.module, {a.name for a in node.names}, id(node) in top
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sglang"):
                    yield alias.name, set(), id(node) in top


def triton_closure(read: Callable[[str], Optional[bytes]]) -> Closure:
    """extend_attention.py and the SGLang modules it imports at module level."""
    out = Closure(files=[])

    def imports(path: str, source: bytes):
        for module, names, top_level in _imports(source, path):
            if not top_level:
                out.not_called.add(module)
            elif module in STANDIN_MODULES:
                missing = names - STANDIN_MODULES[module]
                if missing:
                    raise CarryError(
                        f"{path} imports {sorted(missing)} from {module}; our stand-in "
                        "(scripts/ddtree_gpu_check/attention.py) does not provide them")
                out.standins.setdefault(module, set()).update(names)
            else:
                target = module.replace(".", "/") + ".py"
                if read(target) is None:
                    raise CarryError(f"{path} imports {module}, which is neither in the wheel "
                                     "as a module nor one of our stand-ins")
                yield target

    out.files = _walk(TRITON_ENTRY, read, imports)
    return out


def hybrid_script():
    """scripts/gpu_check_hybrid.py as a module (standard library only at module level)."""
    name = "gpu_check_hybrid"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HYBRID_SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def hybrid_closure(read: Callable[[str], Optional[bytes]]) -> Closure:
    """The recurrent kernels' files the hybrid check loads (the first of each entry's
    candidates the wheel holds), their imports checked against the script's stand-ins."""
    script = hybrid_script()
    out = Closure(files=[])
    for key, candidates in script.KERNEL_FILES.items():
        path = next((c for c in candidates if read(c) is not None), None)
        if path is None:
            raise CarryError(f"none of {candidates} is in the wheel (the hybrid check's {key} "
                             "kernel)")
        for module, names, top_level in _imports(read(path), path):
            if not top_level:
                out.not_called.add(module)
                continue
            missing = names - script.STUBBED.get(module, set())
            if module not in script.STUBBED or missing:
                raise CarryError(
                    f"{path} imports {sorted(missing or names)} from {module}, which "
                    "scripts/gpu_check_hybrid.py does not stand in for (STUBBED)")
            out.standins.setdefault(module, set()).update(names)
        out.files.append(path)
    return out


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def release_dir(carry_dir: Path, release: str = RELEASE) -> Path:
    return Path(carry_dir) / f"sglang-{release}"


def prepare(wheel: Path, carry_dir: Path, read_files: Callable, release: str = RELEASE) -> dict:
    """Extract the CUDA and Triton closures of ``wheel`` into carry_dir/sglang-<release>/.

    read_files(wheel, paths) -> {path: bytes} (ddtree_deploy.release.releases.read_wheel_files: each
    file checked against the wheel's RECORD). Returns the manifest written.
    """
    with zipfile.ZipFile(wheel) as zf:
        present = set(zf.namelist())

    cache: dict[str, Optional[bytes]] = {}

    def read(path: str) -> Optional[bytes]:
        if path not in cache:
            cache[path] = read_files(wheel, [path]).get(path) if path in present else None
        return cache[path]

    cuda, triton, hybrid = cuda_closure(read), triton_closure(read), hybrid_closure(read)
    root = release_dir(carry_dir, release)
    files = {}
    for path in cuda.files + triton.files + hybrid.files:
        data = read(path)
        dest = root / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        files[path] = _sha256(data)
    manifest = {
        "release": release,
        "wheel": Path(wheel).name,
        "cuda_entry": CUDA_ENTRY,
        "triton_entry": TRITON_ENTRY,
        "files": files,
        "shimmed_includes": sorted(cuda.shimmed),
        "toolkit_includes": sorted(cuda.toolkit),
        "hip_only_includes": sorted(cuda.hip_only),
        "standin_modules": {m: sorted(n) for m, n in sorted(triton.standins.items())},
        "imported_inside_functions_not_called": sorted(triton.not_called | hybrid.not_called),
        "hybrid_files": hybrid.files,
        "hybrid_standin_modules": {m: sorted(n) for m, n in sorted(hybrid.standins.items())},
    }
    # Files of an older preparation that the closure no longer holds are removed, so what
    # travels is exactly the manifest.
    for old in sorted(root.rglob("*"), reverse=True):
        rel = old.relative_to(root).as_posix()
        if old.is_file() and rel not in files and rel != MANIFEST:
            old.unlink()
        elif old.is_dir() and not any(old.iterdir()):
            old.rmdir()
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def verify(carry_dir: Path, release: str = RELEASE) -> dict:
    """The manifest of carry_dir, every file present with its recorded sha256."""
    root = release_dir(carry_dir, release)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise CarryError(f"{manifest_path}: missing; run `make gpu-check-dry` on a development "
                         "machine first and carry that folder")
    manifest = json.loads(manifest_path.read_text())
    if "hybrid_files" not in manifest:
        raise CarryError(f"{manifest_path}: prepared by an older check (no hybrid kernel files);"
                         " run `make gpu-check-dry` again and carry that folder")
    for path, digest in manifest["files"].items():
        file = root / path
        if not file.is_file():
            raise CarryError(f"{file}: listed in {MANIFEST} but missing; prepare it again")
        if _sha256(file.read_bytes()) != digest:
            raise CarryError(f"{file}: does not match {MANIFEST}; prepare it again")
    return manifest


def _tree_bytes(path: Path) -> tuple[int, int]:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size, 1
    total = count = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            total += os.lstat(os.path.join(dirpath, name)).st_size
            count += 1
    return total, count


def travel_bytes(repo: Path, carried: Iterable[Path]) -> dict:
    """Bytes that travel with a device command: the checkout's tracked files and untracked
    files git does not ignore (as the device tool copies them), plus the carried paths."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, capture_output=True, check=True).stdout.decode().split("\0")
    tree = count = 0
    for rel in filter(None, dict.fromkeys(listed)):
        path = Path(repo) / rel
        if path.is_file() or path.is_symlink():  # a deleted tracked file does not travel
            tree += path.lstat().st_size
            count += 1
    carry = {}
    for path in carried:
        carry[str(path)] = _tree_bytes(Path(repo) / path)
    total = tree + sum(b for b, _ in carry.values())
    return {"tree_bytes": tree, "tree_files": count,
            "carry": {p: {"bytes": b, "files": n} for p, (b, n) in carry.items()},
            "total_bytes": total, "limit_bytes": TRAVEL_LIMIT}
