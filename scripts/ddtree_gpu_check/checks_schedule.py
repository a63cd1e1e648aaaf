"""A budget schedule through the real payload: the plugin resolves it, the worker runs each width.

- resolution: ``ddtree_v2_plugin._resolve_schedule`` (the plugin's own rules: the CUDA tree ABI
  per entry, the budget x vocab memory rule over the batches each entry serves) on this GPU's
  memory (the dry run: an H200's, named), Qwen's vocabulary; the plugin's ``decode_reserve`` per
  entry (hunk 0005's call), and ``ddtree_hybrid``'s recurrent-state rule for a Qwen3-Next-80B
  target at TP 4 at the schedule's largest budget;
- per entry, a batch of its threshold: the worker's ``_ddtree_select`` picks that entry, its head,
  tree, lineage and verify call give SGLang's compiled tree kernel its arguments (checks_tree:
  host checks compiled and transcribed, the transcription's guard, the kernel == transcription,
  the built tree == DDTree), Triton's extend attention runs that width's tree mask, and (CUDA)
  that width's step is captured in a CUDA graph and replayed == eager, as each width's graph is
  captured on a server.
"""

from __future__ import annotations

import types

import torch

from . import attention
from . import checks_tree
from . import ddtree as dd

#: The schedule the GPU run resolves and runs (block 16: the chain is budget 15, top-K 1).
SCHEDULE = "1:64/8,8:32/4,32:16/2,48:chain"
#: The dry run's: small widths, batches up to 3, for Triton's interpreter (block 5).
DRY_SCHEDULE = "1:8/3,2:6/2,3:chain"
QWEN_VOCAB = 151_936
H200_MIB = 143_771  # the device memory SGLang measures on an H200 (the dry run's stand-in)
MEM_FRACTION_STATIC = 0.85
# Qwen3-Next-80B's recurrent state slot at TP 4 (docs/patches-v2.md, Hybrid targets).
QWEN3_NEXT_TP4_SLOT_BYTES = 19.3e6


def _device_mib(device) -> float:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**20
    return float(H200_MIB)


def resolve(report, mods, device, on_gpu: bool):
    """The schedule's resolved entries (or None, with a FAIL), by the plugin's own code."""
    text, block = (SCHEDULE, dd.DFLASH_DEFAULT_BLOCK) if on_gpu else (DRY_SCHEDULE, 5)
    plugin, sched = mods.ddtree_v2_plugin, mods.ddtree_schedule
    mib = _device_mib(device)
    where = "this GPU's" if on_gpu else "an H200's (no GPU here)"
    name = (f"the plugin resolves the budget schedule {text} (block {block}) on {where} "
            f"{mib:,.0f} MiB, --mem-fraction-static {MEM_FRACTION_STATIC}, vocab {QWEN_VOCAB:,}")
    free = mib * 2**20 * (1 - MEM_FRACTION_STATIC)
    try:
        entries, running, log = plugin._resolve_schedule(sched.parse(text), None, block,
                                                         QWEN_VOCAB, None, free)
    except ValueError as exc:
        report.record("FAIL", name, f"refused: {exc}")
        return None, block
    bag = types.SimpleNamespace(
        speculative_ddtree_budget=max(e.budget for e in entries),
        speculative_num_draft_tokens=max(e.budget for e in entries) + 1,
        speculative_eagle_topk=max(e.topk for e in entries), speculative_dflash_block_size=block,
        speculative_ddtree_budget_schedule=sched.format_schedule(entries))
    reserves = {e.threshold: plugin.decode_reserve(bag, e.threshold) for e in entries}
    wrong = {t: r for (t, r), e in zip(reserves.items(), entries)
             if r != block + max(e.budget + 1, block)}
    helper = [(e.threshold, e.budget, e.topk) for e in plugin.ddtree_schedule(bag)]
    if wrong or helper != [(e.threshold, e.budget, e.topk) for e in entries]:
        report.record("FAIL", name, f"the plugin's decode reserve per entry {reserves} or its "
                                    f"schedule helper disagrees with the entries {entries}")
        return None, block
    hy = mods.ddtree_hybrid
    cost = hy.recurrent_verify_cost(QWEN3_NEXT_TP4_SLOT_BYTES, bag.speculative_ddtree_budget,
                                    radix_cache=True)
    cap = hy.recurrent_request_cap(cost, hy.state_budget_bytes(mib * 2**20, MEM_FRACTION_STATIC,
                                                                None))
    report.record("PASS", name, f"{log}; decode reserve per entry {reserves}; ddtree_hybrid: a "
                                f"Qwen3-Next-80B TP 4 target keeps {cost.states_per_request} "
                                f"recurrent states per request at budget "
                                f"{bag.speculative_ddtree_budget}, {cap} requests fit")
    return entries, block


def _config(entry, block: int, on_gpu: bool) -> dd.Config:
    batch = min(entry.threshold, 48 if on_gpu else 3)
    return dd.Config(f"schedule entry {entry.text()}", entry.budget, entry.topk, block, batch)


def check_width(report, ctx: checks_tree.Context, entries, index: int, block: int,
                ea_module, seed: int) -> None:
    """Entry ``index`` at a batch of its threshold: the worker's entry, tree kernel, attention,
    and (CUDA) its step's CUDA graph."""
    entry = entries[index]
    cfg = _config(entry, block, ctx.on_gpu)
    lm_head = torch.randn(checks_tree.VOCAB, checks_tree.HIDDEN,
                          generator=torch.Generator().manual_seed(seed)).to(ctx.device)
    worker = dd.worker_for(cfg, lm_head, ctx.device, entries)
    state = worker.select(cfg.batch)
    name = f"schedule width {entry.width}: {cfg}"
    if state.index != index or state.width != entry.width:
        report.record("FAIL", f"{name}: the worker's entry", f"the worker picked entry "
                      f"{state.index} (width {state.width}) for a batch of {cfg.batch}")
        return
    checks_tree.check_config(report, ctx, cfg, seed, worker=worker, state=state,
                             label=f"{name}: the worker's entry, tree kernel + lineage vs DDTree")
    if ea_module is not None:
        inputs = dd.make_inputs(cfg, ctx.device, vocab=checks_tree.VOCAB,
                                hidden=checks_tree.HIDDEN, seed=seed, lm_head=lm_head)
        with torch.no_grad():
            layout = dd.worker_call(inputs, cfg, worker, state)["layout"]
        shape = attention.width_shape(cfg, ctx.on_gpu)
        attention.check_attention(report, ea_module, None, ctx.device, shape, seed,
                                  layout=layout)
    if ctx.on_gpu:
        from . import step

        runner = step.StepRunner(ctx.kernels, ctx.device, cfg, entries=entries, seed=seed)
        step.check_graph(report, runner)
        del runner
        torch.cuda.empty_cache()
