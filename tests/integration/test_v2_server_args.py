"""DDTREE server arguments on the REAL patched SGLang, on CPU (the v2 families).

Once per v2 family, on its newest release: 0.5.23 with patches/sglang-0.5.20/, 0.5.19 with
patches/sglang-0.5.19/ (the spec fields in server_args.py). The family is applied in memory by
the toolkit's check layer to the release wheel's own files, overlaid on a host environment (ddtree_deploy/sandbox/hostenv.py), and its
interpreter runs the probe at the bottom of this file: real ``ServerArgs`` on the tiny
config-only model folders of tests/data/models, resolved by SGLang's own pipeline
(``resolve_once``), then published to the runtime context as a scheduler would. ``device``
is "cuda" (DFLASH, and so DDTREE, refuses "cpu"); nothing here touches a GPU. A pristine
environment of the same release runs DFLASH as the baseline, and DDTREE there is an unknown algorithm.

No stand-in: the worker class is imported for real (0.5.23's v2 DFlash worker imports on CPU).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.20"
MODELS = REPO / "tests" / "data" / "models"
RELEASE = "0.5.23"
PROBE_TAG = "PROBE-JSON:"
# The release each v2 family is probed on (its newest): one probe per family.
TARGETS = {"0.5.23": "sglang-0.5.20", "0.5.19": "sglang-0.5.19", "0.5.18": "sglang-0.5.18",
           "0.5.17": "sglang-0.5.17", "0.5.16": "sglang-0.5.16", "0.5.15.post1": "sglang-0.5.15",
           "0.5.14": "sglang-0.5.14"}
# Cases whose option or model the older release lacks, and what that release answers instead
# (SGLang's own error, DDTREE or not: 0.5.19 has no draft sink or block verification, and its
# ModelConfig cannot read a Mamba-1 config at all, with DFLASH as with DDTREE).
_NO_SINK = {  # no draft sink, no block verification (0.5.19 and older)
    "draft-sink": "unexpected keyword argument 'speculative_draft_sink_size'",
    "block-verification": "unexpected keyword argument 'speculative_use_block_verification'",
}
_NO_MAMBA1 = {  # ModelConfig cannot read a Mamba-1 config, DFLASH as DDTREE
    "hybrid-mamba1": "'MambaConfig' object has no attribute 'num_attention_heads'",
    "hybrid-falcon-mamba": "'FalconMambaConfig' object has no attribute 'num_attention_heads'",
}
# (The linear-attention verify backend and ReplaySSM arrive with 0.5.17.)
_NO_LINEAR_VERIFY = {
    "hybrid-kda-flashinfer-verify": "unexpected keyword argument 'linear_attn_verify_backend'",
    "hybrid-replayssm-spec": "unexpected keyword argument 'enable_linear_replayssm_spec'",
}
# The release's own gate (ServerArgs, before any speculative resolution) wants an SM100 GPU
# for trtllm_mha prefill; on the SM90 stand-in it refuses first, DDTREE or DFLASH.
_TRTLLM_SM100 = {"attention-trtllm-mha": "TRTLLM MHA backend for prefill is only supported on Blackwell"}
_BEFORE_0_5_17 = {**_NO_SINK, **_NO_LINEAR_VERIFY, **_NO_MAMBA1, **_TRTLLM_SM100}
_BEFORE_0_5_16 = {
    **_BEFORE_0_5_17,
    # (No Inkling config in the release: neither SGLang nor Transformers can read the folder.)
    "hybrid-inkling": "model type `inkling_model` but Transformers does not recognize",
}
# Cases served on later releases that ddtree_hybrid refuses, by name, where the release has no
# tree path (0.5.14 - 0.5.15.post1: KDAAttnBackend has no verify path at all).
_NO_KDA_VERIFY = {"hybrid-kda": "has no tree verify path"}
REFUSED_THERE = {"0.5.14": _NO_KDA_VERIFY, "0.5.15.post1": _NO_KDA_VERIFY}
ELSEWHERE = {
    "0.5.14": _BEFORE_0_5_16,
    "0.5.15.post1": _BEFORE_0_5_16,
    "0.5.16": _BEFORE_0_5_17,
    "0.5.17": {**_NO_SINK, **_NO_MAMBA1, **_TRTLLM_SM100},
    "0.5.18": {**_NO_SINK, **_NO_MAMBA1, **_TRTLLM_SM100},
    "0.5.19": {**_NO_SINK, **_NO_MAMBA1},
}

# Cases a release cannot express, and why (skipped there, with the reason).
UNEXPRESSIBLE = {
    version: {"hybrid-registered": (
        f"sglang {version}'s register_linear_attn_model has no config predicate (0.5.18+): a "
        "registration matches a whole config class, so registering the marked Llama config "
        "would turn every Llama target of the other cases hybrid")}
    for version in ("0.5.14", "0.5.15.post1")
}

pytestmark = pytest.mark.sglang_env

# An H200 as SGLang would measure it (STAND-IN for get_device_memory_capacity, see the probe),
# Qwen's vocabulary, and the memory fraction SGLang leaves for the KV pool on such a GPU.
_H200 = {"_device_memory_mib": 143_771, "mem_fraction_static": 0.85,
         "json_model_override_args": '{"vocab_size": 151936}'}

# name -> (ServerArgs keyword overrides, expected: dict of resolved fields, or the error text
# that must appear in the one-line refusal)
CASES = {
    "default": ({}, {"speculative_ddtree_budget": 64, "speculative_num_draft_tokens": 65,
                     "speculative_eagle_topk": 8, "speculative_ddtree_topk": 8,
                     "speculative_dflash_block_size": 16, "max_running_requests": 48}),
    "budget32-topk4": ({"speculative_ddtree_budget": 32, "speculative_ddtree_topk": 4},
                       {"speculative_num_draft_tokens": 33, "speculative_eagle_topk": 4,
                        "speculative_dflash_block_size": 16}),
    "smallest-budget-for-block": ({"speculative_ddtree_budget": 15},
                                  {"speculative_num_draft_tokens": 16, "speculative_dflash_block_size": 16}),
    "topk-above-budget-clamped": ({"speculative_ddtree_budget": 4, "speculative_ddtree_topk": 10,
                                   "speculative_dflash_block_size": 4},
                                  {"speculative_num_draft_tokens": 5, "speculative_eagle_topk": 4,
                                   "speculative_dflash_block_size": 4}),
    "block-flag": ({"speculative_dflash_block_size": 8, "speculative_ddtree_budget": 16},
                   {"speculative_num_draft_tokens": 17, "speculative_dflash_block_size": 8}),
    "consistent-width-flag": ({"speculative_num_draft_tokens": 65}, {"speculative_num_draft_tokens": 65}),
    "fa3": ({"attention_backend": "fa3"}, {"attention_backend": "fa3"}),
    # Hybrid targets with a tree path: no flag (ddtree_hybrid; no radix cache: SGLang's Mamba
    # extra buffer needs a GPU platform, DDTREE or not).
    "hybrid-gdn": ({"model": "tiny-qwen3-next", "disable_radix_cache": True},
                   {"speculative_num_draft_tokens": 65, "speculative_eagle_topk": 8}),
    "hybrid-mamba2": ({"model": "tiny-nemotron-h", "disable_radix_cache": True},
                      {"speculative_num_draft_tokens": 65, "speculative_eagle_topk": 8}),
    "hybrid-kda": ({"model": "tiny-kimi-linear", "disable_radix_cache": True},
                   {"speculative_num_draft_tokens": 65, "speculative_eagle_topk": 8}),
    # SGLang's validation asserts on mixed chunk for an algorithm without it: DDTREE turns it
    # off (logged), as SGLang does for UNO.
    "mixed-chunk-off": ({"enable_mixed_chunk": True}, {"enable_mixed_chunk": False}),
    "largest-budget": ({"speculative_ddtree_budget": 1023}, {"speculative_num_draft_tokens": 1024}),
    "chain-at-block": ({"speculative_ddtree_budget": 15, "speculative_ddtree_topk": 1},
                       {"speculative_num_draft_tokens": 16, "speculative_eagle_topk": 1}),
    # max_running_requests by budget x vocab (the v1 rule, ddtree_utils.size_running_batch):
    # a STAND-IN device memory query (an H200's 143,771 MiB; the GPU's own query cannot run
    # here) and a 151,936-token vocabulary (Qwen's), through --json-model-override-args.
    "memory-64": (dict(_H200, speculative_ddtree_budget=64), {"max_running_requests": 48}),
    "memory-256": (dict(_H200, speculative_ddtree_budget=256), {"max_running_requests": 14}),
    "memory-1023": (dict(_H200, speculative_ddtree_budget=1023), {"max_running_requests": 3}),
    "memory-explicit-fits": (dict(_H200, speculative_ddtree_budget=256, max_running_requests=4),
                             {"max_running_requests": 4}),
    "memory-explicit-at-cap": (dict(_H200, speculative_ddtree_budget=256, max_running_requests=14),
                               {"max_running_requests": 14}),
    # refusals
    "budget-0": ({"speculative_ddtree_budget": 0}, "--speculative-ddtree-budget must be an integer >= 1, got 0"),
    # The ABI (ddtree_lineage.abi_problem): one line naming the three flags and a fix.
    "budget-1024": ({"speculative_ddtree_budget": 1024}, "gives a verify width of 1025, over the 1024"),
    "budget-1025": ({"speculative_ddtree_budget": 1025}, "use e.g. --speculative-ddtree-budget 1023 "
                    "--speculative-ddtree-topk 8 --speculative-dflash-block-size 16"),
    "capacity": ({"speculative_ddtree_budget": 64, "speculative_ddtree_topk": 2,
                  "speculative_dflash_block_size": 6}, "exceeds the 62 distinct draft prefixes"),
    "chain-past-block": ({"speculative_ddtree_budget": 32, "speculative_ddtree_topk": 1},
                         "exceeds the 15 distinct draft prefixes that --speculative-ddtree-topk 1"),
    "topk-above-vocab": ({"speculative_ddtree_budget": 1000, "speculative_ddtree_topk": 600},
                         "--speculative-ddtree-topk 600 exceeds the vocabulary (512 tokens)"),
    "memory-explicit-too-many": (dict(_H200, speculative_ddtree_budget=256, max_running_requests=48),
                                 "--max-running-requests 48 cannot fit DDTREE's verify"),
    "memory-hopeless": (dict(_H200, speculative_ddtree_budget=1023, mem_fraction_static=0.999),
                        "MB of verify buffers per request, more than the"),
    # (On an SM90 GPU: a STAND-IN platform fact, SGLang's own trtllm_mha gate needs one.)
    "attention-trtllm-mha": ({"attention_backend": "trtllm_mha", "_platform": {"is_sm90": True}},
                             "attention backend 'trtllm_mha'"),
    "topk-0": ({"speculative_ddtree_topk": 0}, "--speculative-ddtree-topk must be an integer >= 1, got 0"),
    "block-above-width": ({"speculative_ddtree_budget": 8}, "the draft block 16 exceeds the verify width 9"),
    "block-1": ({"speculative_dflash_block_size": 1, "speculative_ddtree_budget": 4}, "the draft block must be >= 2"),
    # Hybrid kinds, backends and settings without a tree path: one line naming the config class.
    "hybrid-lightning": ({"model": "tiny-bailing-lightning", "disable_radix_cache": True},
                         "(BailingHybridConfig, Lightning linear attention (seg_la)): SGLang's "
                         "LightningAttentionBackend has no tree path"),
    "hybrid-short-conv": ({"model": "tiny-lfm2", "disable_radix_cache": True},
                          "(Lfm2Config, short convolution): SGLang's ShortConvAttnBackend has no tree path"),
    # Every refused kind from a tiny real config (issue 30, 4): Mamba-1 (and Falcon-Mamba) must
    # not be served as Mamba2, Inkling's short convolution, a registered linear attention.
    "hybrid-mamba1": ({"model": "tiny-mamba", "disable_radix_cache": True},
                      "(MambaConfig, Mamba-1): SGLang's Mamba2AttnBackend (MambaMixer1) has no tree "
                      "path (MambaMixer1 has no speculative target-verify path)"),
    "hybrid-falcon-mamba": ({"model": "tiny-falcon-mamba", "disable_radix_cache": True},
                            "(FalconMambaConfig, Mamba-1): SGLang's Mamba2AttnBackend (MambaMixer1) "
                            "has no tree path"),
    "hybrid-inkling": ({"model": "tiny-inkling", "disable_radix_cache": True},
                       "(InklingModelConfig, Inkling short convolution): SGLang's "
                       "InklingShortConvAttnBackend has no tree path"),
    # (A STAND-IN registration: register_linear_attn_model, as an out-of-tree model would call
    # it, for configs carrying the probe's marker; see _register_linear_attn.)
    "hybrid-registered": ({"model": "tiny-registered-linear", "disable_radix_cache": True},
                          "(LlamaConfig, registered linear attention): SGLang's "
                          "register_linear_attn_model() backend has no tree path"),
    "hybrid-kda-flashinfer-verify": ({"model": "tiny-kimi-linear", "disable_radix_cache": True,
                                     "linear_attn_verify_backend": "flashinfer"},
                                    "(KimiLinearConfig, Kimi Delta Attention): the KDA verify backend "
                                    "flashinfer has no tree path"),
    "hybrid-replayssm-spec": ({"model": "tiny-qwen3-next", "disable_radix_cache": True,
                              "enable_linear_replayssm_spec": True},
                             "--enable-linear-replayssm-spec verifies a linear chain only"),
    "hybrid-page-size": ({"model": "tiny-qwen3-next", "disable_radix_cache": True, "page_size": 16},
                         "--page-size 16: the recurrent tree commit is proven at page size 1 only"),
    "attention-torch-native": ({"attention_backend": "torch_native"}, "attention backend 'torch_native'"),
    "width-flag-mismatch": ({"speculative_num_draft_tokens": 16}, "--speculative-num-draft-tokens is the verify width"),
    "eagle-topk-mismatch": ({"speculative_eagle_topk": 2}, "use --speculative-ddtree-topk"),
    "disaggregation": ({"disaggregation_mode": "decode"}, "does not support prefill/decode disaggregation"),
    # EAGLE-family verify options that would change what DDTREE samples, or DFlash machinery the
    # tree worker does not carry: refused at resolution, before any model loads (issue 30, 3).
    "rejection-sampling": ({"speculative_use_rejection_sampling": True},
                           "--speculative-use-rejection-sampling is EAGLE's top-K 1 chain sampler"),
    "accept-threshold-single": ({"speculative_accept_threshold_single": 0.6},
                                "--speculative-accept-threshold-single 0.6 would accept draft "
                                "tokens by a threshold"),
    "accept-threshold-acc": ({"speculative_accept_threshold_acc": 0.5},
                             "--speculative-accept-threshold-acc 0.5 would accept draft tokens"),
    "draft-window": ({"speculative_draft_window_size": 64},
                     "--speculative-draft-window-size 64 (DFlash's compact draft cache) is not "
                     "supported"),
    # (SGLang's own check, before DDTREE's: a sink needs a window, which DDTREE refuses above.)
    "draft-sink": ({"speculative_draft_sink_size": 4}, "requires --speculative-draft-window-size"),
    "dp-attention": ({"enable_dp_attention": True, "dp_size": 2, "tp_size": 2,
                      "enable_dp_lm_head": True},
                     "DDTREE does not support data-parallel attention"),
    # (A STAND-IN platform fact: ROCm, where EAGLE's verify commits the argmax when sampling.)
    "rocm": ({"_platform": {"is_hip": True}}, "DDTREE is not supported on ROCm"),
    "selector-draft": ({"draft": "tiny-dflash2-draft"},
                       "is a DFlash2DraftModel (a candidate-selector head)"),
    "lilicorr-draft": ({"draft": "tiny-lilicorr-draft"},
                       "is a LiLiCorrDraftModel (a LiLiCorr reranking head)"),
    "domino-draft": ({"draft": "tiny-domino-draft"}, "is a Domino draft (projector_type domino)"),
    # (SGLang's generic check, which DDTREE does not pass: refused by SGLang in one line.)
    "block-verification": ({"speculative_use_block_verification": True},
                           "--speculative-use-block-verification only supports"),
    # The budget schedule (issue 30, 1): every entry held to the ABI and the memory rule.
    "schedule-unsorted": ({"speculative_ddtree_budget_schedule": "1:64/8,32:16/2,8:32/4"},
                          "entry '8:32/4': its batch threshold 8 comes after 32: thresholds must "
                          "rise; use --speculative-ddtree-budget-schedule 1:64/8,8:32/4,32:16/2"),
    "schedule-duplicate": ({"speculative_ddtree_budget_schedule": "1:64,8:32,8:16"},
                           "entry '8:16': repeats the batch threshold 8; use "
                           "--speculative-ddtree-budget-schedule 1:64/8,8:32/8"),
    "schedule-first": ({"speculative_ddtree_budget_schedule": "4:64,16:16"},
                       "entry '4:64': the first entry starts at batch 4"),
    "schedule-garbage": ({"speculative_ddtree_budget_schedule": "1:64,x"},
                         "entry 'x': is not THRESHOLD:BUDGET[/TOPK] or THRESHOLD:chain"),
    "schedule-too-many": ({"speculative_ddtree_budget_schedule":
                           ",".join(f"{t}:{b}" for t, b in zip(range(1, 10), range(64, 15, -6)))},
                          "a schedule holds at most 8 entries"),
    "schedule-abi-width": ({"speculative_ddtree_budget_schedule": "1:1024,8:64"},
                           "entry '1:1024/8': its verify width is over the 1024 SGLang's CUDA "
                           "tree builder takes; use --speculative-ddtree-budget-schedule "
                           "1:1023/8,8:64/8"),
    "schedule-abi-capacity": ({"speculative_ddtree_budget_schedule": "1:64/2,8:5",
                               "speculative_dflash_block_size": 6},
                              "entry '1:64/2': budget 64 exceeds the distinct draft prefixes that "
                              "top-K 2 and the draft block 6 allow (EAGLE's CUDA tree verify "
                              "carries no padding); use --speculative-ddtree-budget-schedule "
                              "1:62/2,8:5/5"),
    "schedule-block": ({"speculative_ddtree_budget_schedule": "1:64,8:8/2"},
                       "entry '8:8/2': the draft block 16 exceeds its verify width 9"),
    "schedule-unreached": ({"speculative_ddtree_budget_schedule": "1:64,64:chain",
                            "max_running_requests": 48},
                           "entry '64:15/1': it starts at batch 64, above --max-running-requests "
                           "48, so it would never run; use --speculative-ddtree-budget-schedule 1:64/8"),
    "schedule-with-budget": ({"speculative_ddtree_budget_schedule": "1:64", "speculative_ddtree_budget": 32},
                             "--speculative-ddtree-budget 32 and --speculative-ddtree-budget-schedule"),
    "schedule-memory": (dict(_H200, speculative_ddtree_budget_schedule="1:256/8,16:64/4"),
                        "entry '1:256/8': budget 256 x vocab 151936 fits 14 requests' verify "
                        "buffers"),
    "schedule-memory-explicit": (dict(_H200, speculative_ddtree_budget_schedule="1:128/8,8:64/4",
                                      max_running_requests=64),
                                 "entry '8:64/4': budget 64 x vocab 151936 fits 57 requests' verify "
                                 "buffers (half the memory left outside --mem-fraction-static), but "
                                 "the entry serves up to --max-running-requests 64"),
    # Accepted schedules: the widths, the caps per entry, max_running_requests.
    "schedule": ({"speculative_ddtree_budget_schedule": "1:128/8,8:64/4,32:16/2,64:chain"},
                 {"speculative_ddtree_budget": 128, "speculative_num_draft_tokens": 129,
                  "speculative_eagle_topk": 8, "speculative_ddtree_topk": 8,
                  "speculative_ddtree_budget_schedule": "1:128/8,8:64/4,32:16/2,64:15/1",
                  "max_running_requests": 64}),
    "schedule-h200": (dict(_H200, speculative_ddtree_budget_schedule="1:128/8,8:64/4,32:16/2,64:chain"),
                      {"speculative_ddtree_budget_schedule": "1:128/8,8:64/4,32:16/2,64:15/1",
                       "max_running_requests": 64}),
    "schedule-h200-cap": (dict(_H200, speculative_ddtree_budget_schedule="1:512/8,2:256/8"),
                          {"max_running_requests": 14, "speculative_num_draft_tokens": 513}),
    "schedule-hybrid": ({"model": "tiny-qwen3-next", "disable_radix_cache": True,
                         "speculative_ddtree_budget_schedule": "1:32/4,4:chain"},
                        {"speculative_num_draft_tokens": 33, "speculative_eagle_topk": 4,
                         "speculative_ddtree_budget_schedule": "1:32/4,4:15/1"}),
    # Mamba2 at several widths: its mixer strides the SSM states by the step's width.
    "schedule-hybrid-mamba2": ({"model": "tiny-nemotron-h", "disable_radix_cache": True,
                                "speculative_ddtree_budget_schedule": "1:32/4,4:16/2"},
                               "(NemotronHConfig, Mamba2): a budget schedule of several verify "
                               "widths (17, 33): SGLang's MambaMixer2 strides the intermediate SSM "
                               "states by the step's width"),
    "schedule-hybrid-mamba2-one-width": ({"model": "tiny-nemotron-h", "disable_radix_cache": True,
                                          "speculative_ddtree_budget_schedule": "1:32/4,4:32/2"},
                                         {"speculative_num_draft_tokens": 33,
                                          "speculative_ddtree_budget_schedule": "1:32/4,4:32/2"}),
    # What SGLang itself turns off for a non-EAGLE algorithm, with a log line: harmless.
    "adaptive-off": ({"speculative_adaptive": True}, {"speculative_adaptive": False}),
}


def _gpu_check_cases() -> dict:
    """The GPU check's configurations (scripts/ddtree_gpu_check/ddtree.py): those it feeds
    SGLang's tree kernel must be what the plugin resolves, exactly; those it shows refused must
    be refused with abi_problem's line."""
    for folder in ("scripts", "payload"):
        if str(REPO / folder) not in sys.path:
            sys.path.insert(0, str(REPO / folder))
    import ddtree_lineage as dl
    from ddtree_gpu_check import ddtree as dd

    def flags(cfg):
        return {"speculative_ddtree_budget": cfg.budget, "speculative_ddtree_topk": cfg.topk,
                "speculative_dflash_block_size": cfg.block}

    cases = {f"gpu-check {cfg.label}": (flags(cfg), {
        "speculative_ddtree_budget": cfg.budget, "speculative_num_draft_tokens": cfg.n,
        "speculative_eagle_topk": cfg.topk, "speculative_dflash_block_size": cfg.block})
        for cfg in dd.configs()}
    cases.update({f"gpu-check refused {cfg.label}": (
        flags(cfg), dl.abi_problem(cfg.budget, cfg.topk, cfg.block))
        for cfg in dd.refused_configs()})
    return cases


