"""The v1 DDTree series against the REAL SGLang releases, on CPU: every test runs once per
family, sglang-0.5.12 on 0.5.12.post1 and sglang-0.5.13 on 0.5.13.post1 (each family's
other release, 0.5.12 / 0.5.13, ships the same files: checked below).

The series (patches/sglang-0.5.1x/) is applied in memory by the toolkit's check layer
to the release wheel's own files (every hunk exact; GNU patch and git apply, the
oracles, must give the same bytes). The results are overlaid on a host environment
(ddtree_deploy/sandbox/hostenv.py: a venv with the wheel installed), whose interpreter runs the
probes at the bottom of this file in subprocesses: imports, the launch_server CLI,
real ``ServerArgs`` validation on tiny config-only model folders (tests/data/models/),
and the hybrid gate against SGLang's own runtime test. A pristine host environment runs
the same ServerArgs cases as the baseline.

The one stand-in: ``sgl_kernel`` (SGLang's CUDA kernel package cannot load without a
GPU) for the import probe only; see sglang_host.write_kernel_standin.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
MODELS = REPO / "tests" / "data" / "models"
PROBE_TAG = "PROBE-JSON:"
# A STAND-IN for the memory SGLang measures (get_device_memory_capacity: on CPU the NUMA
# node's MemTotal, which a VM with lazily initialised or hot-plugged memory changes while it
# runs): a 24 GiB device, the same in every probe, so that what ServerArgs derives from it
# (mem_fraction_static, chunked_prefill_size, DDTree's max_running_requests cap) compares
# the series, not the machine (issue 28 item 7: 0.659 before vs 0.624 after in one CI run).
DEVICE_MIB = 24_576.0
# (family folder, the release its tests run on, the family's other release)
FAMILIES = [("sglang-0.5.12", "0.5.12.post1", "0.5.12"),
            ("sglang-0.5.13", "0.5.13.post1", "0.5.13")]

pytestmark = pytest.mark.sglang_env


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def family(request):
    """(family folder, release, sibling release): every fixture below follows it."""
    name, release, sibling = request.param
    return REPO / "patches" / name, release, sibling


# ---------------------------------------------------------------------------
# The series, applied in memory by the toolkit's check layer


@pytest.fixture(scope="module")
def series(family):
    """(patched files, their pristine bytes) for every path the series touches."""
    from ddtree_deploy.sandbox import pristine_files

    from ddtree_deploy.engine.check import check_series
    from ddtree_deploy.engine.series import load_family

    folder, release, _ = family
    loaded = load_family(folder)
    wheel = pristine_files(release)
    files = {path: wheel.get(path) for path in loaded.touched_paths()}  # None: added
    report = check_series(loaded, files)
    assert report.ok, report.to_json()
    counts = report.hunk_counts()
    assert counts["exact"] > 0 and sum(counts.values()) == counts["exact"], counts
    patched = {path: pf.patched for path, pf in report.patched.items()}
    pristine = {path: data for path, data in files.items() if data is not None}
    return patched, pristine


def _patch_files(folder: Path) -> list[Path]:
    from ddtree_deploy.engine.series import PatchEntry, load_family

    return [e.file for e in load_family(folder).entries if isinstance(e, PatchEntry)]


@pytest.fixture(scope="module")
def patched_env(family, series, tmp_path_factory):
    from ddtree_deploy.sandbox import make_host_env

    return make_host_env(tmp_path_factory.mktemp("host") / "patched", overlay=series[0],
                         version=family[1], read_only=True)


@pytest.fixture(scope="module")
def pristine_env(family, tmp_path_factory):
    from ddtree_deploy.sandbox import make_host_env

    return make_host_env(tmp_path_factory.mktemp("host") / "pristine", version=family[1], read_only=True)


def _probe(env, what: str, *args: str, pythonpath: Path | None = None,
           extra: dict | None = None) -> dict:
    from ddtree_deploy.sandbox import run_python

    extra = dict(extra or {}, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {}))
    run = run_python(env, [__file__, what, str(MODELS), *args], timeout=600, extra_env=extra)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(PROBE_TAG)]
    assert run.returncode == 0 and lines, (
        f"probe {what} failed (rc {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len(PROBE_TAG):])


@pytest.fixture(scope="module")
def server_args_probe(patched_env):
    return _probe(patched_env, "server-args")


@pytest.fixture(scope="module")
def baseline_probe(pristine_env):
    return _probe(pristine_env, "server-args")


# ---------------------------------------------------------------------------
# The series itself


def test_series_compiles_and_changes_every_file(series):
    patched, pristine = series
    assert "sglang/srt/speculative/spec_info.py" in patched
    assert "sglang/srt/speculative/ddtree_utils.py" not in pristine  # added by the series
    for rel, data in patched.items():
        assert data != pristine.get(rel), f"{rel} unchanged by the series"
        compile(data, rel, "exec")


@pytest.mark.parametrize("tool", ["gnu-patch", "git-apply"])
def test_oracles_agree_with_the_check_layer(family, series, tmp_path, tool):
    # GNU patch without fuzz and git apply (never fuzzy) must land every hunk where
    # the toolkit did and give the same bytes.
    patched, pristine = series
    for rel, data in pristine.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    if tool == "git-apply":
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for patch in _patch_files(family[0]):
        if tool == "gnu-patch":
            argv = ["patch", "-p1", "-F0", "--no-backup-if-mismatch", "-i", str(patch)]
        else:
            argv = ["git", "apply", "-p1", str(patch)]
        run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 0, f"{patch.name}:\n{run.stdout}{run.stderr}"
        # GNU patch reports a hunk that needed an offset as "succeeded at N (offset ...)".
        assert "offset" not in run.stdout and "fuzz" not in run.stdout, run.stdout
    for rel in pristine:
        assert (tmp_path / rel).read_bytes() == patched[rel], rel


def test_sibling_release_has_the_same_files(family, series):
    # Each family covers X and X.post1: the series is checked on one, so the other
    # must ship byte-identical files for every path it patches.
    from ddtree_deploy.sandbox import pristine_files

    _, pristine = series
    assert pristine_files(family[2], paths=sorted(pristine)) == pristine


# ---------------------------------------------------------------------------
# In the host environment


# The modules the issue names; every module the series touches or adds joins them.
NAMED_MODULES = {"sglang.srt.speculative.spec_info", "sglang.srt.server_args",
                 "sglang.srt.speculative.dflash_info", "sglang.srt.speculative.dflash_worker",
                 "sglang.srt.speculative.ddtree_utils", "sglang.srt.speculative.ddtree_args",
                 "sglang.srt.managers.scheduler"}


def _modules(series) -> set[str]:
    return NAMED_MODULES | {
        rel[: -len(".py")].replace("/", ".") for rel in series[0] if rel.endswith(".py")
    }


@pytest.fixture(scope="module")
def import_probe(series, patched_env, tmp_path_factory):
    from ddtree_deploy.sandbox import write_kernel_standin

    standin = write_kernel_standin(tmp_path_factory.mktemp("standin"))
    return _probe(patched_env, "imports", *sorted(_modules(series)), pythonpath=standin)


def test_patched_modules_import(series, import_probe):
    result = import_probe
    assert result["errors"] == {}, result
    assert set(result["imported"]) == _modules(series)
    algo = result["algorithm"]
    assert algo["from_string"] == "DDTREE"
    assert algo["ddtree_is_dflash"] and algo["ddtree_is_ddtree"]
    assert algo["dflash_is_dflash"] and not algo["dflash_is_ddtree"]
    assert not algo["ddtree_supports_spec_v2"]
    assert algo["worker"] == "DFlashWorker"
    assert "DDTREE does not support overlap" in algo["overlap_error"]
    assert "reserved" in algo["register_ddtree_error"]
    assert algo["plugin_is_ddtree"] is False


def test_hybrid_gate_agrees_with_sglang_runtime(import_probe):
    # Differential: the gate (server args, before any runner exists) and SGLang's
    # ModelRunner.mambaish_config (what picks the recurrent backends at run time)
    # classify every config class the release ships the same way.
    views = dict(import_probe["hybrid_views"])
    # A config class that needs arguments cannot be built blank; only this one, a
    # NemotronHConfig subclass (so the gate's isinstance test covers it), may be skipped.
    assert set(views.pop("<unconstructible>")) <= {"NemotronHPuzzleConfig"}
    disagree = {name: v for name, v in views.items() if v[0] != v[1]}
    assert disagree == {}
    hybrid = {name for name, v in views.items() if v[0]}
    assert {"Qwen3NextConfig", "NemotronHConfig", "FalconH1Config", "KimiLinearConfig",
            "GraniteMoeHybridConfig"} <= hybrid
    assert {"LlamaConfig", "Qwen3MoeConfig", "GraniteMoeHybridConfig(attention only)"}.isdisjoint(hybrid)
    assert len(views) > 30


def test_launch_server_help_lists_ddtree_flags(patched_env):
    from ddtree_deploy.sandbox import run_python

    run = run_python(patched_env, ["-m", "sglang.launch_server", "--help"], timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    for flag in (
        "--speculative-ddtree-budget",
        "--speculative-ddtree-topk",
        "--speculative-ddtree-allow-hybrid-unsafe",
    ):
        assert flag in run.stdout
    assert "DFLASH, DDTREE" in run.stdout


def test_baseline_dflash_unpatched(baseline_probe):
    base = baseline_probe["dflash"]
    assert base["ok"], base
    assert base["speculative_num_draft_tokens"] == 16  # the draft config's block_size
    assert base["speculative_eagle_topk"] == 1 and base["max_running_requests"] == 48
    # Unpatched SGLang does not know DDTREE: the patched results below are the series'.
    assert not baseline_probe["ddtree_default"]["ok"]
    assert "Unknown speculative algorithm" in baseline_probe["ddtree_default"]["error"]


def test_dflash_unchanged_by_series(server_args_probe, baseline_probe):
    # The memory both probes measured is the stand-in's, not this machine's free memory.
    assert server_args_probe["mem_plan"] == baseline_probe["mem_plan"] == {"device_memory_mib": DEVICE_MIB}
    for case in ("dflash", "dflash_hybrid"):
        before, after = baseline_probe[case], server_args_probe[case]
        assert before["ok"] and after["ok"], (before, after)
        # Every field the release has keeps its value; the DDTree fields are new.
        known = {k: v for k, v in before.items() if v != "<absent>"}
        assert {k: after[k] for k in known} == known
        assert before["speculative_ddtree_budget"] == "<absent>"
        assert len(known) == len(before) - 3


def test_ddtree_defaults(server_args_probe):
    got = server_args_probe["ddtree_default"]
    assert got["ok"], got
    assert got["speculative_algorithm"] == "DDTREE"
    assert got["speculative_ddtree_budget"] == 64
    assert got["speculative_ddtree_topk"] is None
    assert got["speculative_num_draft_tokens"] == 65  # verify width = budget + 1
    assert got["speculative_dflash_block_size"] == 16  # draft block, from the draft config
    assert got["speculative_eagle_topk"] == 1 and got["speculative_num_steps"] == 1
    assert got["max_running_requests"] == 48
    assert got["disable_overlap_schedule"] is True
    assert got["disable_cuda_graph"] is True
    assert got["enable_mixed_chunk"] is False
    assert got["page_size"] == 1


def test_ddtree_explicit_values_and_revalidation(server_args_probe):
    got = server_args_probe["ddtree_explicit"]
    assert got["ok"], got
    assert got["speculative_num_draft_tokens"] == 256
    assert got["speculative_dflash_block_size"] == 8
    assert got["speculative_ddtree_topk"] == 4
    # Validating the same args again (a copy re-runs __post_init__) changes nothing.
    assert server_args_probe["ddtree_revalidated"] == got


def test_ddtree_verify_backend_follows_attention_mode(server_args_probe):
    # Prefill on FA3 is fine when the tree is verified by the decode backend.
    got = server_args_probe["ddtree_decode_mode_triton"]
    assert got["ok"], got


def test_ddtree_cli_flags_reach_server_args(server_args_probe):
    got = server_args_probe["ddtree_cli"]
    assert got["ok"], got
    assert got["speculative_ddtree_budget"] == 32
    assert got["speculative_ddtree_topk"] == 8
    assert got["speculative_ddtree_allow_hybrid_unsafe"] is True
    assert got["speculative_num_draft_tokens"] == 33


@pytest.mark.parametrize(
    "case, needle",
    [
        ("budget_zero", "--speculative-ddtree-budget must be an integer in [1, 1024], got 0"),
        ("budget_too_big", "in [1, 1024], got 1025"),
        ("budget_bool", "got True"),
        ("topk_zero", "--speculative-ddtree-topk must be an integer >= 1"),
        ("num_draft_tokens_conflict", "Drop --speculative-num-draft-tokens"),
        ("page_size", "DDTREE requires --page-size 1, got 16"),
        ("causal_verify_backend", "got 'fa3'"),
        ("no_draft_model", "DDTREE speculative decoding requires setting --speculative-draft-model-path"),
        ("causal_decode_verify", "got 'fa3' (speculative_attention_mode=decode)"),
        # Issue 12 (1): a verify width below the draft block would let the draft step
        # write past its req_to_token row; refused, naming both flags.
        ("budget_below_block", "--speculative-ddtree-budget 4 gives a verify width of 5, "
         "below the draft block 16 (--speculative-dflash-block-size"),
        ("budget_below_explicit_block", "--speculative-ddtree-budget 6 gives a verify width "
         "of 7, below the draft block 8"),
        # Issue 12 (3): block 1 leaves no drafted position (build_ddtree raised L = 0).
        ("block_one", "got --speculative-dflash-block-size 1"),
        # Issue 12 (2): an explicit max_running_requests whose verify cannot fit.
        ("mem_explicit_too_many", "--max-running-requests 48 cannot fit DDTREE's verify"),
        ("mem_budget_cannot_fit", "MB of verify buffers per request, more than the"),
    ],
)
def test_ddtree_bad_values_refused(server_args_probe, case, needle):
    got = server_args_probe[f"refuse_{case}"]
    assert not got["ok"], got
    assert needle in got["error"]


def test_ddtree_budget_equal_to_block_constructs(server_args_probe):
    got = server_args_probe["ddtree_budget_at_block"]
    assert got["ok"], got
    assert got["speculative_num_draft_tokens"] == 16  # verify width = block: allowed
    assert got["speculative_dflash_block_size"] == 16


def test_draft_block_write_stays_in_its_req_to_token_row(patched_env, tmp_path):
    """Issue 12 (1), real objects: with every budget ServerArgs accepts, the draft step's
    block write (SGLang's own Triton kernel, CPU interpreter) stays inside the request's
    req_to_token row; with budget 4 (now refused) it wrote into the next request's row."""
    from ddtree_deploy.sandbox import write_kernel_standin

    got = _probe(patched_env, "draft-row", pythonpath=write_kernel_standin(tmp_path),
                 extra={"TRITON_INTERPRET": "1"})
    for budget in (15, 64):
        case = got[f"budget_{budget}"]
        assert case["block"] == 16 and case["max_speculative_num_draft_tokens"] == budget + 1
        assert case["own_row_written"] == 16 and case["next_row_written"] == 0, case
    # Budget 4: rows 5 wider than the context, a 16-token block from the same start:
    # 16 - 5 = 11 entries land in the next request's row.
    assert got["budget_4_if_accepted"]["next_row_written"] == 16 - 5


def test_ddtree_max_running_requests_derived_from_memory(server_args_probe):
    """Issue 12 (2): with little memory left outside mem_fraction_static, the default 48
    becomes the cap that budget x vocab allows (recomputed here from the numbers the
    probe read: the device memory SGLang measured and the resolved fraction)."""
    got = server_args_probe["mem_derived"]
    assert got["ok"], got
    plan = server_args_probe["mem_plan"]
    free = plan["device_memory_mib"] * (1 << 20) * (1 - got["mem_fraction_static"])
    per_request = (1024 + 1) * 512 * 4 * 5  # rows x vocab x float32 x vocab-sized copies
    cap = int(free * 0.5 // per_request)
    assert 1 <= cap < 48, (cap, plan)
    assert got["max_running_requests"] == cap
    # The derived cap is logged with its numbers.
    logged = [ln for ln in server_args_probe["mem_derived:log"] if "max_running_requests" in ln]
    assert len(logged) == 1 and f"max_running_requests = {cap} " in logged[0], logged
    assert "budget 1024 x vocab 512" in logged[0]
    # An explicit value within the cap is kept.
    assert server_args_probe["mem_explicit_fits"]["max_running_requests"] == 1


def test_hybrid_gate(server_args_probe):
    refused = server_args_probe["hybrid_refused"]
    assert not refused["ok"]
    assert "Qwen3NextConfig" in refused["error"]
    assert "--speculative-ddtree-allow-hybrid-unsafe" in refused["error"]
    allowed = server_args_probe["hybrid_allowed"]
    assert allowed["ok"], allowed
    assert allowed["speculative_num_draft_tokens"] == 65
    # The gate is DDTREE's: DFLASH on the same hybrid target constructs.
    assert server_args_probe["dflash_hybrid"]["ok"]


# ---------------------------------------------------------------------------
# Probes: run by the HOST interpreter (python this_file <probe> <models dir>)

_FIELDS = (
    "speculative_algorithm", "speculative_num_draft_tokens", "speculative_dflash_block_size",
    "speculative_eagle_topk", "speculative_num_steps", "max_running_requests",
    "disable_overlap_schedule", "disable_cuda_graph", "enable_mixed_chunk", "page_size",
    "speculative_ddtree_budget", "speculative_ddtree_topk",
    "speculative_ddtree_allow_hybrid_unsafe", "mem_fraction_static",
)


def _outcome(build) -> dict:
    try:
        args = build()
    except (Exception, SystemExit) as exc:  # every refusal, argparse's exit included
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, **{f: getattr(args, f, "<absent>") for f in _FIELDS}}


def _pin_device_memory() -> None:
    """Every ServerArgs in this process sees DEVICE_MIB (server_args imports the name itself)."""
    from sglang.srt import server_args
    from sglang.srt.utils import common

    def fixed(device=None):
        return DEVICE_MIB

    common.get_device_memory_capacity = server_args.get_device_memory_capacity = fixed


def _probe_server_args(models: Path, *unused: str) -> dict:
    import argparse

    _pin_device_memory()
    from sglang.srt.server_args import ServerArgs

    llama, draft, hybrid = (str(models / n) for n in ("tiny-llama", "tiny-dflash-draft", "tiny-qwen3-next"))

    def make(**kw):
        base = dict(model_path=llama, speculative_algorithm="DDTREE",
                    speculative_draft_model_path=draft, device="cpu",
                    skip_tokenizer_init=True, attention_backend="triton")
        base.update(kw)
        return lambda: ServerArgs(**base)

    def dflash(**kw):
        base = dict(model_path=llama, speculative_algorithm="DFLASH",
                    speculative_draft_model_path=draft, device="cpu", skip_tokenizer_init=True)
        base.update(kw)
        return lambda: ServerArgs(**base)

    # Memory: leave outside mem_fraction_static room for ~10 requests' verify buffers at
    # budget 1024 (vocab 512), whatever this machine's memory is.
    from sglang.srt.utils.common import get_device_memory_capacity

    device_mib = get_device_memory_capacity("cpu")
    per_request = (1024 + 1) * 512 * 4 * 5
    tight = round(1 - 20 * per_request / (device_mib * (1 << 20)), 6)
    hopeless = round(1 - 0.5 * per_request / (device_mib * (1 << 20)), 9)

    def revalidate():
        args = make(speculative_ddtree_budget=255, speculative_dflash_block_size=8,
                    speculative_ddtree_topk=4)()
        args.__post_init__()
        return args

    def from_cli():
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        ns = parser.parse_args([
            "--model-path", llama, "--speculative-algorithm", "ddtree",
            "--speculative-draft-model-path", draft, "--device", "cpu",
            "--skip-tokenizer-init", "--attention-backend", "triton",
            "--speculative-ddtree-budget", "32", "--speculative-ddtree-topk", "8",
            "--speculative-ddtree-allow-hybrid-unsafe",
        ])
        return ServerArgs.from_cli_args(ns)

    cases = {
        "dflash": dflash(),
        "dflash_hybrid": dflash(model_path=hybrid, disable_radix_cache=True),
        "ddtree_default": make(),
        "ddtree_explicit": make(speculative_ddtree_budget=255, speculative_dflash_block_size=8,
                                speculative_ddtree_topk=4),
        "ddtree_revalidated": revalidate,
        "ddtree_cli": from_cli,
        "refuse_budget_zero": make(speculative_ddtree_budget=0),
        "refuse_budget_too_big": make(speculative_ddtree_budget=1025),
        "refuse_budget_bool": make(speculative_ddtree_budget=True),
        "refuse_topk_zero": make(speculative_ddtree_topk=0),
        "refuse_num_draft_tokens_conflict": make(speculative_num_draft_tokens=16),
        "refuse_page_size": make(page_size=16),
        "refuse_causal_verify_backend": make(attention_backend="fa3"),
        "refuse_no_draft_model": make(speculative_draft_model_path=None),
        # Target verify runs on the decode backend in "decode" attention mode.
        "refuse_causal_decode_verify": make(speculative_attention_mode="decode",
                                            decode_attention_backend="fa3"),
        "refuse_budget_below_block": make(speculative_ddtree_budget=4),
        "refuse_budget_below_explicit_block": make(speculative_ddtree_budget=6,
                                                   speculative_dflash_block_size=8),
        "refuse_block_one": make(speculative_dflash_block_size=1),
        "ddtree_budget_at_block": make(speculative_ddtree_budget=15),
        "mem_derived": make(speculative_ddtree_budget=1024, mem_fraction_static=tight),
        "mem_explicit_fits": make(speculative_ddtree_budget=1024, mem_fraction_static=tight,
                                  max_running_requests=1),
        "refuse_mem_explicit_too_many": make(speculative_ddtree_budget=1024,
                                             mem_fraction_static=tight,
                                             max_running_requests=48),
        "refuse_mem_budget_cannot_fit": make(speculative_ddtree_budget=1024,
                                             mem_fraction_static=hopeless),
        "ddtree_decode_mode_triton": make(speculative_attention_mode="decode",
                                          prefill_attention_backend="fa3",
                                          decode_attention_backend="triton"),
        # Radix cache off: SGLang itself refuses speculative decoding on a Mamba
        # target with the no_buffer radix cache, before any DDTREE check runs.
        "hybrid_refused": make(model_path=hybrid, disable_radix_cache=True),
        "hybrid_allowed": make(model_path=hybrid, disable_radix_cache=True,
                               speculative_ddtree_allow_hybrid_unsafe=True),
    }
    import logging

    class _Lines(logging.Handler):  # what DDTREE's validation logs, per case
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    results = {}
    for name, build in cases.items():
        lines = _Lines()
        logging.getLogger("sglang.srt.speculative.ddtree_args").addHandler(lines)
        results[name] = _outcome(build)
        logging.getLogger("sglang.srt.speculative.ddtree_args").removeHandler(lines)
        results[name + ":log"] = lines.lines
    results["mem_plan"] = {"device_memory_mib": device_mib}
    return results


def _probe_imports(models: Path, *names: str) -> dict:
    import importlib
    from types import SimpleNamespace

    imported, errors = [], {}
    for name in names:
        try:
            importlib.import_module(name)
            imported.append(name)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm as S
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    ddtree, dflash = S.from_string("ddtree"), S.DFLASH
    algo = {
        "from_string": ddtree.name,
        "ddtree_is_dflash": ddtree.is_dflash(), "ddtree_is_ddtree": ddtree.is_ddtree(),
        "dflash_is_dflash": dflash.is_dflash(), "dflash_is_ddtree": dflash.is_ddtree(),
        "ddtree_supports_spec_v2": ddtree.supports_spec_v2(),
        "plugin_is_ddtree": CustomSpecAlgo("X", lambda a: None).is_ddtree(),
    }
    try:
        algo["worker"] = ddtree.create_worker(SimpleNamespace(disable_overlap_schedule=True)).__name__
    except Exception as exc:
        algo["worker"] = f"{type(exc).__name__}: {exc}"
    try:
        ddtree.create_worker(SimpleNamespace(disable_overlap_schedule=False))
        algo["overlap_error"] = ""
    except ValueError as exc:
        algo["overlap_error"] = str(exc)
    try:
        S.register("ddtree")(lambda a: None)
        algo["register_ddtree_error"] = ""
    except ValueError as exc:
        algo["register_ddtree_error"] = str(exc)
    return {"imported": imported, "errors": errors, "algorithm": algo,
            "hybrid_views": _hybrid_views()}


def _hybrid_views() -> dict:
    """For every config class SGLang ships (and a few plain transformers ones): does the
    runtime (ModelRunner.mambaish_config) see a recurrent target, and does the DDTREE
    gate? The runner's own property code runs on a runner SHELL (object.__new__: no
    model, no device), given only the hf_config that property reads."""
    from types import SimpleNamespace

    import transformers

    import sglang.srt.configs as sglang_configs
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.ddtree_args import recurrent_target as _ddtree_recurrent_target

    classes = [getattr(sglang_configs, n) for n in sglang_configs.__all__]
    classes += [getattr(transformers, n) for n in ("LlamaConfig", "Qwen3Config", "Qwen3MoeConfig")]
    configs, unconstructible = {}, []
    for cls in classes:
        try:
            configs[cls.__name__] = cls()
        except TypeError:  # no defaults at init (0.5.13's NemotronHPuzzleConfig)
            unconstructible.append(cls.__name__)
    # GraniteMoeHybrid is hybrid only when a layer is Mamba: both layouts.
    configs["GraniteMoeHybridConfig(attention only)"] = sglang_configs.GraniteMoeHybridConfig(
        layer_types=["attention", "attention"], num_hidden_layers=2)
    views = {}
    for name, config in configs.items():
        shell = object.__new__(ModelRunner)
        shell.model_config = SimpleNamespace(hf_config=config)
        shell.is_draft_worker = False
        # 0.5.13 caches the linear-attention registry lookup (set in __init__).
        from sglang.srt.model_executor import model_runner as runner_module

        if hasattr(runner_module, "_UNSET"):
            shell._linear_attn_registry_cache = runner_module._UNSET
        views[name] = [shell.mambaish_config is not None,
                       _ddtree_recurrent_target(config) is not None]
    views["<unconstructible>"] = unconstructible
    return views


def _probe_draft_row(models: Path, *unused: str) -> dict:
    """Issue 12 (1) with real SGLang objects: the draft step's req_to_token write (SGLang's
    own assign_req_to_token_pool kernel, run by Triton's CPU interpreter: the caller sets
    TRITON_INTERPRET=1) into a real ReqToTokenPool whose rows are as wide as SGLang makes
    them for the resolved ServerArgs (context_len + 4 + speculative_num_draft_tokens; 0.5.13's
    own get_req_to_token_extra_context_len where it exists). The draft writes a whole block
    from the largest start the verify's own reservation admits (context_len + 4). Rows are
    also sized for budget 4 (refused by ServerArgs) to show what the refusal prevents."""
    import torch

    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_utils import assign_req_to_token_pool_func

    try:
        from sglang.srt.mem_cache.common import get_req_to_token_extra_context_len
    except ImportError:  # 0.5.12: model_runner_kv_cache_mixin inlines 4 + num_draft_tokens
        def get_req_to_token_extra_context_len(args):
            return 4 + (args.speculative_num_draft_tokens or 0)

    llama, draft = (str(models / n) for n in ("tiny-llama", "tiny-dflash-draft"))
    _pin_device_memory()

    def draft_write(context_len: int, extra: int, block: int) -> dict:
        pool = ReqToTokenPool(size=2, max_context_len=context_len + extra, device="cpu",
                              enable_memory_saver=False)
        pool.req_to_token.fill_(-7)
        start = torch.tensor([context_len + 4], dtype=torch.int64)
        assign_req_to_token_pool_func(
            torch.tensor([0], dtype=torch.int64), pool.req_to_token, start, start + block,
            torch.arange(1000, 1000 + block, dtype=torch.int64), 1)
        row0 = pool.req_to_token[0].tolist()
        return {"row_width": int(pool.req_to_token.shape[1]),
                "next_row_written": int((pool.req_to_token[1] != -7).sum()),
                "own_row_written": sum(v != -7 for v in row0)}

    out = {}
    for budget in (15, 64):
        args = ServerArgs(model_path=llama, speculative_algorithm="DDTREE",
                          speculative_draft_model_path=draft, device="cpu",
                          skip_tokenizer_init=True, attention_backend="triton",
                          speculative_ddtree_budget=budget)
        context_len = args.get_model_config().context_len
        out[f"budget_{budget}"] = dict(
            draft_write(context_len, get_req_to_token_extra_context_len(args),
                        args.speculative_dflash_block_size),
            block=args.speculative_dflash_block_size,
            max_speculative_num_draft_tokens=getattr(
                args, "max_speculative_num_draft_tokens", args.speculative_num_draft_tokens))
    out["budget_4_if_accepted"] = draft_write(context_len, 4 + 4 + 1, 16)
    return out


if __name__ == "__main__":
    _probes = {"server-args": _probe_server_args, "imports": _probe_imports,
               "draft-row": _probe_draft_row}
    _result = _probes[sys.argv[1]](Path(sys.argv[2]), *sys.argv[3:])
    print(PROBE_TAG + json.dumps(_result, default=str), flush=True)
