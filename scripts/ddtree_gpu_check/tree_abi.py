"""SGLang's CUDA tree kernels (``speculative/tree.cuh`` from the release wheel), built with
nvcc into a shared library with our host wrapper (csrc/tree_abi.cu, csrc/shim/) and called
through ctypes, with the same arguments as SGLang's ``sglang.kernels.ops.speculative.tree``.

Why not ``torch.utils.cpp_extension.load``: SGLang's headers need C++20 and its JIT flags
(``-DSGL_CUDA_ARCH``, ``--expt-relaxed-constexpr``, an arch-specific target), while torch's
extension headers are built for C++17; a plain nvcc build with no torch header keeps
SGLang's flags exactly (``sglang/kernels/jit/utils/arch.py``: ``-DSGL_CUDA_ARCH=<major*100 +
minor*10> -std=c++20 -O3 --expt-relaxed-constexpr``, target ``sm_<major><minor>a`` on 9.x and
newer) and builds the same way on a machine without a GPU (the dry run does). The library
links the CUDA runtime statically; it launches on the stream it is given (torch's current
stream), so CUDA-graph capture records its kernels like torch's own.

Host checks: SGLang's TensorMatcher and CHECK_HOST lines run in the library exactly as
compiled from the wheel; a refusal raises ``HostCheckFailed`` with SGLang's message and the
refused source line. ``host_checks`` runs them with the batch dimension 0, where tree.cuh
returns before any launch, so the ABI of a lineage is checked on a machine with no GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
WRAPPER = HERE / "csrc" / "tree_abi.cu"
SHIM = HERE / "csrc" / "shim"
JIT = Path("sglang/kernels/jit")

_DL_CPU, _DL_CUDA = 1, 2
_DL_INT, _DL_UINT, _DL_BOOL = 0, 1, 6


class HostCheckFailed(Exception):
    """SGLang's host code refused the arguments (nothing was launched)."""


class BuildFailed(Exception):
    pass


def find_nvcc() -> Optional[str]:
    """As SGLang's JIT resolves it (utils/arch.py): CUDA_HOME / CUDA_PATH, PATH, /usr/local/cuda."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [os.path.join(home, "bin", "nvcc")] if home else []
    which = shutil.which("nvcc")
    if which:
        candidates.append(which)
    candidates.append("/usr/local/cuda/bin/nvcc")
    return next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)


def nvcc_version(nvcc: str) -> Tuple[int, int]:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def arch_flags(major: int, minor: int) -> list:
    """SGLang's JIT target for a capability (utils/arch.py ``_cuda_arch_suffix``: 9.x and
    10.x+ take the arch-specific ``a`` target)."""
    suffix = "a" if major >= 9 else ""
    target = f"{major}{minor}{suffix}"
    return [f"-DSGL_CUDA_ARCH={major * 100 + minor * 10}",
            f"-gencode=arch=compute_{target},code=sm_{target}"]


def build_command(nvcc: str, release_root: Path, capability: Tuple[int, int], out: Path,
                  extra: Sequence[str] = ()) -> list:
    return [nvcc, "-std=c++20", "-O3", "--expt-relaxed-constexpr", *arch_flags(*capability),
            "-shared", "-Xcompiler", "-fPIC", *extra,
            "-I", str(SHIM), "-I", str(release_root / JIT / "include"),
            "-I", str(release_root / JIT / "csrc"), str(WRAPPER), "-o", str(out)]


# Toolchain differences between machines, not between SGLang's flags: a host compiler newer
# than nvcc knows, or a toolkit without the static CUDA runtime. One retry with the flag that
# answers the error; the PASS line names it.
_RETRIES = (
    (re.compile(r"unsupported (GNU|clang) version"), "-allow-unsupported-compiler"),
    (re.compile(r"cudart_static"), "--cudart=shared"),
)


def build(release_root: Path, build_dir: Path, capability: Tuple[int, int],
          nvcc: Optional[str] = None, timeout_s: int = 300) -> Tuple[Path, List[str]]:
    """Compile (once per source/flags digest); the library's path and any retry flags."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise BuildFailed("no nvcc (looked at $CUDA_HOME, $CUDA_PATH, $PATH, /usr/local/cuda)")
    digest = hashlib.sha256()
    sources = [WRAPPER, *sorted(SHIM.rglob("*.h")),
               *sorted((release_root / JIT).rglob("*.cuh")), *sorted((release_root / JIT).rglob("*.h"))]
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(" ".join(build_command("nvcc", Path("."), capability, Path("o"))).encode())
    digest.update(repr(nvcc_version(nvcc)).encode())
    build_dir.mkdir(parents=True, exist_ok=True)
    lib = build_dir / f"libddtree_tree_abi-{digest.hexdigest()[:16]}.so"
    flags_file = lib.with_suffix(".flags")
    if lib.is_file():
        return lib, flags_file.read_text().split() if flags_file.is_file() else []
    tmp = lib.with_suffix(".tmp.so")
    log = build_dir / "nvcc.log"
    extra: List[str] = []
    logged = ""
    for attempt in range(2):
        cmd = build_command(nvcc, release_root, capability, tmp, extra)
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BuildFailed(f"nvcc ran past {timeout_s} s") from None
        logged += " ".join(cmd) + "\n" + run.stdout + run.stderr + "\n"
        log.write_text(logged)
        if run.returncode == 0:
            break
        retry = [flag for pattern, flag in _RETRIES if pattern.search(run.stdout + run.stderr)]
        if attempt == 1 or not retry:
            tail = (run.stdout + run.stderr).strip().splitlines()[-6:]
            raise BuildFailed(f"nvcc exit {run.returncode} (full log {log}): " + " | ".join(tail))
        extra = retry
    os.replace(tmp, lib)
    flags_file.write_text(" ".join(extra))
    return lib, extra