CASES.update(_gpu_check_cases())
REFUSALS = [name for name, (_, want) in CASES.items() if isinstance(want, str)]
ACCEPTED = [name for name, (_, want) in CASES.items() if isinstance(want, dict)]


def _family_overlay(version: str, family: Path = FAMILY) -> dict[str, bytes]:
    from ddtree_deploy.sandbox import pristine_files

    from ddtree_deploy.engine.check import check_series
    from ddtree_deploy.engine.series import load_family

    series = load_family(family)
    wheel = pristine_files(version)
    report = check_series(series, {p: wheel.get(p) for p in series.touched_paths()})
    assert report.ok, report.to_json()
    return {path: pf.patched for path, pf in report.patched.items()}


def _probe(env, what: str, *args: str) -> dict:
    from ddtree_deploy.sandbox import run_python

    run = run_python(env, [__file__, what, str(MODELS), *args], timeout=900)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(PROBE_TAG)]
    assert run.returncode == 0 and lines, (
        f"probe {what} failed (rc {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len(PROBE_TAG):])


@pytest.fixture(scope="module", params=list(TARGETS))
def release(request) -> str:
    if os.environ.get("DDTREE_V2_HOST_ENV") and request.param != RELEASE:
        pytest.skip("the mutant runner's one env is 0.5.23's")
    return request.param


@pytest.fixture(scope="module")
def patched_env(tmp_path_factory, release):
    from ddtree_deploy.sandbox import make_host_env

    reuse = os.environ.get("DDTREE_V2_HOST_ENV")  # the mutant runner's one env
    family = REPO / "patches" / TARGETS[release]
    return make_host_env(Path(reuse) if reuse else tmp_path_factory.mktemp("v2") / "patched",
                         overlay=_family_overlay(release, family), version=release,
                         reuse=bool(reuse), read_only=not reuse)


@pytest.fixture(scope="module")
def resolved(patched_env):
    return _probe(patched_env, "resolve", json.dumps({n: c for n, (c, _) in CASES.items()}))


@pytest.mark.parametrize("name", ACCEPTED)
def test_ddtree_resolves(resolved, release, name):
    got = resolved[name]
    refused = REFUSED_THERE.get(release, {}).get(name)
    if refused is not None:  # served on later releases; refused by name where SGLang has no path
        assert got.get("type") == "ValueError" and refused in got["error"], got
        assert "\n" not in got["error"].strip(), got["error"]
        return
    assert "error" not in got, got
    want = CASES[name][1]
    assert {k: got["fields"][k] for k in want} == want
    fields = got["fields"]
    # Overlap scheduler ON, a tree verify of budget + 1, DFlash's draft block kept apart.
    assert fields["speculative_algorithm"] == "DDTREE"
    assert fields["disable_overlap_schedule"] is False
    assert fields["speculative_num_draft_tokens"] == fields["speculative_ddtree_budget"] + 1
    assert fields["speculative_num_steps"] == 1
    assert fields["enable_mixed_chunk"] is False
    # The helpers the worker reads, on the record and on the published runtime Spec bag.
    for where in ("helpers_record", "helpers_spec_bag"):
        assert got[where] == {"budget": fields["speculative_ddtree_budget"],
                              "topk": fields["speculative_eagle_topk"],
                              "block": fields["speculative_dflash_block_size"]}, where
    # One number, two meanings: the target verifies budget + 1, the draft runs its block.
    assert got["target_verify_width"] == fields["speculative_num_draft_tokens"]
    assert got["draft_verify_width"] == fields["speculative_dflash_block_size"]
    # The decode over-allocation (hunk 0005): a draft block of lag + the step's window.
    block, width = fields["speculative_dflash_block_size"], fields["speculative_num_draft_tokens"]
    assert got["decode_reserve"] == block + max(width, block) <= 2 * width
    # The resolved worker tree-verifies.
    assert got["worker"] == "sglang.srt.speculative.ddtree_worker_v2.DDTreeWorkerV2"
    assert got["tree_verify"] is True


@pytest.mark.parametrize("name", REFUSALS)
def test_ddtree_refuses_with_one_line(resolved, release, name):
    why = UNEXPRESSIBLE.get(release, {}).get(name)
    if why is not None:
        pytest.skip(why)
    got = resolved[name]
    assert "error" in got, f"{name} was accepted: {got.get('fields')}"
    instead = ELSEWHERE.get(release, {}).get(name)
    if instead is not None:  # the release itself lacks the option or the model kind
        assert instead in got["error"], got["error"]
        return
    assert got["type"] == "ValueError"
    assert "\n" not in got["error"].strip(), got["error"]
    assert CASES[name][1] in got["error"], got["error"]
    # A schedule refusal names a schedule that works: the probe resolved it the same way.
    if "use --speculative-ddtree-budget-schedule" in got["error"]:
        assert "suggestion" in got, got["error"]
        assert "error" not in got["suggestion"], got["suggestion"]


def test_ddtree_is_dflash_everywhere_but_its_own_decisions(resolved):
    ident = resolved["default"]["identity"]
    # Every predicate answers as DFLASH does, except the one DDTREE decides itself.
    differs = {name: v for name, v in ident["predicates"].items() if v != ident["dflash"][name]}
    # (0.5.18 and older have no supports_mixed_chunk predicate: DDTREE's resolution turns
    # mixed chunk off there, case mixed-chunk-off.)
    own = {"supports_mixed_chunk": False} if "supports_mixed_chunk" in ident["dflash"] else {}
    assert differs == own, differs
    assert ident["predicates"]["is_dflash"] is True
    if "is_dflash_family" in ident["dflash"]:  # (0.5.16+)
        assert ident["predicates"]["is_dflash_family"] is True
    # The scheduler calls these on the algorithm; a bare CustomSpecAlgo lacks them.
    assert ident["has_create_future_map"] and ident["need_topk"] is False
    assert ident["needs_hidden_relay"] is False  # hunk 0003
    assert ident["from_string"] == "CustomSpecAlgo('DDTREE')"
    # SpeculativeAlgorithm.DDTREE names it (as the v1 families' enum member does), while the
    # enum's members stay SGLang's own.
    assert ident["attribute_is_registered"] is True and "DDTREE" not in ident["members"]


def test_cuda_graph_capture_verifies_the_target_as_eagle_and_drafts_as_dflash(resolved):
    # Hunk 0004, through SGLang's own DecodeCudaGraphRunner.get_spec_info (see the probe).
    cap = resolved["default"]["capture"]
    assert cap["target"] == {"type": "EagleVerifyInput", "mask_is_buffer": True, "width": 65, "topk": 8}
    # The draft keeps DFlash's mask-free block, as DFLASH's own target verify would be.
    assert cap["draft"] == {"type": "DFlashVerifyInput", "mask_is_buffer": False, "width": 16, "topk": 1}
    assert cap["dflash_target"]["type"] == "DFlashVerifyInput" and not cap["dflash_target"]["mask_is_buffer"]


def test_a_spawned_process_has_ddtree_registered(resolved):
    # The scheduler and data-parallel children are spawned: a fresh interpreter that only
    # unpickles the resolved args and imports spec_info resolves DDTREE (hunk 0002).
    got = resolved["_spawn"]
    assert got == {"algorithm": "CustomSpecAlgo('DDTREE')", "worker": "DDTreeWorkerV2", "width": 65}


def test_a_worker_class_without_the_tree_marker_is_refused(resolved):
    got = resolved["_no_marker"]
    assert got["refused"], got
    assert "DFlashWorkerV2, which does not tree-verify" in got["error"]
    assert "\n" not in got["error"]


def test_the_abi_refusal_names_the_three_flags(resolved):
    for name in ("budget-1024", "capacity", "chain-past-block", "topk-above-vocab"):
        for flag in ("--speculative-ddtree-budget", "--speculative-ddtree-topk",
                     "--speculative-dflash-block-size"):
            assert flag in resolved[name]["error"], (name, flag)


def test_the_server_info_report_hook_is_applied_in_the_scheduler(resolved):
    # The scheduler module imports spec_info (so the plugin) at its top, then its process
    # calls load_plugins(), which applies the plugin's AFTER hook on get_internal_state.
    got = resolved["_report_hook"]
    assert got == {"before_load_plugins": False, "wrapped": True, "hook": "_internal_state_report"}


def test_launch_server_help_lists_the_flags(patched_env):
    from ddtree_deploy.sandbox import run_python

    run = run_python(patched_env, ["-m", "sglang.launch_server", "--help"], timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for flag in ("--speculative-ddtree-budget", "--speculative-ddtree-topk"):
        assert flag in run.stdout, flag
    # Hybrid targets need no flag on the v2 family: the unsafe gate of the v1 families is gone.
    assert "--speculative-ddtree-allow-hybrid-unsafe" not in run.stdout


def test_pristine_release_baseline(tmp_path, release):
    # The same probe on the unpatched release: DFLASH resolves as DFlash (verify width = the
    # block, topk 1) and DDTREE is unknown, so the cases above measure the family.
    from ddtree_deploy.sandbox import make_host_env

    env = make_host_env(tmp_path / "pristine", version=release, read_only=True)
    got = _probe(env, "resolve", json.dumps({"dflash": {"speculative_algorithm": "DFLASH"}, "ddtree": {}}))
    dflash = got["dflash"]["fields"]
    assert dflash["speculative_num_draft_tokens"] == 16 and dflash["speculative_eagle_topk"] == 1
    assert dflash["disable_overlap_schedule"] is False
    assert "Unknown speculative algorithm name: DDTREE" in got["ddtree"]["error"]


# ---------------------------------------------------------------------------
# The probe, run by the host interpreter: python test_v2_server_args.py resolve MODELS CASES


def _probe_resolve(models: Path, cases_json: str) -> dict:
    import logging

    logging.disable(logging.WARNING)
    get_spec, publish = _spec_bag_and_publish()

    try:
        from sglang.srt.speculative import ddtree_v2_plugin as plugin
    except ImportError:
        plugin = None
    out = {}
    from sglang.srt.utils import common

    measured = common.get_device_memory_capacity
    _register_linear_attn()
    for name, overrides in json.loads(cases_json).items():
        overrides = dict(overrides)
        device_mib = overrides.pop("_device_memory_mib", None)
        # STAND-IN for the GPU's memory query (no GPU here): the number SGLang would measure.
        common.get_device_memory_capacity = (
            measured if device_mib is None else (lambda device=None, _m=device_mib: _m))
        kwargs = dict(model_path=str(models / overrides.pop("model", "tiny-llama")),
                      speculative_algorithm="DDTREE",
                      speculative_draft_model_path=str(models / overrides.pop(
                          "draft", "tiny-dflash-draft")),
                      device="cuda", skip_tokenizer_init=True)
        kwargs.update(overrides)
        # STAND-IN platform facts (the GPU generation SGLang's own checks ask about).
        platform = _platform(**kwargs.pop("_platform", {}))
        try:
            with platform:
                args = _resolved_args(**kwargs)
        except Exception as exc:  # the refusal, as the launcher would print it
            out[name] = {"type": type(exc).__name__, "error": str(exc)}
            works = str(exc).rpartition("use --speculative-ddtree-budget-schedule ")[2]
            if works != str(exc):  # the schedule the refusal names, resolved the same way
                kwargs["speculative_ddtree_budget_schedule"] = works.strip().rstrip(".")
                try:
                    with _platform(**kwargs.pop("_platform", {})):
                        again = _resolved_args(**kwargs)
                    out[name]["suggestion"] = {"schedule": kwargs[
                        "speculative_ddtree_budget_schedule"], "resolved": _fields_of(again)[
                        "speculative_ddtree_budget_schedule"]}
                except Exception as exc2:  # noqa: BLE001
                    out[name]["suggestion"] = {"schedule": works, "error": str(exc2)}
            continue
        fields = _fields_of(args)
        keep = ("speculative_algorithm", "speculative_ddtree_budget", "speculative_ddtree_topk",
                "speculative_num_draft_tokens", "speculative_eagle_topk", "speculative_num_steps",
                "speculative_dflash_block_size", "disable_overlap_schedule", "enable_mixed_chunk",
                "attention_backend", "max_running_requests", "mem_fraction_static",
                "speculative_ddtree_budget_schedule", "speculative_adaptive")
        result = {"fields": {k: fields.get(k) for k in keep}}
        if fields["speculative_algorithm"] == "DDTREE":
            result.update(_ddtree_facts(args, plugin, get_spec, publish))
        out[name] = result
    common.get_device_memory_capacity = measured
    if plugin is not None:  # the patched release: more facts from this process
        out["_spawn"] = _probe_spawn(models)
        out["_report_hook"] = _probe_report_hook(models)
        out["_no_marker"] = _probe_no_marker(models)
    return out


def _spec_bag_and_publish():
    """(get_spec, publish): the runtime Spec bag and the scheduler's publication of the resolved
    args (0.5.18+). 0.5.14 - 0.5.15.post1 have neither: processes read the global ServerArgs,
    which the scheduler sets (``set_global_server_args_for_scheduler``)."""
    try:
        from sglang.srt.runtime_context import get_spec, publish
    except ImportError:
        from sglang.srt.server_args import (
            get_global_server_args,
            set_global_server_args_for_scheduler,
        )

        return get_global_server_args, lambda args, role: set_global_server_args_for_scheduler(args)
    return get_spec, publish


def _width_question(algo):
    """The per-request width question under the name this release's runners ask it: 0.5.16+
    ``get_num_tokens_per_req_for_target_verify``, before ``..._per_bs_...``."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    name = "get_num_tokens_per_req_for_target_verify"
    if not hasattr(SpeculativeAlgorithm.DFLASH, name):
        name = "get_num_tokens_per_bs_for_target_verify"
    return getattr(algo, name)


def _resolved_args(**kwargs):
    """ServerArgs resolved by SGLang's own pipeline: ``resolve_once`` from 0.5.19 on; before it
    (0.5.18 and older) construction itself resolves (``__post_init__``)."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(**kwargs)
    if callable(getattr(args, "resolve_once", None)):
        args.resolve_once()
    return args


def _fields_of(args) -> dict:
    """The resolved fields: ``resolved_dict`` from 0.5.19 on, the fields themselves before
    (resolution assigned them)."""
    if callable(getattr(args, "resolved_dict", None)):
        return args.resolved_dict()
    import dataclasses

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}


def _platform(**facts):
    """STAND-IN platform facts (no GPU here): SGLang's ``override_platform`` from 0.5.19 on.
    Before it there is no platform record, so the fact is answered where it is asked, for the
    block: ROCm where DDTREE's resolution asks (its ``_is_hip``, which on 0.5.18 calls
    ``utils.common.is_hip``: replacing that one for the whole of ServerArgs' construction makes
    0.5.18 take its ROCm paths and fail on their environment), SM90 where ServerArgs' own
    trtllm_mha gate asks (``server_args.is_sm90_supported``)."""
    try:
        from sglang.srt.runtime_context import override_platform
    except ImportError:
        pass
    else:
        return override_platform(**facts)
    import contextlib
    import importlib
    from unittest import mock

    # (Imported only when a fact is asked: the pristine release's probe has no plugin.)
    where = {"is_hip": ("sglang.srt.speculative.ddtree_v2_plugin", "_is_hip"),
             "is_sm90": ("sglang.srt.server_args", "is_sm90_supported")}
    stack = contextlib.ExitStack()
    for fact, value in facts.items():
        module, name = where[fact]
        stack.enter_context(mock.patch.object(importlib.import_module(module), name,
                                              lambda *a, _v=value, **k: _v))
    return stack


def _register_linear_attn() -> None:
    """An out-of-tree linear-attention model, registered the way SGLang documents
    (``register_linear_attn_model``): Llama configs carrying the marker of the
    tiny-registered-linear folder, on the KDA backend's class name."""
    from sglang.srt.configs.linear_attn_model_registry import (
        LinearAttnModelSpec,
        register_linear_attn_model,
    )
    from transformers import LlamaConfig

    import dataclasses

    def marked(config) -> bool:
        return bool(getattr(config, "ddtree_test_registered_linear_attn", False))

    backend = "sglang.srt.layers.attention.linear.kda_backend.KDAAttnBackend"
    if "config_predicate" in {f.name for f in dataclasses.fields(LinearAttnModelSpec)}:
        register_linear_attn_model(LinearAttnModelSpec(
            config_class=LlamaConfig, backend_class_name=backend, config_predicate=marked))
        return

    # 0.5.17 and older match a registered model by isinstance(config, config_class) alone: the
    # same marker carried by the class's instance check (a plain LlamaConfig class would claim
    # every Llama config, the draft's and the dense targets' too).
    class MarkedLlama(type):
        def __instancecheck__(cls, config):
            return isinstance(config, LlamaConfig) and marked(config)

    register_linear_attn_model(LinearAttnModelSpec(
        config_class=MarkedLlama("LlamaConfig", (), {}), backend_class_name=backend))


def _ddtree_facts(args, plugin, get_spec, publish) -> dict:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_utils import spec_need_hidden_states

    def helpers(source):
        return {"budget": plugin.ddtree_budget(source), "topk": plugin.ddtree_topk(source),
                "block": plugin.ddtree_draft_block(source)}

    publish(args, role="scheduler")
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    worker = algo.create_worker(args)
    dflash = SpeculativeAlgorithm.DFLASH
    names = sorted(n for n in vars(SpeculativeAlgorithm)
                   if n.startswith(("is_", "supports_")) and callable(getattr(dflash, n, None)))
    return {
        "capture": _capture_facts(algo),
        "helpers_record": helpers(args),
        "helpers_spec_bag": helpers(get_spec()),
        "target_verify_width": _width_question(algo)(
            get_spec().speculative_num_draft_tokens, False),
        "draft_verify_width": _width_question(algo)(
            get_spec().speculative_num_draft_tokens, True),
        "decode_reserve": plugin.decode_reserve(get_spec()),
        "worker": f"{worker.__module__}.{worker.__qualname__}",
        "tree_verify": getattr(worker, "DDTREE_TREE_VERIFY", None),
        "identity": {
            "predicates": {n: getattr(algo, n)() for n in names},
            "dflash": {n: getattr(dflash, n)() for n in names},
            "has_create_future_map": callable(getattr(algo, "create_future_map", None)),
            "need_topk": algo.need_topk(),
            "needs_hidden_relay": spec_need_hidden_states(),
            "from_string": repr(algo),
            "attribute_is_registered": getattr(SpeculativeAlgorithm, "DDTREE", None) is algo,
            "members": [m.name for m in SpeculativeAlgorithm],
        },
    }


def _capture_facts(algo) -> dict:
    """DecodeCudaGraphRunner.get_spec_info (SGLang's code, hunk 0004 applied) on a STAND-IN
    runner object holding only what that method reads; the attention backend is the real
    TritonAttnBackend class (a bare instance: only its class name is read), one that
    DFlash captures without a mask."""
    from types import SimpleNamespace

    import torch
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    get_spec, _ = _spec_bag_and_publish()
    mask = torch.ones(64, dtype=torch.bool)

    def capture(spec_algorithm, is_draft_worker, width, server_args=None):
        runner = SimpleNamespace(
            model_runner=SimpleNamespace(
                spec_algorithm=spec_algorithm, is_draft_worker=is_draft_worker,
                attn_backend=object.__new__(TritonAttnBackend),
                model_config=SimpleNamespace(hidden_size=64), dtype=torch.float32, device="cpu",
                # (0.5.18 and older read the verify's top-K, 0.5.14 - 0.5.15.post1 the DFLASH
                # width too, from the runner's ServerArgs; the published Spec bag carries the
                # same resolved fields.)
                server_args=get_spec() if server_args is None else server_args),
            buffers=SimpleNamespace(custom_mask=mask), speculative_num_steps=1,
            speculative_num_draft_tokens=width, captured_req_width=width,
            _capture_ragged_verify_layout=lambda num_tokens: None)
        info = DecodeCudaGraphRunner.get_spec_info(runner, 4 * width)
        return {"type": type(info).__name__, "mask_is_buffer": info.custom_mask is mask,
                "width": info.draft_token_num, "topk": getattr(info, "topk", None)}

    spec = get_spec()
    target = capture(algo, False, spec.speculative_num_draft_tokens)
    # The draft's capture under the settings the worker builds the draft's graphs with
    # (ddtree_worker_v2._draft_settings_scope: on 0.5.14 - 0.5.15.post1 the draft runner's own
    # ServerArgs copy, at top-K 1 and the draft block), as DDTreeWorkerV2.init_cuda_graphs does.
    import copy

    from sglang.srt.speculative import ddtree_worker_v2

    draft_args = copy.deepcopy(spec) if not hasattr(spec, "override") else spec
    worker = SimpleNamespace(draft_model_runner=SimpleNamespace(server_args=draft_args),
                             block_size=spec.speculative_dflash_block_size)
    with ddtree_worker_v2._draft_settings_scope(worker):
        draft = capture(algo, True, spec.speculative_dflash_block_size, draft_args)
    return {
        "target": target,
        "draft": draft,
        "dflash_target": capture(SpeculativeAlgorithm.DFLASH, False, spec.speculative_dflash_block_size),
    }


def _probe_spawn(models: Path) -> dict:
    import multiprocessing
    import pickle


    args = _resolved_args(model_path=str(models / "tiny-llama"), speculative_algorithm="DDTREE",
                          speculative_draft_model_path=str(models / "tiny-dflash-draft"),
                          device="cuda", skip_tokenizer_init=True)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_spawned_child, (pickle.dumps(args),))


