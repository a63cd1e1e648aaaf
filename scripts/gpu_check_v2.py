"""Helpers for scripts/gpu_check_v2.sh: the prepared GPU check of DDTree on SGLang's v2 worker
(family patches/sglang-0.5.20/, SGLang 0.5.20 - 0.5.23).

    python scripts/gpu_check_v2.py install --wheel W --site-packages SP
        The release wheel W unpacked into SP (as pip --no-deps would), the family's series
        applied with GNU patch (-F0; offsets allowed, as `check` allows them) and its payload
        added.
    python scripts/gpu_check_v2.py kernels
        On CUDA, with SGLang's real kernels: DDTree trees (batch 32, budget 64 and 256) in the
        EAGLE lineage ABI through build_tree_kernel_efficient equal the DDTree layout (links,
        positions, mask rows); verify_tree_greedy equals ddtree_utils.greedy_accept;
        tree_speculative_sampling_target_only equals ddtree_utils.sample_accept with shared
        coins; the CPU stand-ins of tests/v2_kernel_standins.py equal the real kernels; the
        worker's tree build + lineage + sharded top-K run under
        torch.cuda.set_sync_debug_mode("error") (no host sync).
    python scripts/gpu_check_v2.py serve
        SGLang's offline Engine on a tiny Llama target (random weights, LM head scaled so greedy
        has no near-ties) with the tiny DFlash draft (random: --speculative-draft-load-format
        dummy), CUDA graphs on, overlap on, for attention backends triton and flashinfer:
        plain greedy, DFLASH greedy, DDTREE greedy, DDTREE sampling. Fails unless both
        speculative greedy outputs equal plain greedy token for token, and DDTREE verified with
        a tree (verify width budget + 1). Prints accept length and tokens/s, DDTree vs DFlash.
        With a random draft the accept length is near 1: this checks correctness, not speed.

Standard library only at module level; torch / SGLang are imported inside the commands.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.20"
TAG = "GPU-V2:"


def _series_entries() -> list[list[str]]:
    entries = []
    for raw in (FAMILY / "series").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            entries.append(line.split())
    return entries


def install(wheel: Path, site_packages: Path) -> None:
    site_packages.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site_packages)
    for tokens in _series_entries():
        if tokens[0] == "add":
            dest = site_packages / tokens[2]
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / tokens[1], dest)
            continue
        run = subprocess.run(
            ["patch", "-p1", "-F0", "--no-backup-if-mismatch", "-i", str(FAMILY / tokens[0])],
            cwd=site_packages, capture_output=True, text=True,
        )
        if run.returncode != 0:
            raise SystemExit(f"{tokens[0]} does not apply:\n{run.stdout}{run.stderr}")
    print(f"installed {wheel.name} + the v2 series into {site_packages}")


# ---------------------------------------------------------------------------------------------
# kernels


def _report(name: str, ok: bool, **extra) -> bool:
    print(TAG + json.dumps({"check": name, "ok": bool(ok), **extra}), flush=True)
    return bool(ok)


def kernels(device: str = "cuda") -> int:
    """device "cpu" (CI, with SGLANG_USE_CPU_ENGINE=1 and the stand-in sgl_kernel): the same
    calls at small shapes, so the script's use of SGLang's APIs is checked before a GPU is
    spent on it; the sync check and the sampling kernel (CUDA only) are skipped there."""
    import torch

    sys.path[:0] = [str(REPO / "tests")]
    import v2_kernel_standins as ks
    from sglang.srt.speculative import ddtree_utils as du
    from sglang.srt.speculative.ddtree_lineage import (
        eagle_lineage,
        finite_logprobs,
        lineage_depth,
        sharded_topk_logprobs,
    )
    from sglang.srt.speculative.eagle_utils import TreeMaskMode, build_tree_kernel_efficient
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_func
    from sglang.kernels.ops.speculative.verify_sampling import (
        tree_speculative_sampling_target_only,
    )

    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    ok = True
    for budget in ((64, 256) if on_gpu else (8, 24)):
        bs, depth, vocab, k = (32, 15, 512, 8) if on_gpu else (3, 5, 64, 3)
        gen = torch.Generator(device=dev).manual_seed(budget)
        logits = torch.randn(bs * depth, vocab, device=dev, generator=gen) * 3
        roots = torch.randint(0, vocab, (bs,), device=dev, generator=gen)
        def build():  # the worker's tree step: sharded top-K (one rank), DDTree, lineage
            lp, tok = sharded_topk_logprobs(logits, k)
            cand = tok.view(bs, depth, k)
            layout = du.build_ddtree(finite_logprobs(lp.view(bs, depth, k)), cand, roots, budget)
            return (layout, *eagle_lineage(layout, cand))

        build()  # warm-up: first calls allocate and cache per-device constants
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                layout, parent_list, sel, draft_tokens = build()
                sync_free = True
            except RuntimeError as exc:
                sync_free = False
                print(f"host sync in the tree build: {exc}", file=sys.stderr)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            ok &= _report("tree build + lineage without host sync", sync_free, budget=budget)
            if not sync_free:
                continue
        else:
            layout, parent_list, sel, draft_tokens = build()
        n = budget + 1
        lineage = lineage_depth(budget, k, depth)  # the kernel's depth (the worker's num_steps)
        seq_lens = torch.randint(1, 40, (bs,), device=dev, generator=gen)
        total = int(seq_lens.sum())
        mask, pos, r_idx, r_next, r_sib, tokens = build_tree_kernel_efficient(
            roots, parent_list, sel, draft_tokens, seq_lens, total, k, lineage, n,
            TreeMaskMode.FULL_MASK,
        )
        ref_mask = du.flat_mask_for_sglang(layout, seq_lens, total)
        valid = layout.valid.reshape(-1)
        rows = (seq_lens + n).repeat_interleave(n)
        starts = rows.cumsum(0) - rows
        row_ok = all(
            torch.equal(mask[s:s + w], ref_mask[s:s + w])
            for s, w, v in zip(starts.tolist(), rows.tolist(), valid.tolist()) if v
        )
        same = (torch.equal(r_next, layout.retrieve_next_token)
                and torch.equal(r_sib, layout.retrieve_next_sibling)
                and torch.equal(r_idx, layout.retrieve_index)
                and torch.equal(pos[valid], du.positions(layout, seq_lens)[valid]) and row_ok)
        ok &= _report("EAGLE tree builder == DDTree layout", same, budget=budget)
        # The CPU stand-in of the same kernel (tests/v2_kernel_standins.py over kernel_model:
        # the first 4 requests) gives the same outputs (the tree is full: finite_logprobs).
        few = min(bs, 4)
        size = int((n * (seq_lens[:few] + n)).sum())
        c_mask = torch.ones(size, dtype=torch.bool)
        c_pos = torch.empty(few * n, dtype=torch.long)
        c_ret = torch.full((3, few, n), -1, dtype=torch.long)
        ks.build_tree_kernel_efficient_cpu(parent_list[:few].cpu(), sel[:few].cpu(),
                                           seq_lens[:few].cpu(), c_mask, c_pos, c_ret[0],
                                           c_ret[1], c_ret[2], k, lineage, n, 0)
        ok &= _report("stand-in tree builder == SGLang's",
                      torch.equal(c_ret[1], r_next[:few].cpu())
                      and torch.equal(c_ret[2], r_sib[:few].cpu())
                      and torch.equal(c_pos, pos[: few * n].cpu())
                      and torch.equal(c_mask, mask[:size].cpu()), budget=budget)
        # Greedy walk: targets that follow a child often.
        follow = torch.rand(bs, n, device=dev, generator=gen) < 0.7
        nxt = layout.retrieve_next_token.clamp(min=0)
        target = torch.where(follow & (layout.retrieve_next_token >= 0),
                             layout.tokens.gather(1, nxt),
                             torch.randint(0, vocab, (bs, n), device=dev, generator=gen))
        steps = lineage + 1  # EAGLE's accept_index width for this tree
        predicts = torch.zeros(bs * n, dtype=torch.int32, device=dev)
        accept_index = torch.full((bs, steps), -1, dtype=torch.int32, device=dev)
        num = torch.zeros(bs, dtype=torch.int32, device=dev)
        verify_tree_greedy_func(predicts, accept_index, num, layout.tokens, r_idx, r_next, r_sib,
                                target)
        ref = du.greedy_accept(layout, target)
        wide = torch.full((bs, steps), -1, dtype=torch.long, device=dev)  # D + 1 >= L + 1
        wide[:, : ref.accept_index.shape[1]] = ref.accept_index
        ok &= _report("verify_tree_greedy == DDTree greedy walk",
                      torch.equal(accept_index.long(), wide)
                      and torch.equal(num.long(), ref.accept_length)
                      and torch.equal(predicts.long(), ref.predicts),
                      budget=budget, mean_accept=float(ref.accept_length.float().mean()))
        if tree_speculative_sampling_target_only is None:  # no such op on CPU
            continue
        # Sampling walk with one coin per request (same u at every node) on both sides.
        small = 16
        probs = torch.softmax(torch.randn(bs, n, small, device=dev, generator=gen) * 2, -1)
        tree = du.build_ddtree(*[x[:, :, :4] for x in du.topk_logprobs(
            torch.randn(bs, depth, small, device=dev, generator=gen) * 2, 4)],
            torch.randint(0, small, (bs,), device=dev, generator=gen), budget)
        u = torch.rand(bs, device=dev, generator=gen)
        final = torch.rand(bs, device=dev, generator=gen)
        ref = du.sample_accept(tree, probs, coins=u.unsqueeze(1).expand(bs, steps),
                               final_coins=final)
        predicts = torch.zeros(bs * n, dtype=torch.int32, device=dev)
        accept_index = torch.full((bs, steps), -1, dtype=torch.int32, device=dev)
        num = torch.zeros(bs, dtype=torch.int32, device=dev)
        tree_speculative_sampling_target_only(
            predicts, accept_index, num, tree.tokens, tree.retrieve_index,
            tree.retrieve_next_token, tree.retrieve_next_sibling,
            u.unsqueeze(1).expand(bs, n).contiguous(), final, probs, torch.zeros_like(probs),
            1.0, 1.0, True,
        )
        last = accept_index.long().gather(1, num.long().unsqueeze(1)).squeeze(1)
        wide = torch.full((bs, steps), -1, dtype=torch.long, device=dev)
        wide[:, : ref.accept_index.shape[1]] = ref.accept_index
        ok &= _report("tree_speculative_sampling_target_only (CUDA) == DDTree sampling walk",
                      torch.equal(accept_index.long(), wide)
                      and torch.equal(predicts.long()[last], ref.bonus), budget=budget)
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------
# serve


def _random_target(models: Path, dest: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(models / "tiny-llama"))
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # sharp logits: no near-tie can flip an argmax
    model.save_pretrained(dest, safe_serialization=True)
    shutil.copyfile(models / "tiny-llama" / "generation_config.json",
                    dest / "generation_config.json")
    return dest


def _run(engine_kwargs: dict, prompts, sampling: dict) -> dict:
    import sglang as sgl

    engine = sgl.Engine(**engine_kwargs)
    try:
        engine.generate(input_ids=prompts[:1], sampling_params=dict(sampling, max_new_tokens=4))
        start = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=sampling)
        wall = time.perf_counter() - start
        info = getattr(engine, "get_server_info", dict)() or {}
    finally:
        engine.shutdown()
    tokens = sum(len(o["output_ids"]) for o in outs)
    verifies = sum(int(o["meta_info"].get("spec_verify_ct", 0)) for o in outs)
    states = info.get("internal_states") or [{}]
    return {
        "outputs": [o["output_ids"] for o in outs],
        "tokens_per_s": round(tokens / wall, 1),
        "accept_length": round(tokens / verifies, 3) if verifies else None,
        "verify_width": (info.get("speculative_num_draft_tokens")
                         or states[0].get("ddtree_verify_width")),
        "worker": states[0].get("ddtree_worker_class"),
        "offchain_accepts": states[0].get("ddtree_offchain_accepts"),
    }


def serve(models: Path, budget: int, topk: int) -> int:
    import tempfile

    target = _random_target(models, Path(tempfile.mkdtemp()) / "tiny-llama-random")
    prompts = [[1, 17 + i, 42, 99, 7 + 3 * i] + list(range(100, 100 + i)) for i in range(8)]
    greedy = {"max_new_tokens": 64, "temperature": 0.0, "ignore_eos": True}
    sampled = {"max_new_tokens": 64, "temperature": 0.8, "top_p": 0.95, "ignore_eos": True}
    draft = dict(speculative_draft_model_path=str(models / "tiny-dflash-draft"),
                 speculative_draft_load_format="dummy")
    ok = True
    for backend in ("triton", "flashinfer"):
        common = dict(model_path=str(target), skip_tokenizer_init=True, attention_backend=backend,
                      mem_fraction_static=0.3, dtype="float32", log_level="warning",
                      cuda_graph_max_bs_decode=8)
        plain = _run(common, prompts, greedy)
        dflash = _run(dict(common, speculative_algorithm="DFLASH", **draft), prompts, greedy)
        ddtree_args = dict(common, speculative_algorithm="DDTREE", speculative_ddtree_budget=budget,
                           speculative_ddtree_topk=topk, **draft)
        ddtree = _run(ddtree_args, prompts, greedy)
        ddtree_s = _run(ddtree_args, prompts, sampled)
        lossless = ddtree["outputs"] == plain["outputs"]
        dflash_lossless = dflash["outputs"] == plain["outputs"]
        tree = ddtree["verify_width"] == budget + 1  # not DFlash's chain of the block
        row = {
            "backend": backend,
            "ddtree_greedy_equals_plain": lossless,
            "dflash_greedy_equals_plain": dflash_lossless,
            "accept_length": {"ddtree": ddtree["accept_length"], "dflash": dflash["accept_length"],
                              "ddtree_sampling": ddtree_s["accept_length"]},
            "tokens_per_s": {"plain": plain["tokens_per_s"], "dflash": dflash["tokens_per_s"],
                             "ddtree": ddtree["tokens_per_s"],
                             "ddtree_sampling": ddtree_s["tokens_per_s"]},
            "ddtree_verify_width": ddtree["verify_width"], "worker": ddtree["worker"],
            "offchain_accepts": ddtree["offchain_accepts"],
        }
        good = (lossless and dflash_lossless and tree and ddtree["accept_length"]
                and ddtree_s["accept_length"] and ddtree["accept_length"] >= 1.0)
        ok &= _report("serve", good, **row)
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_install = sub.add_parser("install")
    p_install.add_argument("--wheel", type=Path, required=True)
    p_install.add_argument("--site-packages", type=Path, required=True)
    p_kernels = sub.add_parser("kernels")
    p_kernels.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p_serve = sub.add_parser("serve")
    p_serve.add_argument("--models", type=Path, default=REPO / "tests" / "data" / "models")
    p_serve.add_argument("--budget", type=int, default=32)
    p_serve.add_argument("--topk", type=int, default=4)
    args = parser.parse_args(argv)
    if args.command == "install":
        install(args.wheel, args.site_packages)
        return 0
    if args.command == "kernels":
        return kernels(args.device)
    return serve(args.models, args.budget, args.topk)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