class _Tensor(ctypes.Structure):
    # Mirrors ``TensorArg`` in csrc/tree_abi.cu.
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int32),
                ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("dtype_code", ctypes.c_uint8), ("dtype_bits", ctypes.c_uint8),
                ("reserved", ctypes.c_uint16), ("shape", ctypes.c_int64 * 4),
                ("strides", ctypes.c_int64 * 4)]


def _dtype(t) -> Tuple[int, int]:
    import torch

    table = {torch.int64: (_DL_INT, 64), torch.int32: (_DL_INT, 32), torch.uint8: (_DL_UINT, 8),
             torch.bool: (_DL_BOOL, 8), torch.int16: (_DL_INT, 16), torch.uint16: (_DL_UINT, 16),
             torch.uint32: (_DL_UINT, 32)}
    if t.dtype not in table:
        raise ValueError(f"no DLPack code for {t.dtype} in this wrapper")
    return table[t.dtype]


def describe(t, *, zero_dim0: bool = False, claim_cuda: bool = False) -> _Tensor:
    """The DLTensor fields of a torch tensor. zero_dim0: dimension 0 reported as 0 (the
    batch, for host checks without a launch); claim_cuda: report device cuda:0 (only ever
    for a call that launches nothing)."""
    if t.dim() > 4:
        raise ValueError("at most 4 dimensions")
    desc = _Tensor()
    desc.data = t.data_ptr() if t.numel() else None
    desc.ndim = t.dim()
    if claim_cuda:
        desc.device_type, desc.device_id = _DL_CUDA, 0
    elif t.is_cuda:
        desc.device_type, desc.device_id = _DL_CUDA, t.device.index or 0
    else:
        desc.device_type, desc.device_id = _DL_CPU, 0
    desc.dtype_code, desc.dtype_bits = _dtype(t)
    for i, (size, stride) in enumerate(zip(t.shape, t.stride())):
        desc.shape[i] = 0 if (zero_dim0 and i == 0) else size
        if zero_dim0 and i == 0 and size == 1:
            # A size-1 dimension's stride is never used: at its real size SGLang's
            # TensorMatcher skips it and is_contiguous ignores it (torch's [1, n] slice of a
            # [1, n + 1] row keeps the stride n + 1 and is contiguous). Described at size 0
            # it would be checked, so it is described as a contiguous tensor's.
            stride = math.prod(t.shape[1:])
        desc.strides[i] = stride
    return desc


