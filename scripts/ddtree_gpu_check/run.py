"""The GPU check's entry point (scripts/gpu_check.py; ``make gpu-check``, ``make gpu-check-dry``).

    --dry-run   on CPU: every check's CPU path (the CUDA parts are reported SKIP, by name),
                plus the size of what travels; with --prepare, SGLang's files are extracted
                from the cached release wheel into --carry first
    (default)   on the lent GPU machine: every check on CUDA; no network, no toolkit needed

Exit 0: every check passed (skips allowed only in the dry run); 1: a check failed; 2: bad
input (no carried files, a wheel that cannot be had, bad arguments), one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import traceback
from pathlib import Path

from . import carry
from .report import Report

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CARRY = Path(".gpu-carry/gpu-check")
DEFAULT_BUILD = Path("build/gpu-check")
DEFAULT_CAPABILITY = (9, 0)  # the lent machine's H200; the dry run builds for it


class BadInput(Exception):
    pass


def _parse(argv):
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true",
                   help="run on CPU: CUDA parts skipped (and named), travel size measured")
    p.add_argument("--prepare", action="store_true",
                   help="first extract SGLang's files from the release wheel into --carry "
                        "(development machine: uses the toolkit's wheel cache)")
    p.add_argument("--carry", type=Path, default=DEFAULT_CARRY,
                   help=f"the carried folder, relative to the repository (default {DEFAULT_CARRY})")
    p.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD,
                   help=f"where the tree kernel library is built (default {DEFAULT_BUILD})")
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT")
                   else None, help="folder for gpu-check.json and the nvcc log (default $OUT)")
    p.add_argument("--release", default=carry.RELEASE)
    return p.parse_args(argv)


def _abs(path: Path) -> Path:
    return path if path.is_absolute() else REPO / path


def _guard(report: Report, name: str, fn, *args, **kwargs) -> None:
    """Run one check; an exception is that check's FAIL, and the next check still runs."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - reported, with its traceback on stderr
        traceback.print_exc(file=sys.stderr)
        report.record("FAIL", name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")


def _prepare(carry_dir: Path, release: str) -> dict:
    sys.path.insert(0, str(REPO))
    try:
        from ddtree_deploy.base.errors import DeployError
        from ddtree_deploy.release import releases
    except ImportError as exc:
        raise BadInput(f"--prepare needs the toolkit (run it from the project's venv: "
                       f"make gpu-check-dry): {exc}") from None
    try:
        wheel = releases.ensure_wheel(release)
    except DeployError as exc:
        raise BadInput(f"the SGLang {release} wheel cannot be had: {exc}") from None
    return carry.prepare(wheel, carry_dir, releases.read_wheel_files, release)


def _environment(report: Report, dry: bool):
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    from . import tree_abi

    nvcc = tree_abi.find_nvcc()
    info["nvcc"] = nvcc and f"{nvcc} {'.'.join(map(str, tree_abi.nvcc_version(nvcc)))}"
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["capability"] = list(torch.cuda.get_device_capability(0))
    report.info.update(info)
    text = ", ".join(f"{k} {v}" for k, v in info.items())
    if dry:
        report.record("PASS", "environment (dry run: CPU)", text)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        report.record("FAIL", "environment", f"no CUDA device ({text}); on a machine without "
                                             "one run `make gpu-check-dry`")
        return None
    if info["triton"] is None or nvcc is None:
        report.record("FAIL", "environment", f"Triton and nvcc are needed ({text})")
        return torch.device("cuda", 0)
    report.record("PASS", "environment", text)
    return torch.device("cuda", 0)


def _travel(report: Report, carry_rel: Path) -> None:
    name = "what travels to the GPU machine stays under 64 MiB"
    if shutil.which("git") is None or not (REPO / ".git").exists():
        report.record("SKIP", name, "not a git checkout here")
        return
    t = carry.travel_bytes(REPO, [carry_rel])
    report.info["travel"] = t
    mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
    parts = ", ".join(f"{p} {mib(c['bytes'])} ({c['files']} files)" for p, c in t["carry"].items())
    detail = (f"{mib(t['total_bytes'])} of {mib(t['limit_bytes'])}: tracked + untracked "
              f"{mib(t['tree_bytes'])} ({t['tree_files']} files), carried {parts}")
    report.record("PASS" if t["total_bytes"] < t["limit_bytes"] else "FAIL", name, detail)


def _build(report: Report, args, release_root: Path, device):
    """The tree kernel library: (TreeKernels or None, why not)."""
    import torch

    from . import tree_abi

    name = "SGLang's speculative/tree.cuh built with nvcc (our host wrapper and tvm-ffi shim)"
    capability = (tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda"
                  else DEFAULT_CAPABILITY)
    nvcc = tree_abi.find_nvcc()
    if nvcc is None:
        status = "SKIP" if device.type != "cuda" else "FAIL"
        report.record(status, name, "no nvcc here")
        return None, "no nvcc here"
    try:
        lib, retried = tree_abi.build(release_root, _abs(args.build_dir), capability, nvcc)
        kernels = tree_abi.TreeKernels(lib, release_root)
    except tree_abi.BuildFailed as exc:
        report.record("FAIL", name, str(exc))
        return None, "the build failed"
    finally:
        log = _abs(args.build_dir) / "nvcc.log"
        if args.out and log.is_file():
            shutil.copyfile(log, args.out / "nvcc.log")
    target = "sm_{}{}a".format(*capability) if capability[0] >= 9 else "sm_{}{}".format(*capability)
    report.record("PASS", name, f"{lib.name} for {target} with {nvcc}"
                  + (f", retried with {' '.join(retried)}" if retried else "")
                  + ("" if device.type == "cuda" else " (built here, not launched: no GPU)"))
    return kernels, ""


def run_checks(report: Report, args) -> None:
    dry = args.dry_run
    carry_dir = _abs(args.carry)
    if args.prepare:
        manifest = _prepare(carry_dir, args.release)
    try:
        manifest = carry.verify(carry_dir, args.release)
    except carry.CarryError as exc:
        raise BadInput(str(exc)) from None
    release_root = carry.release_dir(carry_dir, args.release)
    files, hybrid = manifest["files"], manifest["hybrid_files"]
    report.record("PASS", f"SGLang {manifest['release']} files carried from {manifest['wheel']}",
                  f"{sum(p.endswith(('.cuh', '.h')) for p in files)} CUDA headers, "
                  f"{sum(p.endswith('.py') for p in files) - len(hybrid)} Triton attention "
                  f"modules, {len(hybrid)} hybrid kernel modules, sha256 as recorded;"
                  f" ours instead of tvm-ffi: {', '.join(manifest['shimmed_includes'])}; "
                  f"stand-ins: {', '.join(manifest['standin_modules'])} (attention), "
                  f"{', '.join(manifest['hybrid_standin_modules'])} (hybrid)")
    if dry:
        _travel(report, args.carry)

    device = _environment(report, dry)
    if device is None:
        return
    on_gpu = device.type == "cuda"
    from . import checks_tree, ddtree as dd

    # The payload's own modules, under their installed names (the worker and the plugin need
    # stand-ins for SGLang: real_payload).
    mods = dd.real()
    utils, lineage = mods.ddtree_utils, mods.ddtree_lineage
    kernels, why = _build(report, args, release_root, device)
    ctx = checks_tree.Context(device, kernels, why, utils, lineage)

    _guard(report, "known-answer tree", checks_tree.check_known_answers, report, ctx)
    configs = dd.configs(small=dry)
    for i, cfg in enumerate(configs):
        _guard(report, f"tree: {cfg}", checks_tree.check_config, report, ctx, cfg, seed=100 + i)
    _guard(report, "tree QLEN_ONLY", checks_tree.check_config, report, ctx, configs[0],
           seed=100, mode=dd.QLEN_ONLY)
    for cfg in dd.refused_configs():
        _guard(report, f"refused: {cfg}", checks_tree.check_refused, report, ctx, cfg, configs)
    # The default, the deepest lineages (budget 256 and 1023: D far past the tree's depth), a
    # lineage raised past a shallow draft (top-K 2, block 3) and the chain.
    for cfg in (configs[0], configs[1], configs[2], configs[4], configs[6]):
        _guard(report, f"greedy verify: {cfg}", checks_tree.check_greedy_verify, report, ctx,
               cfg, seed=200)

    from . import attention

    try:
        ea = attention.load_extend_attention(release_root)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc(file=sys.stderr)
        report.record("FAIL", "Triton extend attention loads from the carried files",
                      f"{type(exc).__name__}: {exc}")
        ea = None
    else:
        for i, shape in enumerate(attention.shapes(on_gpu)):
            _guard(report, f"attention: {shape.label}", attention.check_attention, report, ea,
                   utils, device, shape, seed=300 + i)

    # SGLang's tree sampling kernel (target-only sampling walk): its JIT source includes
    # <flashinfer/sampling.cuh>, which neither the wheel nor the lent machine carries.
    report.note("SGLang's tree sampling kernel (kernels/jit/csrc/speculative/sampling.cuh) is "
                "not built: it includes <flashinfer/sampling.cuh>, which neither SGLang's wheel "
                "nor the lent machine has, so the CUDA sampling walk is checked nowhere (its "
                "transcription, kernel_model.tree_speculative_sampling_target_only, is checked "
                "against DDTree's sampling reference and the target's law on CPU)")
    # A budget schedule: the plugin resolves it, the worker runs every width (tree kernel,
    # attention, and on CUDA each width's step captured and replayed as a CUDA graph).
    from . import checks_schedule

    entries, block = checks_schedule.resolve(report, mods, device, on_gpu)
    for i in range(len(entries or ())):
        _guard(report, f"schedule width {entries[i].width}", checks_schedule.check_width,
               report, ctx, entries, i, block, ea, seed=400 + i)

    from . import hybrid

    _guard(report, "hybrid tree path", hybrid.check, report, release_root, device.type,
           hybrid.GPU_BUDGETS if on_gpu else hybrid.DRY_BUDGETS)

    from . import step

    if on_gpu:
        runner = step.StepRunner(kernels, device, configs[0])
        _guard(report, "step without host sync", step.check_sync_free, report, runner)
        _guard(report, "step in a CUDA graph", step.check_graph, report, runner)
        del runner
        _guard(report, "timings", step.timings, report, kernels, device)
    else:
        report.record("SKIP", "DDTree step without a host sync", "CUDA only")
        report.record("SKIP", "DDTree step captured in a CUDA graph, replayed == eager",
                      "CUDA only")
        import io

        quiet = Report("timings table, CPU", stream=io.StringIO())
        step.timings(quiet, None, device, batches=(1, 2), budgets=(16,),
                     warmup=1, iters=2)
        report.record("SKIP", "per-step timings, batch 1..64 x budget 16..256",
                      "CUDA only (the table's code ran here on CPU at batch 1-2, budget 16, "
                      "without the tree kernel)")


def main(argv) -> int:
    args = _parse(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: CPU interpreter
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    mode = "dry run (CPU)" if args.dry_run else "GPU"
    report = Report(mode, json_path=args.out / "gpu-check.json" if args.out else None)
    try:
        run_checks(report, args)
    except BadInput as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the run stops, its summary still prints
        traceback.print_exc(file=sys.stderr)
        report.record("FAIL", "the check itself", f"{type(exc).__name__}: {exc}")
    return report.summary()
