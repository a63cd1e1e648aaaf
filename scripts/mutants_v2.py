"""Held-out style mutation check of the DDTree payload: realistic one-line bugs in the v2 worker,
the lineage, the v2 plugin and the v1 payload, each run against the CPU tests that should see
it. Not part of the default pytest run (it takes about an hour on two cores).

    python scripts/mutants_v2.py [--only ID[,ID...]] [--json OUT]

For each mutant: a copy of the repository (tests, payload, patches, scripts; no .git, no
.venv) gets the one-line change (its original text must occur exactly once), then the named
killers run in order until one fails (the real-SGLang ones share one host environment,
``DDTREE_V2_HOST_ENV``, built once):

- ``pytest:ARGS``  pytest in the copy (``ARGS`` as on a command line, paths relative to it);
- ``probe:CASES``  tests/integration/test_v2_worker.py's real-SGLang probe, only those cases
  (``DDTREE_V2_PROBE_CASES``), in the copy;
- ``args:EXPR``    tests/integration/test_v2_server_args.py ``-k EXPR`` in the copy.

A mutant is killed when a killer exits non-zero; the table names it. Exit 1 when any mutant
survives (or its text is not found: the mutant is stale), 0 otherwise. Prints one line per
mutant and a markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
W, L, P, A, U = ("payload/ddtree_worker_v2.py", "payload/ddtree_lineage.py",
                 "payload/ddtree_v2_plugin.py", "payload/ddtree_args.py", "payload/ddtree_utils.py")
ABI = "pytest:tests/integration/test_v2_tree_abi.py -x"
WORKER = "pytest:tests/integration/test_v2_worker.py -x -k 'not real_sglang'"
KCALLS = "pytest:tests/integration/test_ddtree_kernel_calls.py -x"
ISSUE12 = "pytest:tests/integration/test_ddtree_utils_issue12.py -x"
GREEDY = "probe:greedy_lossless"
OVERLAP = "probe:overlap_lossless"

# (id, file, original text, mutated text, what the bug is, killers in order)
MUTANTS = [
    # ---- the lineage (payload/ddtree_lineage.py)
    ("L01", L, "need = 1 + (int(budget) - 1 + int(topk) - 1) // int(topk)",
     "need = (int(budget) - 1 + int(topk) - 1) // int(topk)",
     "lineage depth one short: parent list cannot name every parent", [ABI]),
    ("L02", L, "return int(topk) * (lineage_depth(budget, topk, draft_depth) - 1) + 1",
     "return int(topk) * (lineage_depth(budget, topk, draft_depth) - 1) + 2",
     "parent-list width off by one (CUDA host check)", [ABI]),
    ("L03", L, "return max(int(draft_depth), need)", "return need",
     "depth below the draft depth: walks stop early", [ABI]),
    ("L04", L, "cand_id = layout.parents.clamp(min=0) * k + rank",
     "cand_id = layout.parents.clamp(min=0) * (k + 1) + rank",
     "candidate id with the wrong group stride", [ABI]),
    ("L05", L, "parent_list[:, 1:named] = cand_id[:, 1:named]",
     "parent_list[:, 1:named] = cand_id[:, : named - 1]",
     "parent list shifted by one node", [ABI]),
    ("L06", L, "return torch.nan_to_num(logprobs.float(), nan=LOGPROB_FLOOR, posinf=0.0,",
     "return torch.nan_to_num(logprobs.float(), nan=float('-inf'), posinf=0.0,",
     "NaN draft log-probs left non-finite: padding nodes", [ABI]),
    ("L07", L, "        pad = (idx > 0) & ~linked\n",
     "        pad = (idx > 0) & ~linked & False\n",
     "padding left unlinked (the CUDA parent-not-found path)", [ABI]),
    ("L08", L, "    if capacity < budget:", "    if capacity < budget - 1:",
     "a draft one prefix short of the budget accepted (padding)", [ABI]),
    ("L09", L, "    if verify_width(budget) > MAX_VERIFY_WIDTH:",
     "    if verify_width(budget) >= MAX_VERIFY_WIDTH:",
     "the largest representable budget (1023) refused", [ABI]),
    ("L10", L, "        total += level\n", "        total += level - 1\n",
     "capacity undercounted", [ABI]),
    ("L11", L, "return int(draft_block) + max(verify_width(budget), int(draft_block))",
     "return max(verify_width(budget), int(draft_block))",
     "decode reserve without the overlap lag term", [WORKER, OVERLAP]),
    ("L12", L, "    total_lse = torch.logsumexp(world_lse, dim=0)  # [T, 1]",
     "    total_lse = world_lse[0]  # [T, 1]",
     "sharded top-K normalised by rank 0's shard only", [WORKER]),
    ("L13", L, "    rank = torch.where(hit, torch.arange(k, device=hit.device), k).amin(dim=2)",
     "    rank = torch.where(hit, torch.arange(k, device=hit.device), k).amax(dim=2)",
     "token rank read wrong (sibling ids collide)", [ABI]),
    ("L14", L, "    if vocab_size is not None and topk > int(vocab_size):",
     "    if vocab_size is not None and topk > int(vocab_size) + 1:",
     "top-K one above the vocabulary accepted", [ABI]),
    # ---- the worker (payload/ddtree_worker_v2.py)
    ("W01", W, "num_steps = lineage_depth(state.budget, k, int(tokens.shape[1]))\n",
     "num_steps = int(tokens.shape[1])\n", "depth = the draft depth (the old width bug)",
     [OVERLAP]),
    ("W02", W, "num_steps = lineage_depth(state.budget, k, int(tokens.shape[1]))\n",
     "num_steps = lineage_depth(state.budget, k, int(tokens.shape[1])) - 1\n",
     "verify walk one level short", [GREEDY]),
    ("W03", W, "self._ddtree_offchain += (ok & (ranks > 0)).any().to(torch.int64)",
     "self._ddtree_offchain += (ok & (ranks >= 0)).any().to(torch.int64)",
     "off-chain counter counts every accept", [GREEDY]),
    ("W04", W, "self._ddtree_offchain += (ok & (ranks > 0)).any().to(torch.int64)",
     "self._ddtree_offchain += (ok & (ranks > 0)).sum().to(torch.int64)",
     "off-chain counter counts requests, not steps", [GREEDY, "probe:sampling_law"]),
    ("W05", W, "        self._ddtree_steps += 1\n", "        pass\n",
     "step counter never advanced", [GREEDY]),
    ("W06", W, "            on_publish(new_seq_lens)", "            on_publish(batch.seq_lens)",
     "stale lengths published under overlap", [OVERLAP]),
    ("W07", W, "        if on_publish is not None:\n            on_publish(new_seq_lens)",
     "        if on_publish is None:\n            on_publish(new_seq_lens)",
     "nothing published under overlap", [OVERLAP]),
    ("W08", W, "**_grammar_barrier_arg(run_eagle_verify, grammar_barrier)",
     "**_grammar_barrier_arg(run_eagle_verify, None)",
     "dropped grammar barrier", ["probe:grammar_lossless"]),
    ("W09", W, "build_ddtree(finite_logprobs(logprobs), tokens, roots, state.budget)",
     "build_ddtree(logprobs, tokens, roots, state.budget)",
     "raw draft log-probs: NaN drafts make padding", ["probe:no_host_sync"]),
    ("W10", W, "bonus_tokens=result.next_draft_input.bonus_tokens.to(torch.int64),",
     "bonus_tokens=roots,", "next step's bonus = this step's root", [GREEDY]),
    ("W11", W, "            commit_lens=accept_lens,\n", "            commit_lens=accept_lens - 1,\n",
     "draft KV misses the last committed token", [GREEDY]),
    ("W12", W, "        hidden = hidden[: bs * n].view(bs, n, -1)[:, :width]",
     "        hidden = hidden[: bs * n].view(n, bs, -1).transpose(0, 1)[:, :width]",
     "draft hidden rows from the wrong requests", [GREEDY]),
    ("W13", W, "    DDTREE_TREE_VERIFY = True", "    DDTREE_TREE_VERIFY = False",
     "worker without the tree marker", [WORKER]),
    ("W14", W, "            speculative_num_draft_tokens=n,\n            new_seq_lens=new_seq_lens,",
     "            speculative_num_draft_tokens=n - 1,\n            new_seq_lens=new_seq_lens,",
     "wrong verify width reported to the scheduler", [GREEDY]),
    ("W15", W, "        batch = copy.copy(batch)\n", "\n",
     "EAGLE's verify rebinds the scheduler's batch", [GREEDY]),
    ("W16", W, "        roots = draft_input.bonus_tokens.view(-1).to(torch.int64)",
     "        roots = batch.seq_lens.view(-1).to(torch.int64) % 24",
     "tree rooted at the wrong token (relay ignored)", [OVERLAP]),
    # ---- the budget schedule in the worker (issue 30)
    ("W17", W, "        state = self._ddtree_widths[ddtree_schedule.pick(self.ddtree_entries,\n"
               "                                                         len(batch.seq_lens))]",
     "        state = self._ddtree_largest()",
     "the schedule ignored: the widest tree at every batch size", ["probe:schedule_lossless"]),
    ("W18", W, "ranks = top_scores_index.gather(1, (node - 1).clamp(min=0, max=n - 2)) % k",
     "ranks = top_scores_index.gather(1, (node - 1).clamp(min=0, max=n - 2)) // k",
     "off-chain counter counts parent indices, not ranks", ["probe:offchain_counter"]),
    ("W19", W, "            seq_lens_cpu.add_(block)", "            seq_lens_cpu.add_(block - 1)",
     "the draft's host planning bound one short of its KV layout", [GREEDY]),
    ("W20", W, "        counts[2] += accept_lens.sum()", "        counts[2] += bs",
     "per-entry accept length counts requests, not committed tokens",
     ["probe:schedule_lossless"]),
    ("S01", "payload/ddtree_schedule.py", "        if entry.threshold <= batch_size:",
     "        if entry.threshold < batch_size:", "a batch at a threshold runs the entry below",
     ["pytest:tests/unit/test_v2_schedule.py -x", "probe:schedule_lossless"]),
    # ---- the plugin (payload/ddtree_v2_plugin.py)
    ("P01", P, "            if getattr(worker, \"DDTREE_TREE_VERIFY\", False) is not True:",
     "            if False:", "accepted non-tree worker", ["args:tree_marker"]),
    ("P02", P, 'VERIFY_ATTENTION_BACKENDS = ("flashinfer", "triton", "fa3")',
     'VERIFY_ATTENTION_BACKENDS = ("flashinfer", "triton", "fa3", "trtllm_mha")',
     "trtllm_mha accepted without tree masks", ["args:trtllm"]),
    ("P03", P, "        declare_resolution(record, source, enable_mixed_chunk=False)",
     "        pass", "mixed chunk left on: SGLang's AssertionError", ["args:mixed"]),
    ("P04", P, "        _size_running_batch(record, source, budget, vocab, wanted_running)",
     "        _size_running_batch(record, source, budget, vocab, None)",
     "operator's max_running_requests ignored", ["args:memory"]),
    ("P05", P, "        _size_running_batch(record, source, budget, vocab, wanted_running)",
     "        pass", "no budget x vocab sizing (48 at any budget)", ["args:memory"]),
    ("P06", P, "        if problem is not None:\n            raise ValueError(problem)",
     "        if problem is None:\n            raise ValueError(problem)",
     "ABI refusals inverted", ["args:capacity or default"]),
    ("P07", P, "        problem = abi_problem(budget, topk, block, vocab_size=vocab)",
     "        problem = abi_problem(budget, topk, block)", "top-K above the vocabulary accepted",
     ["args:vocab"]),
    ("P08", P, "    return reserve(budget, ddtree_draft_block(server_args))",
     "    return reserve(budget, budget + 1)",
     "wrong decode reserve", ["args:resolves and default", GREEDY]),
    ("P09", P, "                return ddtree_draft_block(get_spec())",
     "                return num_draft_tokens", "draft runner sized by the verify width",
     ["args:resolves and default"]),
    ("P10", P, "        topk = min(DEFAULT_MAX_TOPK if topk is None else topk, budget)",
     "        topk = DEFAULT_MAX_TOPK if topk is None else topk", "top-K not clamped to the budget",
     ["args:clamped"]),
    ("P11", P, "            return False\n\n    for name, member", "            return True\n\n    for name, member",
     "mixed chunk claimed supported", ["args:dflash_everywhere"]),
    ("P12", P, "        speculative_num_draft_tokens=budget + 1,\n        speculative_dflash_block_size=block,",
     "        speculative_num_draft_tokens=block,\n        speculative_dflash_block_size=block,",
     "verify width = the draft block (a silent chain)", ["args:resolves and default"]),
    ("P13", P, "    if getattr(cfg, \"speculative_use_rejection_sampling\", False):",
     "    if False:", "rejection sampling accepted", ["args:rejection"]),
    ("P14", P, "        if value is not None and float(value) != 1.0:",
     "        if value is not None and float(value) > 1.0:",
     "accept thresholds below 1.0 accepted", ["args:accept-threshold"]),
    ("P15", P, "    if getattr(cfg, \"speculative_draft_window_size\", None) is not None:",
     "    if False:", "compact draft window accepted", ["args:draft-window"]),
    ("P16", P, "    if _attn_dp_enabled(resolved_view(record)):", "    if False:",
     "DP attention accepted", ["args:dp-attention"]),
    ("P17", P, "    head = _draft_head(cfg)\n", "    head = None\n",
     "selector / LiLiCorr / Domino drafts accepted", ["args:draft"]),
    ("P18", P, "        if cap >= hi:\n            continue", "        if True:\n            continue",
     "no memory rule per schedule entry", ["args:schedule-memory"]),
    ("P19", P, "        if abi_problem(budget, topk, block, vocab_size=vocab) is not None:",
     "        if False:", "schedule entries not held to the CUDA tree ABI", ["args:schedule-abi"]),
    # ---- hybrid targets (payload/ddtree_hybrid.py)
    ("H01", "payload/ddtree_hybrid.py", "        if mamba1 and isinstance(mamba2, mamba1):",
     "        if False:", "a Mamba-1 target served as Mamba2", ["args:hybrid-mamba1"]),
    ("H02", "payload/ddtree_hybrid.py",
     "    if kind.name == \"mamba2\" and len(set(widths)) > 1:", "    if False:",
     "Mamba2 at several schedule widths accepted", ["args:schedule-hybrid-mamba2"]),
    ("H03", "payload/ddtree_hybrid.py", "    if inkling and isinstance(hf, inkling):\n        # Before",
     "    if False:\n        # Before", "Inkling asked SGLang's predicates (crash, no refusal)",
     ["args:hybrid-inkling"]),
    # ---- the v1 line (patches/sglang-0.5.12: held out by the audit)
    ("V01", "patches/sglang-0.5.12/0005-dflash-worker-ddtree-wiring.patch",
     "+            draft_server_args.speculative_num_draft_tokens = (\n"
     "+                server_args.speculative_dflash_block_size\n",
     "+            draft_server_args.speculative_num_draft_tokens = (\n"
     "+                server_args.speculative_num_draft_tokens\n",
     "v1: the draft runner sized by the verify width",
     ["pytest:tests/integration/test_ddtree_verify_input.py -x -k 'sglang-0.5.12 and worker_draft_runner'"]),
    ("V02", "patches/sglang-0.5.12/0004-dflash-info-ddtree-verify-input.patch",
     "+            req.kv_allocated_len = req.kv_committed_len\n",
     "+            req.kv_allocated_len = req.kv_committed_len + 1\n",
     "v1: one KV slot too many kept after a commit",
     ["pytest:tests/integration/test_ddtree_verify_input.py -x -k 'sglang-0.5.12 and verify_greedy'"]),
    # ---- the v1 payload (payload/ddtree_utils.py, payload/ddtree_args.py)
    ("U01", U, "    return (int(budget) + 1) * int(vocab_size) * 4 * VERIFY_VOCAB_COPIES",
     "    return (int(budget) + 1) * int(vocab_size) * 4", "verify memory undercounted 5x",
     [ISSUE12]),
    ("U02", U, "        value = min(DEFAULT_MAX_RUNNING_REQUESTS, cap)", "        value = cap",
     "running batch above DFlash's 48", ["args:memory"]),
    ("U03", U, "    if int(wanted) > cap:", "    if int(wanted) >= cap:",
     "an explicit running batch at the cap refused", ["args:memory"]),
    ("U04", U, "    accept_index = torch.full((bs, steps), -1, dtype=torch.int32, device=device)\n    accept_num",
     "    accept_index = torch.full((bs, steps), -1, dtype=torch.int64, device=device)\n    accept_num",
     "v1 greedy kernel call: accept_index int64 (CUDA host check)", [KCALLS]),
    ("U05", U, "        target_predict=target_tokens.long().contiguous(),",
     "        target_predict=target_tokens.int().contiguous(),",
     "v1 greedy kernel call: target int32 (CUDA host check)", [KCALLS]),
    ("U06", U, "    valid_nodes = node_scores > neg_inf", "    valid_nodes = node_scores >= neg_inf",
     "padding nodes marked valid", [ABI]),
    ("U07", U, "        res = torch.where(removed > 0, 0.0, p)", "        res = p",
     "sampling reference without the residual", [WORKER]),
    ("U08", U, "    same = s_linked[:, :-1] & s_linked[:, 1:] & (s_parent[:, :-1] == s_parent[:, 1:])",
     "    same = s_linked[:, :-1] & s_linked[:, 1:]",
     "siblings linked across parents", [ABI]),
    ("A01", A, "    if args.page_size != 1:", "    if args.page_size > 16:",
     "v1: page size 16 accepted", ["pytest:tests/integration/test_series_sglang.py -x -k bad_values"]),
]

COPY = ("payload", "patches", "tests", "scripts", "ddtree_testkit", "snapshot", "pyproject.toml",
        "setup.py")


def _copy_repo(dest: Path) -> None:
    for name in COPY:
        src = REPO / name
        if src.is_dir():
            # (snapshot/files: fetched release files, not committed; the tests copy it so too)
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "files"))
        elif src.exists():
            shutil.copy2(src, dest / name)


def _pytest(work: Path, args: str, env=None) -> subprocess.CompletedProcess:
    import shlex

    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *shlex.split(args)]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, **(env or {})})


def _run_killer(work: Path, killer: str, show: bool = False) -> bool:
    """True when the killer FAILS (the mutant is killed)."""
    kind, _, arg = killer.partition(":")
    if kind == "pytest":
        run = _pytest(work, arg)
    elif kind == "probe":
        run = _pytest(work, "tests/integration/test_v2_worker.py -x -k real_sglang",
                      env={"DDTREE_V2_PROBE_CASES": arg})
    elif kind == "args":
        run = _pytest(work, f"tests/integration/test_v2_server_args.py -x -k {json.dumps(arg)}")
    else:
        raise SystemExit(f"unknown killer {killer!r}")
    if show:
        print(run.stdout[-3000:], run.stderr[-2000:], file=sys.stderr)
    return run.returncode not in (0, 5)  # 5: nothing selected counts as not killed


def _baseline_killers(killers: set) -> list:
    """The killers to run on the clean copy: each pytest one, and the probe / server-args ones
    merged into one run each (their cases, or their -k expressions, together)."""
    out = sorted(k for k in killers if k.startswith("pytest:"))
    cases = sorted({c for k in killers if k.startswith("probe:") for c in k[6:].split(",")})
    if cases:
        out.append("probe:" + ",".join(cases))
    exprs = sorted(k[5:] for k in killers if k.startswith("args:"))
    if exprs:
        out.append("args:" + " or ".join(f"({e})" for e in exprs))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated mutant ids")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    only = {x for x in args.only.split(",") if x}
    rows, bad = [], 0
    with tempfile.TemporaryDirectory(prefix="ddtree-mutants-") as tmp:
        work = Path(tmp) / "repo"
        work.mkdir()
        _copy_repo(work)
        # One real-SGLang host env for every probe / server-args run (built by the first, then
        # only the patched files and the payload are written again: make_host_env(reuse=True)).
        os.environ["DDTREE_V2_HOST_ENV"] = str(Path(tmp) / "host-0.5.23")
        # Tests that import the payload through ddtree_testkit / locations read the copy too.
        os.environ["DDTREE_DEPLOY_PAYLOAD"] = str(work / "payload")
        os.environ["DDTREE_DEPLOY_PATCHES"] = str(work / "patches")
        chosen = [m for m in MUTANTS if not only or m[0] in only]
        # Every killer must pass on the unmutated copy: a kill is then the mutant's doing,
        # never a broken harness.
        for killer in _baseline_killers({k for m in chosen for k in m[5]}):
            if _run_killer(work, killer):
                _run_killer(work, killer, show=True)
                raise SystemExit(f"the killer {killer!r} fails without any mutant")
            print(f"baseline ok: {killer}", flush=True)
        for mid, rel, old, new, why, killers in chosen:
            path = work / rel
            original = path.read_text()
            if original.count(old) != 1:
                rows.append((mid, rel, why, "STALE (text not found once)", 0.0))
                bad += 1
                print(f"{mid}: stale", flush=True)
                continue
            path.write_text(original.replace(old, new))
            started, killed_by = time.monotonic(), None
            try:
                for killer in killers:
                    if _run_killer(work, killer):
                        killed_by = killer
                        break
            finally:
                path.write_text(original)
            took = time.monotonic() - started
            rows.append((mid, rel, why, killed_by or "SURVIVED", took))
            bad += killed_by is None
            print(f"{mid}: {killed_by or 'SURVIVED'} ({took:.0f} s)", flush=True)
    print("\n| mutant | file | bug | killed by | s |\n|---|---|---|---|---|")
    for mid, rel, why, by, took in rows:
        print(f"| {mid} | {rel} | {why} | {by} | {took:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [dict(zip(("id", "file", "bug", "killed_by", "seconds"), r)) for r in rows], indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