def _spawned_child(blob: bytes) -> dict:
    import pickle

    args = pickle.loads(blob)  # nothing here imports the plugin by name
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:  # 0.5.19+: what resolution declared; before, the fields themselves
        from sglang.srt.arg_groups.overrides import resolving_view
    except ImportError:
        cfg = args
    else:
        cfg = resolving_view(args)
    algo = SpeculativeAlgorithm.from_string(cfg.speculative_algorithm)
    return {"algorithm": repr(algo), "worker": algo.create_worker(args).__name__,
            "width": cfg.speculative_num_draft_tokens}


def _probe_no_marker(models: Path) -> dict:
    """DDTREE's create_worker with a factory that resolves to a worker class without the
    tree marker (DFlash's own v2 worker, which verifies a chain): refused."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    args = _resolved_args(model_path=str(models / "tiny-llama"), speculative_algorithm="DDTREE",
                          speculative_draft_model_path=str(models / "tiny-dflash-draft"),
                          device="cuda", skip_tokenizer_init=True)
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    factory = algo.factory
    algo.factory = lambda server_args: DFlashWorkerV2
    try:
        algo.create_worker(args)
        return {"refused": False}
    except RuntimeError as exc:
        return {"refused": True, "error": str(exc)}
    finally:
        algo.factory = factory


def _probe_report_hook(models: Path) -> dict:
    from sglang.srt.managers import scheduler
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    original = scheduler.Scheduler.__dict__["get_internal_state"]
    before = getattr(original, "__wrapped__", None) is not None
    load_plugins()
    now = scheduler.Scheduler.__dict__["get_internal_state"]
    hooks = HookRegistry._hooks.get("sglang.srt.managers.scheduler.Scheduler.get_internal_state", [])
    return {"before_load_plugins": before, "wrapped": getattr(now, "__wrapped__", None) is original,
            "hook": ",".join(h.__name__ for _, h, _ in hooks)}


if __name__ == "__main__":
    _probes = {"resolve": _probe_resolve}
    _result = _probes[sys.argv[1]](Path(sys.argv[2]), *sys.argv[3:])
    print(PROBE_TAG + json.dumps(_result, default=str), flush=True)
