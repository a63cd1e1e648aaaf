"""DDTree on hybrid targets (attention + Mamba2 / GDN / KDA layers) on the v2 families (SGLang
0.5.14 - 0.5.15.post1, 0.5.17 - 0.5.23): payload/ddtree_hybrid.py, the plugin's hybrid gate and the worker's start-up.

Three layers:

1. In this interpreter (no SGLang): the recurrent memory term of ``max_running_requests``
   (B + 1 intermediate states per running request) and its refusal text.
2. The sources, in each release's wheel (RELEASES): the SGLang lines the design rests on
   (the tree-aware commit that EAGLE's verify runs before moving the accepted path, the hybrid
   backend's ``topk > 1`` switch, the kinds without a tree path refusing it, the chain commit of
   DFlash the negative control uses, the host checks the probe answers).
3. In a host environment with the real release wheel plus its v2 family's series, once per
   family (0.5.23 with sglang-0.5.20, 0.5.19, 0.5.18 and 0.5.17 with their own, 0.5.15.post1
   with sglang-0.5.15, 0.5.14 with sglang-0.5.14; there KDA has no verify path and its case
   is the refusal by name)
   (tests/v2_hybrid_probe.py, run with ``SGLANG_USE_CPU_ENGINE=1 TRITON_INTERPRET=1``): for GDN,
   KDA and Mamba2 (SGLang's own MambaMixer2), the worker's whole decode step on SGLang's hybrid
   pools and backends with the Triton recurrent kernels in Triton's CPU interpreter: tokens ==
   plain greedy decoding of the
   same float64 model (requests finishing mid-path), the committed recurrent state after every
   step == a sequential run over the consumed tokens (GDN: also the prefix cache's track slot at
   every interval crossing), and the negative control (DFlash's chain
   commit, ``accept_len - 1``) leaving greedy; each run under a budget schedule of two entries
   (GDN: widths 11 and the chain's 5; KDA: 11 and 7; Mamba2: one width, two top-Ks), the commit
   seen at both;
   Mamba2 at two widths shown wrong (why ddtree_hybrid refuses it); the draft's backends built
   under topk 1; the memory term through SGLang's own argument resolution.

NAMED STAND-INS: see tests/v2_hybrid_probe.py (the target forward TinyHybrid, the
full-attention backend slot, the prefill, the track grid, the CUDA-only host lines on the way to
the Triton kernels; the kinds' layers and references: tests/v2_hybrid_kinds.py) and
tests/v2_worker_probe.py (the sgl_kernel CPU ops of EAGLE's verify, the draft model runner).

Slow: the probe interprets the Triton kernels in Python (about 2.5 CPU-minutes for the three
kinds, each with its negative control; 8 - 15 minutes wall on a loaded 2-core machine).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from ddtree_testkit import payload

REPO = Path(__file__).resolve().parent.parent.parent

hy = payload("ddtree_hybrid")  # payload/ddtree_hybrid.py, as SGLang imports it

PROBE = REPO / "tests" / "v2_hybrid_probe.py"
GPU_SCRIPT = REPO / "scripts" / "gpu_check_hybrid.py"
RELEASES = ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20",
            "0.5.21", "0.5.22", "0.5.23")
PROBE_RELEASE = "0.5.23"
# The release each v2 family's hybrid probe runs on (one probe per family).
PROBE_TARGETS = {"0.5.23": "sglang-0.5.20", "0.5.19": "sglang-0.5.19", "0.5.18": "sglang-0.5.18",
                 "0.5.17": "sglang-0.5.17", "0.5.16": "sglang-0.5.16", "0.5.15.post1": "sglang-0.5.15",
                 "0.5.14": "sglang-0.5.14"}


def _probe_module():
    spec = importlib.util.spec_from_file_location("v2_hybrid_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# 1. the memory term (pure)


def test_recurrent_cost_counts_one_state_per_tree_node_plus_the_persistent_slots():
    cost = hy.recurrent_verify_cost(10_000_000, 64, radix_cache=True)
    assert cost.verify_states == 65
    assert cost.states_per_request == 65 + hy.PERSISTENT_SLOTS_RADIX
    assert cost.bytes_per_request == 68 * 10_000_000
    no_radix = hy.recurrent_verify_cost(10_000_000, 256, radix_cache=False)
    assert no_radix.states_per_request == 257 + 1
    with pytest.raises(ValueError):
        hy.recurrent_verify_cost(1, 0, radix_cache=True)


def test_state_budget_is_the_mamba_share_of_the_static_pool():
    # SGLang's split: r / (1 + r) of the static pool for states, r = --mamba-full-memory-ratio.
    assert hy.state_budget_bytes(100e9, 0.8) == pytest.approx(80e9 * 0.9 / 1.9)
    assert hy.state_budget_bytes(100e9, 0.8, 1.0) == pytest.approx(40e9)


def test_running_requests_derived_kept_or_refused_with_the_numbers():
    cost = hy.recurrent_verify_cost(19_320_000, 64, radix_cache=True)  # Qwen3-Next, TP 4
    budget = 61e9
    assert hy.recurrent_request_cap(cost, budget) == 46
    assert hy.running_requests_for(None, cost, budget, default=48, what="x") == 46
    assert hy.running_requests_for(None, cost, 1e12, default=48, what="x") == 48
    assert hy.running_requests_for(30, cost, budget, default=48, what="x") == 30
    with pytest.raises(ValueError) as exc:
        hy.running_requests_for(48, cost, budget, default=48, what="the recurrent share")
    text = str(exc.value)
    assert "\n" not in text
    for part in ("--max-running-requests 48 cannot fit", "65 intermediate + 3 persistent",
                 "68 x 19.3 MB = 1.31 GB", "(61 GB) fits 46", "--max-running-requests <= 46"):
        assert part in text, (part, text)
    with pytest.raises(ValueError, match="cannot serve one request"):
        hy.running_requests_for(None, cost, 1e9, default=48, what="x")


def test_every_refused_kind_says_why_and_every_served_kind_has_a_backend():
    served = {k for k, kind in hy.KINDS.items() if kind.tree}
    assert served == {"gdn", "mamba2", "kda"}
    for kind in hy.KINDS.values():
        assert kind.backend and (kind.tree or kind.why), kind


def test_the_gdn_refusal_names_the_flashinfer_flags_as_sglang_falls_back():
    # SGLang's rule (initialize_linear_attn_config): an unset decode / prefill backend follows
    # --linear-attn-backend; either one on FlashInfer takes 0.5.14 - 0.5.15.post1's GDN verify.
    from types import SimpleNamespace

    def flags(base="triton", decode=None, prefill=None):
        return hy._gdn_flashinfer_flags(SimpleNamespace(
            linear_attn_backend=base, linear_attn_decode_backend=decode,
            linear_attn_prefill_backend=prefill))

    assert flags() == [] and flags(decode="triton", prefill="triton") == []
    assert flags(base="flashinfer") == ["--linear-attn-backend flashinfer"]
    assert flags(base="flashinfer", decode="triton") == ["--linear-attn-backend flashinfer"]
    assert flags(base="flashinfer", decode="triton", prefill="triton") == []
    assert flags(decode="flashinfer") == ["--linear-attn-decode-backend flashinfer"]
    assert flags(decode="flashinfer", prefill="flashinfer") == [
        "--linear-attn-decode-backend flashinfer", "--linear-attn-prefill-backend flashinfer"]


def test_module_text_reads_a_source_without_importing_it_and_is_empty_when_there_is_none():
    assert "def dumps(" in hy._module_text("json")
    assert hy._module_text("no_such_package.no_such_module") == ""
    assert hy._module_text("sys") == ""  # built in: no source file


# ---------------------------------------------------------------------------------------------
# 2. the sources the design rests on, in every release of the family

# 0.5.14 - 0.5.15.post1 keep the recurrent kernels under sglang/srt/layers/ (0.5.16 moved them
# to sglang/kernels/ops/).
SRT_MAMBA = "sglang/srt/layers/attention/mamba/"
# The releases before the tree verify was routed to Triton: their GDN backend verifies on
# FlashInfer whenever a FlashInfer decode or prefill backend is chosen, and their KDA backend
# has no verify path (a verify runs the prefill's chunk kernel over the tree as a chain).
BEFORE_TREE_ROUTING = ("0.5.14", "0.5.15", "0.5.15.post1")

# (file, [regex,...]) per fact; paths tried in order (0.5.23 moved some kernels).
SOURCE_FACTS = {
    # EAGLE's verify commits the last ACCEPTED node (accept_index[b, accept_lens - 1]) ...
    "commit_is_tree_aware": (
        ["sglang/srt/speculative/spec_utils.py"],
        [r"def commit_mamba_states_after_verify\(",
         r"accept_index\[req_idx, \(accept_lens - 1\)\.to\(torch\.int64\)\]\s*-\s*accept_indices_offset",
         r"attn_backend\.update_mamba_state_after_mtp_verify\("]),
    # ... from run_eagle_verify, before the accepted path is moved to the front.
    # (0.5.14 - 0.5.15.post1: no eagle_worker_common; the same lines in EAGLEWorkerV2.verify.)
    "verify_commits_before_moving_the_path": (
        ["sglang/srt/speculative/eagle_worker_common.py", "sglang/srt/speculative/eagle_worker_v2.py"],
        [r"(?s)commit_mamba_states_after_verify\(\s*(self\.)?target_worker,\s*batch,\s*"
         r"accept_lens,\s*accept_index,.*?predict = (self\.)?_finalize_accept_tree_path\("]),
    # The hybrid backend's tree path: topk read at build time, parents only when topk > 1.
    # 0.5.19+ read the runtime Spec (draft_spec_scope overrides it for the draft); 0.5.18 the
    # runner's ServerArgs, into which its resolution wrote the plugin's K (a DFlash draft has
    # no recurrent layers, so no draft backend reads it there).
    "hybrid_backend_topk_switch": (
        ["sglang/srt/layers/attention/hybrid_linear_attn_backend.py"],
        [r"self\.topk = (get_spec\(\)|model_runner\.server_args)\.speculative_eagle_topk or 0",
         r"(?s)if self\.topk > 1:\s*retrieve_next_token = forward_batch\.spec_info\.retrieve_next_token",
         r"retrieve_parent_token = torch\.empty_like\(retrieve_next_token\)"]),
    # GDN: trees always verify on the Triton kernel.
    "gdn_tree_kernel_is_triton": (
        ["sglang/srt/layers/attention/linear/gdn_backend.py"],
        [r"self\.tree_verify_kernel = triton_kernel",
         r"(?s)self\.tree_verify_kernel\s*if (kwargs\.get\(\"retrieve_parent_token\"\)|"
         r"retrieve_parent_token) is not None"]),
    # KDA: FlashInfer's verify refuses topk > 1 (ddtree_hybrid refuses it first, by name).
    # (0.5.16 has no verify backend of its own: the decode backend's kernel verifies.)
    "kda_flashinfer_is_chain_only": (
        ["sglang/srt/layers/attention/linear/kda_backend.py"],
        [r"if (verify|decode)_backend\.is_flashinfer\(\) and speculative_topk > 1:"]),
    # 0.5.14 - 0.5.15.post1 (BEFORE_TREE_ROUTING): a FlashInfer decode or prefill backend
    # makes FlashInfer the GDN verify kernel, which raises on a tree (ddtree_hybrid refuses
    # those flags by name: _gdn_routes_trees_to_triton) ...
    "gdn_flashinfer_flags_take_the_verify": (
        ["sglang/srt/layers/attention/linear/gdn_backend.py"],
        [r"(?s)\(\s*decode_backend\.is_flashinfer\(\) or prefill_backend\.is_flashinfer\(\)\s*\)"
         r" and flashinfer_kernel\.supports_target_verify:\s*self\.verify_kernel = "
         r"flashinfer_kernel\s*else:\s*self\.verify_kernel = triton_kernel",
         r"retrieve_parent_token=retrieve_parent_token,"]),
    "gdn_flashinfer_verify_refuses_trees": (
        ["sglang/srt/layers/attention/linear/kernels/gdn_flashinfer.py"],
        [r"(?s)if retrieve_parent_token is not None:\s*raise RuntimeError\(\s*"
         r"\"FlashInfer GDN verify kernel only supports topk=1 \""]),
    # ... and KDA's extend (where a verify goes) runs the prefill's chunk kernel: no
    # intermediate states, no parents (ddtree_hybrid refuses KDA there: _kda_has_verify_path).
    "kda_verify_is_the_prefill_chunk": (
        ["sglang/srt/layers/attention/linear/kda_backend.py"],
        [r"(?s)def forward_extend\(.*?q = causal_conv1d_fn\(",
         r"(?s)\A(?!.*intermediate_state)"]),
    # Mamba2: the mixer's verify passes the parents to the Triton conv and the SSU dispatcher,
    # whose FlashInfer backend refuses them.
    "mamba2_tree_path": (
        ["sglang/srt/layers/attention/mamba/mamba.py"],
        [r"retrieve_parent_token=metadata\.retrieve_parent_token"]),
    "mamba2_flashinfer_ssu_refuses_trees": (
        ["sglang/kernels/ops/mamba/triton_ops/ssu_dispatch.py", SRT_MAMBA + "ops/ssu_dispatch.py"],
        [r"FlashInfer backend does not support retrieve_parent_token"]),
    # Lightning (seg_la) refuses topk > 1: verifies a tree as a chain.
    "lightning_refuses_trees": (
        ["sglang/srt/layers/attention/linear/lightning_backend.py"],
        [r"(?s)if self\.topk > 1:\s*raise NotImplementedError"]),
    # Short conv (LFM2): the verify conv takes no tree parents (0.5.19+: the verify's own
    # update kernel; 0.5.18 has no verify path: every non-decode forward, a verify included,
    # runs the prefill's varlen conv over the tokens in order).
    "short_conv_verifies_a_chain": (
        ["sglang/srt/models/lfm2.py"],
        [r"(?s)conv_out = causal_conv1d_update_triton\([^)]*intermediate_state_indices="
         r"conv\._intermediate_state_indices\[:bs\],\s*\)"
         r"|if forward_batch\.forward_mode\.is_decode\(\):.{0,400}?else:\s*"
         r"# Prefill: multiple tokens, use varlen kernel\s*Bx_t = Bx\.transpose\(0, 1\)"
         r"\.contiguous\(\)\s*conv_out = causal_conv1d_fn\(\s*Bx_t,\s*self\.conv_weight,"
         r"\s*self\.conv_bias,\s*query_start_loc=meta\.query_start_loc,\s*cache_indices="
         r"meta\.cache_indices,\s*has_initial_state=meta\.has_initial_state,\s*conv_states="
         r"conv_state,\s*activation=None,\s*\)"
         # 0.5.14: the same prefill conv over the tokens in order, its start locations built
         # from the batch's extend layout.
         r"|if forward_batch\.forward_mode\.is_decode\(\):.{0,400}?else:\s*# Prefill: multiple "
         r"tokens, use varlen kernel\s*T = hidden_states\.shape\[0\]\s*Bx_t = Bx\.transpose"
         r"\(0, 1\)\.contiguous\(\).{0,1200}?conv_out = causal_conv1d_fn\(\s*Bx_t,\s*"
         r"self\.conv_weight,\s*self\.conv_bias,\s*query_start_loc=query_start_loc,\s*"
         r"cache_indices=cache_indices,\s*has_initial_state=has_initial_state,\s*conv_states="
         r"conv_state,\s*activation=None,\s*\)"]),
    # The Triton conv computes each node's parent from next_token / next_sibling (unlinked
    # padding nodes keep parent 0: the root).
    "conv_kernel_computes_parents": (
        ["sglang/kernels/ops/mamba/causal_conv1d_triton.py", SRT_MAMBA + "causal_conv1d_triton.py"],
        [r"parent_idx_tokens = tl\.zeros\(\(NP2_SEQLEN,\), dtype=tl\.int32\)"]),
    # The recurrent kernel loads the parent's intermediate state for every node but the root.
    "recurrent_kernel_reads_the_parent_state": (
        ["sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py",
         "sglang/kernels/ops/attention/fla/fused_sigmoid_gating_recurrent.py",
         "sglang/srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py"],
        [r"if step_idx != 0 and cache_idx >= 0:",
         r"step_offset = parent_step_idx \* HV \* K \* V"]),
    # A budget schedule's narrower widths: the GDN/KDA kernel strides the pool's intermediate
    # states by the pool's own pitch (every width exact): 0.5.19+ its stride(0), 0.5.18 its
    # allocated steps (shape[1]; the pool's buffer is contiguous, so the same pitch) ...
    "recurrent_kernel_strides_by_the_pool": (
        ["sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py",
         "sglang/kernels/ops/attention/fla/fused_sigmoid_gating_recurrent.py",
         "sglang/srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py"],
        [r"cache_stride_steps = intermediate_states_buffer\.stride\(0\) // \(HV \* K \* V\)"
         r"|cache_stride_steps = \(\s*intermediate_states_buffer\.shape\[1\]\s*"
         r"if intermediate_states_buffer is not None\s*else 0\s*\)"]),
    # ... Mamba2's by the step's width (cache_steps = draft_token_num): ddtree_hybrid refuses
    # several widths for Mamba2 (the probe's mamba2_widths case shows the wrong state).
    "mamba2_ssm_strides_by_the_step_width": (
        ["sglang/srt/layers/attention/mamba/mamba.py"],
        [r"cache_steps=draft_token_num,"]),
    "mamba2_ssm_kernel_offset": (
        ["sglang/kernels/ops/mamba/triton_ops/mamba_ssm.py", SRT_MAMBA + "ops/mamba_ssm.py"],
        [r"\+ cache_idx \* cache_steps \* nheads \* dim \* dstate"]),
    # The negative control: DFlash's own commit takes the chain step.
    "dflash_commit_is_the_chain_step": (
        ["sglang/srt/speculative/dflash_worker_v2.py"],
        [r"last_correct_step_indices = commit_lens\.to\(torch\.int64\) - 1"]),
}


# The facts that hold only on some releases (every other fact: on every release).
TREE_ROUTED = tuple(r for r in RELEASES if r not in BEFORE_TREE_ROUTING)
FACT_RELEASES = {
    "gdn_tree_kernel_is_triton": TREE_ROUTED,
    "kda_flashinfer_is_chain_only": TREE_ROUTED,
    "gdn_flashinfer_flags_take_the_verify": BEFORE_TREE_ROUTING,
    "gdn_flashinfer_verify_refuses_trees": BEFORE_TREE_ROUTING,
    "kda_verify_is_the_prefill_chunk": BEFORE_TREE_ROUTING,
}
FACT_CASES = [(release, fact) for fact in sorted(SOURCE_FACTS) for release in RELEASES
              if release in FACT_RELEASES.get(fact, RELEASES)]


def _source(release: str, candidates: list[str]) -> str:
    from ddtree_deploy.sandbox import pristine_files

    for path in candidates:
        try:
            return pristine_files(release, [path])[path].decode()
        except KeyError:
            continue
    raise AssertionError(f"{release}: none of {candidates} in the wheel")


@pytest.mark.parametrize("release, fact", FACT_CASES)
def test_the_sources_the_hybrid_design_rests_on(release, fact):
    paths, patterns = SOURCE_FACTS[fact]
    text = _source(release, paths)
    for pattern in patterns:
        assert re.search(pattern, text), f"{release} {fact}: {pattern!r} not found in {paths}"


@pytest.mark.parametrize("release", RELEASES)
def test_the_gate_reads_each_releases_tree_routing_from_its_backends(release):
    # ddtree_hybrid's seams answer from the running release's backend sources: run here on
    # each wheel's text, they must say what the facts above pin (0.5.14 - 0.5.15.post1: GDN's
    # FlashInfer flags take the verify, KDA has no verify path; later: both tree-aware).
    routed = release not in BEFORE_TREE_ROUTING
    gdn = _source(release, ["sglang/srt/layers/attention/linear/gdn_backend.py"])
    kda = _source(release, ["sglang/srt/layers/attention/linear/kda_backend.py"])
    assert hy._gdn_routes_trees_to_triton(gdn) is routed
    assert hy._kda_has_verify_path(kda) is routed


@pytest.mark.parametrize("release", list(PROBE_TARGETS))
def test_mamba2_picks_its_gpu_with_a_device_context_the_probe_gives_torch_cpu(release):
    text = _source(release, ["sglang/kernels/ops/mamba/triton_ops/mamba_ssm.py",
                             SRT_MAMBA + "ops/mamba_ssm.py"])
    assert "with torch.get_device_module(x.device).device(x.device.index):" in text


def test_the_probe_answers_0_5_19s_hard_coded_cuda_pool_line():
    # tests/v2_hybrid_probe.py's _cuda_allocations_on_cpu: 0.5.19's MambaPool writes the device
    # of its speculative caches out as "cuda" (the intermediate SSM states, the conv windows and
    # their sliding-window buffer), every one a torch.zeros; 0.5.23 passes the pool's device.
    old = _source("0.5.19", ["sglang/srt/mem_cache/memory_pool.py"]).splitlines()
    new = _source("0.5.23", ["sglang/srt/mem_cache/memory_pool.py"])
    at = [n for n, line in enumerate(old) if 'device="cuda"' in line]
    assert len(at) == 3 and 'device="cuda"' not in new
    for n in at:
        assert any("torch.zeros(" in line for line in old[n - 12:n]), old[n]
    assert any("intermediate_ssm_state_cache = torch.zeros(" in line for line in old[at[1] - 12:at[1]])


def _gpu_script():
    spec = importlib.util.spec_from_file_location("gpu_check_hybrid", GPU_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("release", list(PROBE_TARGETS))
def test_the_probe_answers_exactly_the_cuda_only_host_checks_it_names(release):
    # The CPU runs (tests/v2_hybrid_probe.py, the GPU script's --device cpu) hand the commit's
    # scatter launchers CPU tensors whose is_cuda answers True: that must be the ONLY device
    # check on their way to the Triton kernel.
    text = _source(release, ["sglang/kernels/ops/mamba/mamba_state_scatter_triton.py",
                             SRT_MAMBA + "mamba_state_scatter_triton.py"])
    for name in _gpu_script().SHIMMED_LAUNCHERS:
        body = text.split(f"def {name}(", 1)[1].split("\ndef ", 1)[0]
        # 0.5.23: `if not (dst.is_cuda or dst.is_xpu)`; 0.5.19 asks src too (the shim hands
        # both as tensors whose is_cuda answers True).
        checks = re.findall(r"if not .*\b(?:dst|src)\.is_cuda\b.*:", body)
        assert len(checks) == 1, (name, checks)
        assert "is_cuda" not in re.sub(r"\b(?:dst|src)\.is_cuda\b", "", body), name
        assert re.search(r"_kernel\[grid\]\(", body), name


# ---------------------------------------------------------------------------------------------
# 3. the real release, on CPU, with the Triton kernels interpreted


@pytest.fixture(scope="module", params=list(PROBE_TARGETS))
def probe_results(tmp_path_factory, request) -> dict:
    from test_v2_worker import _family_overlay

    from ddtree_deploy.sandbox import make_host_env, run_python
    import v2_kernel_standins as ks

    release = request.param
    overlay = _family_overlay(tmp_path_factory.mktemp("series"), release,
                              REPO / "patches" / PROBE_TARGETS[release])
    assert "sglang/srt/speculative/ddtree_hybrid.py" in overlay
    # read_only: the probe only runs the env's interpreter, so the shared build serves as is
    env = make_host_env(tmp_path_factory.mktemp("host") / "v2", overlay=overlay,
                        version=release, read_only=True)
    standin = ks.install_as_sgl_kernel(tmp_path_factory.mktemp("standin"))
    probe = _probe_module()
    run = run_python(
        env, [str(PROBE), *probe.CASES], timeout=1800,
        extra_env={"PYTHONPATH": standin, "SGLANG_USE_CPU_ENGINE": "1", "TRITON_INTERPRET": "1"},
    )
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(probe.TAG)]
    assert run.returncode == 0 and lines, (
        f"probe failed (rc {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len(probe.TAG):])


@pytest.mark.sglang_env
@pytest.mark.parametrize("case", _probe_module().CASES)
def test_v2_hybrid_on_real_sglang(probe_results: dict, case: str, request) -> None:
    result = probe_results[case]
    assert result["ok"], f"{case}:\n{result['error']}"
    print(case, json.dumps(result["facts"]))  # (pytest -rP shows the figures)
    release = request.node.callspec.params["probe_results"]
    if case == "kda_lossless" and release in BEFORE_TREE_ROUTING:
        # No KDA verify path there (kda_verify_is_the_prefill_chunk): refused by name instead.
        assert "has no tree verify path" in result["facts"]["refused"], result["facts"]
    elif case.endswith("_lossless"):
        facts = result["facts"]
        # Every step's state was checked, and the control had steps to fail on (and did).
        assert facts["state_checks"] >= facts["steps"] and facts["off_node"] >= 1, facts
        assert facts["control_requests_off_greedy"] >= 1, facts
    if case == "gdn_lossless":  # the prefix cache's interval-crossing state, committed
        assert result["facts"]["track_checks"] >= 1, result["facts"]


@pytest.mark.sglang_env
def test_memory_term_for_qwen3_next_at_budgets_64_and_256(probe_results: dict) -> None:
    # SGLang's own Qwen3NextConfig (80B-A3B shapes) at TP 1/2/4 on an H200 at
    # --mem-fraction-static 0.85: an upper bound (the weights come out of the same pool).
    facts = probe_results["memory"]["facts"]
    assert facts["tp1-b64"]["per_slot_mb"] == pytest.approx(77.27, abs=0.01)
    assert facts["tp4-b64"]["cap"] == 46 and facts["tp4-b256"]["cap"] == 12
    assert facts["tp1-b256"]["cap"] == 3
    assert "fits 46" in facts["refusal"]


# ---------------------------------------------------------------------------------------------
# 4. scripts/gpu_check_hybrid.py (the GPU part), checked on CPU in Triton's interpreter


@pytest.fixture(scope="module")
def sglang_tree(tmp_path_factory) -> Path:
    """The kernel files the GPU script loads, from the real 0.5.23 wheel."""
    from ddtree_deploy.sandbox import pristine_files

    root = tmp_path_factory.mktemp("sglang-0.5.23")
    for candidates in _gpu_script().KERNEL_FILES.values():
        rel = candidates[0]  # 0.5.23's own location
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(pristine_files(PROBE_RELEASE, [rel])[rel])
    return root


def _run_gpu_script(*args):
    import subprocess

    return subprocess.run([sys.executable, str(GPU_SCRIPT), *args], capture_output=True, text=True,
                          timeout=600, env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})


def test_gpu_script_runs_its_checks_on_cpu_and_its_control_fails_as_it_should(sglang_tree):
    run = _run_gpu_script("--sglang", str(sglang_tree), "--budgets", "6", "--device", "cpu")
    lines = [json.loads(ln.split(":", 1)[1]) for ln in run.stdout.splitlines()
             if ln.startswith("GPU-HYBRID:")]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert {c["check"] for c in lines} == {"conv", "gdn-fp32-state", "gdn-bf16-state",
                                           "control-chain-parents-fail", "kda-fp32-state",
                                           "mamba2", "commit"}
    assert all(c["ok"] for c in lines), lines
    control = next(c for c in lines if c["check"] == "control-chain-parents-fail")
    assert control["state"] > 0.1  # a chain's parents on a tree: O(1) off
    conv = next(c for c in lines if c["check"] == "conv")
    assert conv["wrong_parents"] == 0


@pytest.mark.parametrize("args, message", [
    (["--sglang", "/nonexistent", "--device", "cpu"], "/nonexistent: none of"),
    (["--sglang", "/tmp", "--budgets", "x", "--device", "cpu"], "--budgets 'x': comma-separated"),
])
def test_gpu_script_bad_input_is_one_line_exit_2(args, message):
    run = _run_gpu_script(*args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