class TreeKernels:
    """ctypes binding of the built library."""

    ERR_LEN = 4096

    def __init__(self, lib_path: Path, release_root: Path):
        self.lib = ctypes.CDLL(str(lib_path))
        self.release_root = Path(release_root)
        self.lib.ddtree_build_tree_kernel_efficient.argtypes = [
            ctypes.POINTER(_Tensor), ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
            ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64]
        self.lib.ddtree_verify_tree_greedy.argtypes = [
            ctypes.POINTER(_Tensor), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64]
        self.lib.ddtree_build_tree_kernel_efficient.restype = ctypes.c_int
        self.lib.ddtree_verify_tree_greedy.restype = ctypes.c_int
        if self.lib.ddtree_tree_abi_version() != 1:
            raise BuildFailed("library ABI version mismatch: rebuild")

    def _raise(self, rc: int, err) -> None:
        if rc == 0:
            return
        message = err.value.decode(errors="replace").strip()
        raise HostCheckFailed(self.explain(message) if rc == 1 else f"C++ exception: {message}")

    def explain(self, message: str) -> str:
        """SGLang's panic message, with the refused source line quoted from the wheel file."""
        m = re.search(r"(\S+\.cuh):(\d+)", message)
        if m:
            path, line = Path(m.group(1)), int(m.group(2))
            if not path.is_file():
                path = self.release_root / JIT / "csrc" / "speculative" / path.name
            if path.is_file():
                lines = path.read_text().splitlines()
                if 0 < line <= len(lines):
                    return (f"{path.name}:{line} `{lines[line - 1].strip()}` refused "
                            f"({message.replace(str(m.group(1)), path.name)})")
        return message

    @staticmethod
    def _stream(tensors: Sequence) -> Optional[int]:
        import torch

        for t in tensors:
            if t.is_cuda:
                return torch.cuda.current_stream(t.device).cuda_stream
        return None

    def build_tree_kernel_efficient(self, parent_list, selected_index, verified_seq_len,
                                    tree_mask, positions, retrive_index, retrive_next_token,
                                    retrive_next_sibling, topk: int, depth: int,
                                    draft_token_num: int, tree_mask_mode: int,
                                    *, batch0: bool = False, claim_cuda: bool = False) -> None:
        tensors = (parent_list, selected_index, verified_seq_len, tree_mask, positions,
                   retrive_index, retrive_next_token, retrive_next_sibling)
        # tree_mask and positions are 1-D buffers sized by the batch: with batch0 the mask
        # keeps its size (its check is a lower bound), positions goes to 0 with the batch.
        assert batch0 or not claim_cuda, "CPU memory is described as CUDA only when nothing launches"
        descs = [describe(t, zero_dim0=batch0 and t is not tree_mask, claim_cuda=claim_cuda)
                 for t in tensors]
        arr = (_Tensor * 8)(*descs)
        err = ctypes.create_string_buffer(self.ERR_LEN)
        rc = self.lib.ddtree_build_tree_kernel_efficient(
            arr, topk, depth, draft_token_num, tree_mask_mode,
            None if batch0 else self._stream(tensors), err, self.ERR_LEN)
        self._raise(rc, err)

    def host_checks(self, parent_list, selected_index, verified_seq_len, tree_mask, positions,
                    retrive_index, retrive_next_token, retrive_next_sibling, topk: int,
                    depth: int, draft_token_num: int, tree_mask_mode: int) -> None:
        """SGLang's host checks on these tensors' shapes, strides and dtypes, batch 0: no
        launch, so CPU tensors are described as CUDA ones."""
        self.build_tree_kernel_efficient(
            parent_list, selected_index, verified_seq_len, tree_mask, positions,
            retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
            draft_token_num, tree_mask_mode, batch0=True, claim_cuda=not parent_list.is_cuda)

    def verify_tree_greedy(self, predicts, accept_index, accept_token_num, candidates,
                           retrive_index, retrive_next_token, retrive_next_sibling,
                           target_predict, *, batch0: bool = False) -> None:
        """SGLang's greedy tree walk. batch0: its host checks only (see ``host_checks``)."""
        tensors = (predicts, accept_index, accept_token_num, candidates, retrive_index,
                   retrive_next_token, retrive_next_sibling, target_predict)
        claim = batch0 and not candidates.is_cuda
        arr = (_Tensor * 8)(*[describe(t, zero_dim0=batch0, claim_cuda=claim) for t in tensors])
        err = ctypes.create_string_buffer(self.ERR_LEN)
        rc = self.lib.ddtree_verify_tree_greedy(
            arr, None if batch0 else self._stream(tensors), err, self.ERR_LEN)
        self._raise(rc, err)
