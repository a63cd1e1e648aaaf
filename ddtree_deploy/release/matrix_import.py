"""``matrix --import``: install each release, patched, into a throwaway CPU virtualenv and smoke it.

For a release whose family applied cleanly, a venv is made from the base
interpreter (no pip, nothing downloaded), the release wheel's ``sglang`` package
and its ``.dist-info`` are unpacked into its site-packages as pip would install
them with ``--no-deps``, the patched files from ``check_series`` replace the
originals, and a ``.pth`` file appends this toolkit environment's site-packages
(torch, transformers and SGLang's other Python dependencies, as ``make install``
puts them there). The env's own site-packages comes first, so its ``sglang`` wins.

The host-side smoke program (``hostprog.smoke``) then runs the ``import`` and ``cli``
levels with the env's interpreter, exactly as it would on a GPU host; the request
comes from ``smoke_plan.plan_smoke``. A third level, ``tree``, is never silently linear:
SGLang's own ``ServerArgs`` for ``--speculative-algorithm DDTREE`` (budget 32, on
tiny config-only model folders written into the env) must resolve to a verify width
of budget + 1, and the worker class DDTREE resolves to must carry
``DDTREE_TREE_VERIFY = True`` (docs/patches-v2.md). The env is deleted afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.engine.check import check_series
from ddtree_deploy.engine.series import PatchEntry, Series
from ddtree_deploy.release import releases
from ddtree_deploy.settings.smoke import SmokeSettings
from ddtree_deploy.smoke.plan import module_name, plan_smoke, series_flags
from ddtree_deploy.smoke.report import read_answer
from ddtree_deploy.smoke.run import smoke_agent_source

LEVELS = ("import", "cli")
TREE_LEVEL = "tree"


@dataclass(frozen=True)
class ImportSmoke:
    """The smoke levels of one release: ``(level, status, detail)`` each."""

    version: str
    levels: tuple[tuple[str, str, str], ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(status == "passed" for _, status, _ in self.levels)

    def short(self) -> str:
        failed = [level for level, status, _ in self.levels if status == "failed"]
        return "passed" if self.ok else f"{'/'.join(failed) or 'skipped'} failed"


def _site_packages(env: Path) -> Path:
    found = sorted(env.glob("lib/python*/site-packages"))
    if not found:
        raise DeployError(f"{env}: the new virtualenv has no lib/python*/site-packages")
    return found[0]


def make_env(dest: Path, wheel: Path) -> tuple[Path, Path]:
    """A venv at ``dest`` with the release installed (no deps): (its python, its site-packages)."""
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        raise DeployError(f"cannot create a virtualenv at {dest}: {made.stderr.strip()[-300:]}")
    site = _site_packages(dest)
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist()
                   if n.split("/", 1)[0] == "sglang" or n.split("/", 1)[0].endswith(".dist-info")]
        zf.extractall(site, members=members)
    # After the env's own site-packages: the dependencies, never a second sglang.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_ddtree_deploy_deps.pth").write_text("".join(f"{p}\n" for p in sorted(deps)))
    return dest / "bin" / "python", site


_PROBE = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


# What an unpatched release cannot import on this machine depends on the release's wheel, the
# modules asked and this interpreter's packages (every env made here reads them through its
# .pth), not on the env: asked again in one process (the tree-level cases of a test module
# after a `matrix --import` of the same release), the first answer is the answer, and the
# probe (torch and SGLang imported whole, tens of seconds) runs once.
_UNIMPORTABLE: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}


def unimportable_release(wheel: Path, python: Path, modules: Sequence[str], timeout_s: float) -> dict[str, str]:
    """``unimportable`` for the env ``make_env(dest, wheel)`` made, once per wheel and modules
    in this process (a copy: callers may change theirs)."""
    key = (wheel.name, tuple(sorted(modules)))
    if key not in _UNIMPORTABLE:
        _UNIMPORTABLE[key] = unimportable(python, modules, timeout_s)
    return dict(_UNIMPORTABLE[key])


def unimportable(python: Path, modules: Sequence[str], timeout_s: float) -> dict[str, str]:
    """Modules of the *unpatched* release that this CPU env cannot import, with the error.

    Some SGLang modules import CUDA-only packages (sgl_kernel) at module level; a CPU
    env cannot import them patched or not. They are left out of the import level
    (and named in its detail), so the level tests what the series changed: a module
    that imported before the series must still import after it.
    """
    try:
        done = subprocess.run([str(python), "-c", _PROBE, *modules], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DeployError(f"importing the unpatched release timed out after {timeout_s:g} s") from None
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise DeployError(f"the import probe failed (exit {done.returncode}): {done.stderr.strip()[-300:]}") from None


# --- the tree level: DDTREE must resolve to a tree verify ------------------------------

#: Config-only model folders (no weights: ServerArgs reads config.json only).
_TINY_TARGET = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}
_TINY_DRAFT = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "float32", "block_size": 16, "num_target_layers": 4,
    "dflash_config": {"mask_token_id": 511, "target_layer_ids": [1, 2]},
}
TREE_BUDGET = 32

# Runs in the release's env. Resolution differs by epoch: up to 0.5.19 ServerArgs
# resolves while it is constructed; from 0.5.20 on, resolve_once() does and the record
# keeps the raw input (resolved_dict() has the decisions). DFLASH (so DDTREE) refuses
# device "cpu" from 0.5.14 on and "cuda" constructs fine without a GPU; the v1 releases
# are tried on "cpu" first. The answer is the last JSON line.
_TREE_PROBE = r"""
import json, logging, sys
logging.disable(logging.WARNING)
spec = json.loads(sys.argv[1])
out = {"ok": False}
try:
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    errors = []
    args = None
    for device, extra in (("cpu", {"attention_backend": "triton"}), ("cuda", {})):
        try:
            args = ServerArgs(model_path=spec["target"], speculative_algorithm="DDTREE",
                              speculative_draft_model_path=spec["draft"], device=device,
                              skip_tokenizer_init=True, speculative_ddtree_budget=spec["budget"], **extra)
            if callable(getattr(args, "resolve_once", None)):
                args.resolve_once()
            break
        except Exception as exc:
            errors.append("device %s: %s: %s" % (device, type(exc).__name__, exc))
            args = None
    if args is None:
        out["error"] = "ServerArgs for DDTREE does not resolve: " + " | ".join(errors)
    else:
        fields = args.resolved_dict() if callable(getattr(args, "resolved_dict", None)) else vars(args)
        out["width"] = fields.get("speculative_num_draft_tokens")
        out["budget"] = fields.get("speculative_ddtree_budget")
        algo = SpeculativeAlgorithm.from_string("DDTREE")
        try:
            worker = algo.create_worker(args)
        except ImportError as exc:
            out["import_error"] = "%s: %s" % (type(exc).__name__, exc)
            out["missing"] = getattr(exc, "name", None)
        else:
            out["worker"] = "%s.%s" % (worker.__module__, worker.__qualname__)
            out["tree_verify"] = getattr(worker, "DDTREE_TREE_VERIFY", None) is True
        out["ok"] = True
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out, default=str))
"""


def tree_verdict(answer: dict, *, budget: int, cannot: dict[str, str]) -> tuple[str, str]:
    """(status, detail) of the tree level from the probe's answer; pure.

    ``cannot``: modules the UNPATCHED release cannot import in this CPU env. A worker
    whose import fails on one of those (e.g. a v1 worker needing the CUDA-only
    sgl_kernel) is ``skipped``, named; any other failure to reach a tree worker fails.
    """
    if not answer.get("ok"):
        return "failed", answer.get("error") or "the tree probe gave no answer"
    width, resolved_budget = answer.get("width"), answer.get("budget")
    if resolved_budget != budget or width != budget + 1:
        return "failed", (f"DDTREE resolved to verify width {width} with budget {resolved_budget}, "
                          f"not budget + 1 = {budget + 1} (asked budget {budget}): a chain would verify like this")
    if "import_error" in answer:
        # Skipped only for a missing package outside sglang that already keeps the
        # unpatched release's modules from importing here; a missing sglang module (a
        # worker the series forgot) fails.
        top = (answer.get("missing") or "").split(".")[0]
        if top and top != "sglang" and any(f"'{top}" in err for err in cannot.values()):
            return "skipped", (f"verify width {width} = budget + 1; the worker needs {top}, which this CPU env "
                               f"lacks (so do the unpatched release's modules): {answer['import_error']}")
        return "failed", f"the DDTREE worker does not import: {answer['import_error']}"
    if not answer.get("tree_verify"):
        return "failed", (f"DDTREE resolves to {answer.get('worker')}, which does not tree-verify "
                          "(no DDTREE_TREE_VERIFY = True): silently linear")
    return "passed", f"verify width {width} = budget {budget} + 1; worker {answer['worker']} tree-verifies"


def tree_level(python: Path, work: Path, cannot: dict[str, str], timeout_s: float) -> tuple[str, str]:
    """Run the tree probe with the env's interpreter: (status, detail)."""
    models = {"target": _TINY_TARGET, "draft": _TINY_DRAFT}
    for name, config in models.items():
        (work / name).mkdir(parents=True, exist_ok=True)
        (work / name / "config.json").write_text(json.dumps(config))
    spec = {"target": str(work / "target"), "draft": str(work / "draft"), "budget": TREE_BUDGET}
    try:
        done = subprocess.run([str(python), "-c", _TREE_PROBE, json.dumps(spec)], capture_output=True,
                              text=True, timeout=timeout_s, cwd=work)
    except subprocess.TimeoutExpired:
        return "failed", f"the tree probe timed out after {timeout_s:g} s"
    lines = [ln for ln in done.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        return "failed", f"the tree probe exited {done.returncode} without an answer: {done.stderr.strip()[-300:]}"
    return tree_verdict(answer, budget=TREE_BUDGET, cannot=cannot)


def smoke_release(version: str, wheel: Path, series: Series, *, fuzz: int = 0, timeout_s: float = 300.0,
                  work_dir: Path | None = None) -> ImportSmoke:
    """Patch ``version`` with ``series``, install it in a throwaway venv, run the import and cli levels."""
    started = time.perf_counter()
    wanted = series.touched_paths()
    found = releases.read_wheel_files(wheel, wanted)
    report = check_series(series, {p: found.get(p) for p in wanted}, fuzz=fuzz)
    if not report.ok:
        levels = tuple((level, "skipped", "the series does not apply cleanly") for level in (*LEVELS, TREE_LEVEL))
        return ImportSmoke(version, levels, time.perf_counter() - started)
    flags = series_flags(e.file.read_text(encoding="utf-8") for e in series.entries if isinstance(e, PatchEntry))
    with tempfile.TemporaryDirectory(prefix=f"ddtree-import-{version}-", dir=work_dir) as tmp:
        python, site = make_env(Path(tmp) / "env", wheel)
        existing = [module_name(p) for p in wanted if found.get(p) is not None and module_name(p)]
        cannot = unimportable_release(wheel, python, existing, timeout_s)
        for p in report.patched.values():
            target = site.joinpath(*p.path.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(p.patched)
        settings = SmokeSettings(levels=LEVELS, timeout_s=timeout_s, import_exclude=tuple(cannot))
        plan = plan_smoke(settings, touched_paths=wanted, flags=flags, log_path="-", levels=LEVELS)
        agent = Path(tmp) / "smoke_agent.py"
        agent.write_bytes(smoke_agent_source())

        def run(request: dict) -> dict:
            done = subprocess.run([str(python), str(agent)], input=json.dumps(request), capture_output=True,
                                  text=True, timeout=timeout_s * len(LEVELS) + 60)
            try:
                return json.loads(done.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}

        result = read_answer(f"sglang {version} (throwaway venv)", plan, run(plan.request))
        if result.ok:
            tree = tree_level(python, Path(tmp) / "tree", cannot, timeout_s)
        else:
            tree = ("skipped", "an earlier level failed")
    levels = []
    for r in result.levels:
        detail = r.detail
        if r.level == "import" and cannot:
            # Say why a module was left out: the unpatched release fails the same way here.
            detail += "; unpatched, on this CPU env: " + "; ".join(f"{m}: {e}" for m, e in cannot.items())
        levels.append((r.level, r.status, detail))
    levels.append((TREE_LEVEL, *tree))
    return ImportSmoke(version, tuple(levels), time.perf_counter() - started)


def smoke_releases(jobs: Sequence[tuple[str, Path, Series]], *, fuzz: int = 0,
                   progress: Callable[[str, int, int], None] | None = None) -> dict[str, ImportSmoke]:
    """One after the other: each level imports torch and SGLang, which wants the whole machine."""
    out = {}
    for n, (version, wheel, series) in enumerate(jobs, start=1):
        out[version] = smoke_release(version, wheel, series, fuzz=fuzz)
        if progress:
            progress("import", n, len(jobs))
    return out


__all__ = ["ImportSmoke", "make_env", "smoke_release", "smoke_releases", "tree_verdict", "unimportable_release"]
