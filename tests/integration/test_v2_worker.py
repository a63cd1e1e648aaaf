"""DDTree on SGLang's v2 worker (payload/ddtree_worker_v2.py) against the REAL SGLang, once per
v2 family: 0.5.23 (patches/sglang-0.5.20/) and 0.5.19 (patches/sglang-0.5.19/, where the payload's
seams take 0.5.19's spellings: no KV-location plan, no accept_index from run_eagle_verify).

Two layers:

1. In this interpreter (torch only): the stand-ins for SGLang's greedy walk and target-only
   sampling walk (tests/v2_kernel_standins.py, held to the CUDA kernels) agree with the DDTree
   reference (``greedy_accept`` / ``sample_accept``) draw for draw; the sharded top-K equals
   the full-vocabulary top-K; ``decode_reserve`` is what the overlap scheduler needs. (The
   lineage against EAGLE's CUDA tree ABI: tests/integration/test_v2_tree_abi.py; the stand-ins against
   the release's sources and Triton kernels: tests/integration/test_v2_kernel_contract.py.)
2. In a host environment with the real release wheel plus its v2 family's series (GNU patch)
   (tests/v2_worker_probe.py, run by the host interpreter with ``SGLANG_USE_CPU_ENGINE=1`` and
   ``TRITON_INTERPRET=1``): the worker's whole decode step (``DDTreeWorkerV2.forward_batch_
   generation``: the DFlash block as a real ``ForwardBatch`` over the request's window, the
   top-K head, the DDTree build, the lineage) drives SGLang's own ``build_eagle_verify_input``
   + ``run_eagle_verify(finalize_tree_path=True)`` on a real ``ScheduleBatch``,
   ``ReqToTokenPool``, ``TokenToKVPoolAllocator`` (or the paged one) over a real
   ``MHATokenToKVPool`` (float64), ``RadixCache`` (disabled), ``KVIndexTranslator``,
   ``ForwardBatch.init_new``, the real ``prepare_for_decode`` over-allocation and the real
   ``release_kv_cache``; a tiny float64 transformer is the target. Every decode run checks,
   per step, each request's accepted depth against a reference walk of that step's tree with
   plain sequential greedy decoding, and that the step's write window lies inside the KV the
   allocator reserved (exactly the decode reserve past the host's committed length); per run,
   the off-chain counter equals the number of steps whose accepted paths left the
   first-ranked chain (recomputed from EAGLE's accept_index), and every KV slot and request
   row is free at the end.
   - greedy: three requests of different prompt lengths finishing mid-path emit exactly the
     target's greedy tokens; each slot of a committed position holds that position's KV; the
     draft is handed, for every committed position, the same hidden state as sequential
     decoding;
   - overlap: the same, driven as the overlap scheduler drives a spec-v2 worker: the host
     prepares step k from lengths one step behind (so the lag term of the decode reserve is
     used), the real ``FutureMap`` publishes the true lengths through ``on_publish`` and
     relays the bonus tokens (the draft input's own are poisoned, -1), results are processed
     a step late and finished requests run one extra step;
   - page size 16 (SGLang's paged allocator, EAGLE's physical KV move), under overlap;
   - grammar: constrained requests (a STAND-IN grammar object) under overlap, through EAGLE's
     grammar mask over the DDTree and the scheduler's grammar barrier: the grammar-masked
     greedy tokens, which differ from the unconstrained ones;
   - sampling (verify/accept/commit with a 2-shard top-K): the law of the two tokens the
     worker emits equals the target's (chi-square on a 6-token vocabulary, 400 requests);
     the control: the same run with a sampling walk that draws the bonus without the residual
     is rejected by the same statistics;
   - no host sync: the tree build + lineage + off-chain counter make no .item()/.tolist()/
     .cpu() call; the /server_info report hook; the top-K head as the draft graph calls it;
   - a budget schedule (issue 30): requests join and finish under the overlap schedule so the
     batch crosses every threshold both ways (the width changing mid-request), each step at
     the entry of its batch and inside the KV reserved for it, the per-entry report exact;
     the negative control reusing the previous step's width state fails; the per-width CUDA
     graph states built and swapped (stand-in graph runner); the off-chain counter where
     ranks and parent indices differ; the draft's host planning bound as FlashInfer reads it
     (every decode run); the sampling law at two widths, two targets, with its resolution.

NAMED STAND-INS (see tests/v2_worker_probe.py and tests/v2_kernel_standins.py): the
``sgl_kernel`` CPU ops on this path (tree builder, greedy walk, cache-loc gathers, bonus fill;
held to the CUDA kernels / the CUDA server's Triton kernels) and
``tree_speculative_sampling_target_only`` (no CPU op exists) in pure torch; the target forward
(TinyTarget on the real KV pool, honouring the verify's custom mask and positions, float32
logits); the ModelRunner's attribute bag; the draft model runner (checks the block ForwardBatch
it is handed, returns hidden states that the target's LM head maps to a perturbed TinyTarget's
per-depth logits along its own greedy chain); DFlash's draft-KV writer replaced by a recorder;
the grammar object.

NOT driven on CPU at all: a real DFlash draft model forward and its CUDA graph (the top-K head
folded in through ``capture_tail_hooks``), DFlash's prefill path (the harness prefills the
target itself), ``DDTreeWorkerV2.__init__`` (loads the draft model
on a GPU), the attention backends' tree-mask kernels and CUDA-graph replay of the target
verify, the fused Triton/CUDA kernels EAGLE uses on a GPU (``prepare_verify_commit_outputs``,
``build_chain_tree``), the plan stream, and tensor parallelism across real ranks (simulated
with vocabulary shards). The GPU check (``make gpu-check``) covers what one GPU can.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from ddtree_testkit import payload
import torch

REPO = Path(__file__).resolve().parent.parent.parent

dl = payload("ddtree_lineage")  # payload/ddtree_lineage.py, as SGLang imports it
du = payload("ddtree_utils")  # payload/ddtree_utils.py, as SGLang imports it
import v2_kernel_standins as ks  # noqa: E402

PROBE = REPO / "tests" / "v2_worker_probe.py"
FAMILY = REPO / "patches" / "sglang-0.5.20"
RELEASE = "0.5.23"
# The release each v2 family's probe runs on: one probe per family.
TARGETS = {"0.5.23": "sglang-0.5.20", "0.5.19": "sglang-0.5.19", "0.5.18": "sglang-0.5.18",
           "0.5.17": "sglang-0.5.17", "0.5.16": "sglang-0.5.16", "0.5.15.post1": "sglang-0.5.15",
           "0.5.14": "sglang-0.5.14"}
# The v2 payload as the family installs it (sglang/srt/speculative/<name>.py).
PAYLOAD = ("ddtree_utils", "ddtree_lineage", "ddtree_worker_v2", "ddtree_v2_plugin")


def _probe_module():
    spec = importlib.util.spec_from_file_location("v2_worker_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# 1. torch only


def _random_tree(gen, *, bs=3, depth=None, vocab=12, k=None, budget=None, pad=False):
    depth = depth or int(torch.randint(1, 6, (1,), generator=gen))
    k = k or int(torch.randint(1, 5, (1,), generator=gen))
    budget = budget or int(torch.randint(1, 24, (1,), generator=gen))
    logits = torch.randint(0, 3, (bs, depth, vocab), generator=gen).float()  # many ties
    logprobs, tokens = du.topk_logprobs(logits, k)
    if pad:  # one drawable token per depth: a chain, the rest is padding
        logprobs[:, :, 1:] = float("-inf")
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    layout = du.build_ddtree(logprobs, tokens, roots, budget)
    return layout


@pytest.mark.parametrize("seed", range(20))
def test_greedy_walk_standin_equals_ddtree_reference(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    layout = _random_tree(gen, pad=seed % 5 == 0)
    bs, n = layout.tokens.shape
    # Targets that follow a child often (so paths go deep), random otherwise.
    target = torch.randint(0, 12, (bs, n), generator=gen)
    follow = torch.rand(bs, n, generator=gen) < 0.7
    nxt = layout.retrieve_next_token.clamp(min=0)
    target = torch.where(follow & (layout.retrieve_next_token >= 0),
                         layout.tokens.gather(1, nxt), target)
    ref = du.greedy_accept(layout, target)
    steps = layout.max_depth + 1
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    num = torch.zeros(bs, dtype=torch.int32)
    ks.verify_tree_greedy_cpu(predicts, accept_index, num, layout.tokens,
                              layout.retrieve_index, layout.retrieve_next_token,
                              layout.retrieve_next_sibling, target)
    assert torch.equal(accept_index.long(), ref.accept_index)
    assert torch.equal(num.long(), ref.accept_length)
    assert torch.equal(predicts.long(), ref.predicts)


@pytest.mark.parametrize("seed", range(20))
def test_sampling_walk_standin_equals_ddtree_reference(seed):
    # With one coin per request (the same u at every node) both walks make the same draw.
    gen = torch.Generator().manual_seed(200 + seed)
    layout = _random_tree(gen, vocab=6, pad=seed % 5 == 0)
    bs, n = layout.tokens.shape
    probs = torch.softmax(torch.randn(bs, n, 6, generator=gen) * 2, -1)
    u = torch.rand(bs, generator=gen)
    final = torch.rand(bs, generator=gen)
    steps = layout.max_depth + 1
    ref = du.sample_accept(layout, probs, coins=u.unsqueeze(1).expand(bs, steps).float(),
                           final_coins=final.float())
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    num = torch.zeros(bs, dtype=torch.int32)
    ks.tree_speculative_sampling_target_only(
        predicts, accept_index, num, layout.tokens, layout.retrieve_index,
        layout.retrieve_next_token, layout.retrieve_next_sibling,
        u.unsqueeze(1).expand(bs, n).contiguous(), final, probs, torch.zeros_like(probs),
    )
    assert torch.equal(accept_index.long(), ref.accept_index)
    assert torch.equal(num.long(), ref.accept_length)
    last = accept_index.long().gather(1, num.long().unsqueeze(1)).squeeze(1)
    assert torch.equal(predicts.long()[last], ref.bonus)


@pytest.mark.parametrize("shards", [1, 2, 3, 5])
def test_sharded_topk_equals_full_vocabulary(shards):
    gen = torch.Generator().manual_seed(shards)
    vocab, k = 23, 6
    logits = torch.randn(8, vocab, generator=gen, dtype=torch.float64) * 3
    logits[0, 4] = logits[0, 17]  # a tie across shards: the lower id first, like topk
    bounds = [vocab * i // shards for i in range(shards + 1)]
    parts = [logits[:, bounds[i]:bounds[i + 1]] for i in range(shards)]

    def rank_result(i):  # what rank i computes inside sharded_topk_logprobs (padded to k)
        kk = min(k, parts[i].shape[1])
        v, ids = torch.topk(parts[i].float(), kk, dim=-1)
        v = torch.cat([v, torch.full((8, k - kk), float("-inf"))], 1)
        ids = torch.cat([ids.long() + bounds[i], torch.full((8, k - kk), bounds[i])], 1)
        return v, ids, torch.logsumexp(parts[i].float(), -1, keepdim=True)

    calls = iter(range(3))

    def gather(x):
        which = next(calls)
        return torch.stack([rank_result(i)[which] for i in range(shards)])

    lp, tok = dl.sharded_topk_logprobs(
        parts[0], k, 0, all_gather=gather if shards > 1 else None
    )
    ref_v, ref_i = torch.topk(torch.log_softmax(logits.float(), -1), k, dim=-1)
    assert torch.allclose(lp, ref_v, atol=1e-5)
    assert torch.equal(tok[1:], ref_i[1:])
    assert sorted(tok[0].tolist()[:2]) == sorted(ref_i[0].tolist()[:2])


def test_decode_reserve_covers_lag_plus_window():
    # Lag: one step commits at most the draft block; window: max(B + 1, block).
    assert dl.decode_reserve(64, 16) == 16 + 65
    assert dl.decode_reserve(8, 16) == 32
    assert dl.decode_reserve(64, 16) < 2 * (64 + 1)  # DFlash's 2 x width over-reserves
    with pytest.raises(ValueError):
        dl.decode_reserve(0, 16)


def test_worker_file_carries_the_tree_marker_and_no_host_sync_in_decode():
    # The smoke/matrix contract, and the decode step's source free of host syncs.
    import ast

    tree = ast.parse((REPO / "payload" / "ddtree_worker_v2.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DDTreeWorkerV2")
    marker = [n for n in cls.body if isinstance(n, ast.Assign)
              and any(getattr(t, "id", None) == "DDTREE_TREE_VERIFY" for t in n.targets)]
    assert marker and marker[0].value.value is True
    decode = {"_ddtree_build", "_ddtree_verify_and_commit", "_ddtree_count_offchain",
              "_ddtree_offchain_by_tokens"}
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in decode:
            calls = {n.func.attr for n in ast.walk(fn)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
            assert not calls & {"item", "tolist", "cpu", "numpy"}, (fn.name, calls)


# ---------------------------------------------------------------------------------------------
# 2. the real release


def _family_overlay(work: Path, release: str = RELEASE, family: Path = FAMILY) -> dict[str, bytes]:
    """The v2 family's series on the release's files: every patch with GNU patch (exact hunks,
    no fuzz), every ``add`` entry copied; returns {site-packages path: bytes}."""
    FAMILY, RELEASE = family, release  # noqa: N806 (the module's defaults, per call)
    import shutil
    import subprocess

    from ddtree_deploy.sandbox import pristine_files

    entries = [line.split("#", 1)[0].split() for line in (FAMILY / "series").read_text()
               .splitlines()]
    entries = [e for e in entries if e]
    targets = set()
    for tokens in entries:
        if tokens[0] != "add":
            for line in (FAMILY / tokens[0]).read_text().splitlines():
                if line.startswith("+++ b/"):
                    targets.add(line[len("+++ b/"):].split("\t")[0])
    for rel, data in pristine_files(RELEASE, sorted(targets)).items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    for tokens in entries:
        if tokens[0] == "add":
            (work / tokens[2]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / tokens[1], work / tokens[2])
            targets.add(tokens[2])
            continue
        run = subprocess.run(
            ["patch", "-p1", "-F0", "--no-backup-if-mismatch", "-i", str(FAMILY / tokens[0])],
            cwd=work, capture_output=True, text=True,
        )
        assert run.returncode == 0, f"{tokens[0]}:\n{run.stdout}{run.stderr}"
    return {rel: (work / rel).read_bytes() for rel in sorted(targets)}


@pytest.fixture(scope="module", params=list(TARGETS))
def probe_results(tmp_path_factory, request) -> dict:
    from ddtree_deploy.sandbox import make_host_env, run_python

    release = request.param
    reuse = os.environ.get("DDTREE_V2_HOST_ENV")  # the mutant runner's one env (0.5.23's)
    if reuse and release != RELEASE:
        pytest.skip("the mutant runner's one env is 0.5.23's")
    overlay = _family_overlay(tmp_path_factory.mktemp("series"), release,
                              REPO / "patches" / TARGETS[release])
    assert {f"sglang/srt/speculative/{name}.py" for name in PAYLOAD} <= set(overlay)
    env = make_host_env(Path(reuse) if reuse else tmp_path_factory.mktemp("host") / "v2",
                        overlay=overlay, version=release, reuse=bool(reuse), read_only=not reuse)
    standin = ks.install_as_sgl_kernel(tmp_path_factory.mktemp("standin"))
    probe = _probe_module()
    run = run_python(
        env, [str(PROBE), *_selected_cases(probe.CASES)], timeout=1800,
        # TRITON_INTERPRET: the Triton kernels a GPU server runs on this path (e.g. the paged
        # allocator's get_last_loc) run in Triton's CPU interpreter, not as stand-ins.
        extra_env={"PYTHONPATH": standin, "SGLANG_USE_CPU_ENGINE": "1", "TRITON_INTERPRET": "1"},
    )
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(probe.TAG)]
    assert run.returncode == 0 and lines, (
        f"probe failed (rc {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len(probe.TAG):])


def _selected_cases(cases):
    """DDTREE_V2_PROBE_CASES=a,b runs only those probe cases (the rest are skipped): the
    mutant runner (scripts/mutants_v2.py) uses it; unset, every case runs."""
    wanted = os.environ.get("DDTREE_V2_PROBE_CASES")
    return [c for c in cases if c in wanted.split(",")] if wanted else list(cases)


@pytest.mark.parametrize("case", _probe_module().CASES)
def test_v2_worker_on_real_sglang(probe_results: dict, case: str) -> None:
    if case not in probe_results:
        pytest.skip(f"{case} not selected (DDTREE_V2_PROBE_CASES)")
    result = probe_results[case]
    assert result == "ok", f"{case}:\n{result}"
