"""Checks of SGLang's CUDA tree kernels fed with the worker's lineage.

Per configuration (ddtree.configs: ones the v2 plugin accepts): the plugin's own verdict on
it (``abi_problem``; a refused configuration is never fed to the kernel), then the worker's
head, tree (never a padding node) and lineage; then
  1. SGLang's host checks, compiled from the wheel, on the lineage's shapes (batch 0: no
     launch, so they run in the dry run too), and the transcribed host checks of
     kernel_model (the CPU stand-ins' own) on the same tensors: they must agree;
  2. the transcription of the kernel (kernel_model.simulate): a lineage that would send the
     kernel outside a request's row is refused here and never launched;
  3. CUDA: SGLang's kernel itself; its outputs must equal the transcription's bit for bit;
  4. the built tree against the DDTree layout (kernel_model.compare).
The configurations the plugin refuses (ddtree.refused_configs) are shown refused in one line
by ``abi_problem``, naming a combination that the checks above carry. Known-answer trees and
negative controls show that each stage can fail. ``verify_tree_greedy`` (same tree.cuh) walks
the built tree against DDTree's greedy walk, on CUDA and transcribed, with EAGLE's dtypes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch

from . import ddtree as dd
from . import kernel_model as km
from .tree_abi import HostCheckFailed


@dataclass
class Context:
    device: "object"  # torch.device
    kernels: Optional["object"]  # tree_abi.TreeKernels, or None when not built
    kernels_note: str  # why there is no library, when there is none
    utils: "object"  # payload ddtree_utils
    lineage: "object"  # payload ddtree_lineage

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def missing_kernels(self) -> Optional[str]:
        """On CUDA, a check of SGLang's kernels without them is a FAIL, never a silent pass."""
        if self.on_gpu and self.kernels is None:
            return f"SGLang's tree kernels are not built ({self.kernels_note}; see the build line)"
        return None


VOCAB, HIDDEN = 512, 64  # the tree checks: small head, real shapes of the tree tensors


def _outputs(bufs: dd.VerifyBuffers) -> km.TreeOutputs:
    r = bufs.retrieve.cpu()
    return km.TreeOutputs(bufs.tree_mask.cpu(), bufs.positions.cpu(), r[0], r[1], r[2])


TREE_FIELDS = ("tree_mask", "positions", "retrieve_index", "retrieve_next_token",
               "retrieve_next_sibling")
GREEDY_FIELDS = ("predicts", "accept_index", "accept_token_num")


def _differ(a, b, fields=TREE_FIELDS) -> list:
    """The fields in which two kernel outputs (real and transcribed) differ."""
    return [f for f in fields if not torch.equal(getattr(a, f), getattr(b, f))]


def build_config(ctx: Context, cfg: dd.Config, seed: int, mode: int = dd.FULL_MASK,
                 worker=None, state=None):
    """The worker's own lineage for cfg and its verify call's arguments (dd.worker_call: the
    payload's DDTreeWorkerV2), and fresh buffers."""
    inputs = dd.make_inputs(cfg, ctx.device, vocab=VOCAB, hidden=HIDDEN, seed=seed)
    with torch.no_grad():
        call = dd.worker_call(inputs, cfg, worker, state)
    bufs = dd.VerifyBuffers.allocate(cfg, inputs.seq_lens_sum, ctx.device, mode)
    bufs.reset()
    return (inputs, call["layout"], call["parent_list"], call["top_scores_index"],
            call["draft_tokens"], call["topk"], call["depth"], bufs, call["n"])


def host_checks(ctx: Context, compiled, transcribed, *args) -> tuple:
    """SGLang's compiled host checks and kernel_model's transcription of them on the same
    arguments: (problem or None, what ran). A refusal by either is a problem, and so is a
    disagreement (the CPU stand-ins would then accept or refuse what CUDA does not)."""
    try:
        transcribed(*args)
        mine = None
    except km.HostCheckError as exc:
        mine = str(exc)
    if ctx.kernels is None:
        ran = f"transcribed host checks only (SGLang's not built: {ctx.kernels_note})"
        return (f"the transcribed host check refused: {mine}" if mine else None), ran
    try:
        compiled(*args)
        theirs = None
    except HostCheckFailed as exc:
        theirs = str(exc)
    ran = "SGLang's host checks and their transcription passed"
    if (theirs is None) != (mine is None):
        return (f"the transcribed host check (kernel_model, the CPU stand-ins') disagrees with "
                f"SGLang's compiled one: SGLang {theirs or 'passes'}, transcription "
                f"{mine or 'passes'}"), ran
    if theirs is not None:
        return f"SGLang's host check: {theirs}", ran
    return None, ran


def check_config(report, ctx: Context, cfg: dd.Config, seed: int,
                 mode: int = dd.FULL_MASK, worker=None, state=None, label=None) -> bool:
    name = (label or f"tree kernel + lineage vs DDTree: {cfg}") + (", QLEN_ONLY" if mode else "")
    if ctx.missing_kernels():
        return report.record("FAIL", name, ctx.missing_kernels())
    refused = dd.plugin_problem(ctx.lineage, cfg)
    if refused:
        return report.record("FAIL", name, f"the plugin refuses this configuration, so it is "
                                           f"not fed to the kernel: {refused}")
    try:
        inputs, layout, parent_list, sel, _draft, topk, depth, bufs, n = build_config(
            ctx, cfg, seed, mode, worker, state)
    except Exception as exc:  # the payload crashed
        return report.record("FAIL", name, f"the worker's tree/lineage raised "
                                           f"{type(exc).__name__}: {exc}")
    if n != cfg.n:
        return report.record("FAIL", name, f"the worker verifies {n} tokens per request, not "
                                           f"budget {cfg.budget} + 1")
    padding = int((~layout.valid).sum())
    shapes = (f"parent_list {list(parent_list.shape)}, top_scores_index {list(sel.shape)}, "
              f"topk {topk}, depth {depth}, draft_token_num {n}")
    if padding:
        return report.record("FAIL", name, f"the worker's tree has {padding} padding nodes (the "
                                           f"v2 path must carry none); {shapes}")
    args = (parent_list, sel, inputs.seq_lens, *bufs.kernel_args(), topk, depth, n, mode)
    problem, host = host_checks(ctx, getattr(ctx.kernels, "host_checks", None),
                                km.check_build_tree_host, *args)
    if problem:
        return report.record("FAIL", name, f"{problem}; {shapes}")
    model, violations = km.simulate(parent_list.cpu(), sel.cpu(), inputs.seq_lens.cpu(), topk,
                                    depth, n, mode, bufs.tree_mask.cpu())
    if violations:
        return report.record("FAIL", name, f"{host}; the kernel would leave a request's row, "
                                           f"so it is not launched: {'; '.join(violations[:3])}"
                                           f"; {shapes}")
    if ctx.on_gpu:
        try:
            dd.verify_tensors(ctx.kernels, parent_list, sel, inputs.seq_lens, bufs, topk,
                              depth, n)
        except HostCheckFailed as exc:
            return report.record("FAIL", name, f"SGLang's host check at batch "
                                               f"{cfg.batch}: {exc}; {shapes}")
        torch.cuda.synchronize()
        built = _outputs(bufs)
        differ = _differ(built, model)
        if differ:
            return report.record("FAIL", name, f"SGLang's kernel and our transcription of it "
                                               f"differ in {differ}; {shapes}")
        source = "SGLang's CUDA kernel (== our transcription)"
    else:
        built = model
        source = "our transcription of SGLang's kernel (CUDA not here)"
    bad = km.compare(layout, inputs.seq_lens.cpu(), built, n, mode, dd.SENTINEL)
    if bad:
        return report.record("FAIL", name, f"{source} vs DDTree: {'; '.join(bad[:3])}; {shapes}")
    return report.record("PASS", name, f"{host}; {source} == DDTree (links, positions, mask "
                                       f"rows, nothing outside the batch); {shapes}")


def _suggestion(line: str) -> Optional[tuple]:
    """(budget, topk, block) of the 'e.g. ...' combination a refusal names."""
    m = re.search(r"e\.g\. --speculative-ddtree-budget (\d+) --speculative-ddtree-topk (\d+) "
                  r"--speculative-dflash-block-size (\d+)", line)
    return tuple(int(x) for x in m.groups()) if m else None


def check_refused(report, ctx: Context, cfg: dd.Config, accepted) -> bool:
    """The plugin refuses cfg through abi_problem, in one line naming the three flags and a
    combination it accepts, which the tree checks carry (one of ``accepted``)."""
    name = f"refused by the plugin, not fed to the kernel: {cfg}"
    line = ctx.lineage.abi_problem(cfg.budget, cfg.topk, cfg.block)
    if line is None:
        return report.record("FAIL", name, "abi_problem accepts it: the kernel would be fed a "
                                           "tree it cannot carry")
    fix = _suggestion(line)
    carried = {(c.budget, c.topk, c.block) for c in accepted}
    if "\n" in line or fix is None:
        return report.record("FAIL", name, f"not one line naming the three flags: {line!r}")
    fixed = dd.Config("fix", *fix, 1)
    if dd.plugin_problem(ctx.lineage, fixed) is not None or fix not in carried:
        return report.record("FAIL", name, f"its suggestion {fix} is not a configuration the "
                                           f"plugin accepts and the tree checks carry: {line}")
    return report.record("PASS", name, line)


# ---------------------------------------------------------------------------------------------
# Known answers and negative controls


def _known_tree(device):
    """A 4-node EAGLE lineage (topk 2, depth 3): root -> {1, 2}, 1 -> {3}; seq_len 5."""
    long = dict(dtype=torch.long, device=device)
    parent_list = torch.tensor([[-1, 0, 1, -1, -1]], **long)  # group g's parent candidate id
    sel = torch.tensor([[0, 1, 2]], **long)  # node i's candidate id (group = id // 2)
    seq_lens = torch.tensor([5], **long)
    return parent_list, sel, seq_lens, 2, 3, 4


def _known_layout(utils):
    """The same tree shape as a DDTree layout: depth-1 candidates a > b, depth-2 c; budget 3
    picks a (-0.1), b (-0.5), a->c (-1.1)."""
    logprobs = torch.tensor([[[-0.1, -0.5], [-1.0, -2.0]]])
    tokens = torch.tensor([[[10, 11], [12, 13]]])
    return utils.build_ddtree(logprobs, tokens, torch.tensor([9]), 3)


def check_known_answers(report, ctx: Context) -> bool:
    name = "known-answer tree and negative controls (the checks can fail)"
    if ctx.missing_kernels():
        return report.record("FAIL", name, ctx.missing_kernels())
    problems, done = [], []
    parent_list, sel, seq_lens, topk, depth, n = _known_tree(ctx.device)
    cfg = dd.Config("known", 3, topk, depth + 1, 1)
    bufs = dd.VerifyBuffers.allocate(cfg, 5, ctx.device)
    bufs.reset()
    model, violations = km.simulate(parent_list.cpu(), sel.cpu(), seq_lens.cpu(), topk, depth,
                                    n, dd.FULL_MASK, bufs.tree_mask.cpu())
    want_next, want_sib = [1, 3, -1, -1], [-1, 2, -1, -1]
    if violations or model.retrieve_next_token[0].tolist() != want_next \
            or model.retrieve_next_sibling[0].tolist() != want_sib \
            or model.positions.tolist() != [5, 6, 6, 7]:
        problems.append(f"transcription on the known tree: {violations or 'wrong links'}")
    layout = _known_layout(ctx.utils)
    if layout.parents[0].tolist() != [-1, 0, 0, 1]:
        problems.append(f"DDTree known layout parents {layout.parents[0].tolist()}")
    bad = km.compare(layout, seq_lens.cpu(), model, n, dd.FULL_MASK, dd.SENTINEL)
    if bad:
        problems.append(f"compare() on the known tree: {bad[:2]}")
    done.append("transcription and compare() on a known tree")
    if ctx.on_gpu:
        dd.verify_tensors(ctx.kernels, parent_list, sel, seq_lens, bufs, topk, depth, n)
        torch.cuda.synchronize()
        differ = _differ(_outputs(bufs), model)
        if differ:
            problems.append(f"SGLang's kernel on the known tree differs in {differ}")
        done.append("SGLang's kernel on it")
    # The greedy walk on it: root -> 1 (token 10) -> 3 (token 12), then the bonus 42.
    cand = torch.tensor([[9, 10, 11, 12]])
    target = torch.tensor([[10, 12, 0, 42]])
    walk, v = km.simulate_verify_greedy(cand, model.retrieve_index, model.retrieve_next_token,
                                        model.retrieve_next_sibling, target, depth + 1)
    want = ([0, 1, 3, -1], [2], [10, 12, 0, 42])
    got = (walk.accept_index[0].tolist(), walk.accept_token_num.tolist(), walk.predicts.tolist())
    if v or got != want:
        problems.append(f"greedy walk transcription on the known tree: {got} != {want} {v}")
    if ctx.on_gpu:
        real = km.GreedyOutputs(torch.zeros(4, dtype=torch.int32, device=ctx.device),
                                torch.full((1, depth + 1), -1, dtype=torch.int32,
                                           device=ctx.device),
                                torch.zeros(1, dtype=torch.int32, device=ctx.device))
        r = bufs.retrieve
        ctx.kernels.verify_tree_greedy(real.predicts, real.accept_index, real.accept_token_num,
                                       cand.to(ctx.device), r[0], r[1], r[2],
                                       target.to(ctx.device))
        torch.cuda.synchronize()
        if (real.accept_index[0].tolist(), real.accept_token_num.tolist(),
                real.predicts.tolist()) != want:
            problems.append("SGLang's verify_tree_greedy on the known tree differs")
    done.append("the greedy walk on it")
    # compare() must flag a wrong position and a wrong mask row.
    broken = km.TreeOutputs(model.tree_mask.clone(), model.positions.clone(),
                            model.retrieve_index, model.retrieve_next_token,
                            model.retrieve_next_sibling)
    broken.positions[3] += 1
    if not km.compare(layout, seq_lens.cpu(), broken, n, dd.FULL_MASK, dd.SENTINEL):
        problems.append("compare() accepted a wrong position")
    done.append("compare() flags a wrong position")
    # The transcription must refuse a lineage whose parent id matches nothing.
    lost = parent_list.clone()
    lost[0, 1] = 99
    _, v = km.simulate(lost.cpu(), sel.cpu(), seq_lens.cpu(), topk, depth, n, dd.FULL_MASK,
                       bufs.tree_mask.cpu())
    if not any("matches no candidate" in x for x in v):
        problems.append(f"the transcription did not flag a lost parent: {v}")
    done.append("a lost parent is refused before launch")
    # SGLang's host checks and their transcription pass the known lineage and refuse it one
    # column too wide (tree.cuh:53).
    args = (parent_list, sel, seq_lens, *bufs.kernel_args(), topk, depth, n, dd.FULL_MASK)
    problem, ran = host_checks(ctx, getattr(ctx.kernels, "host_checks", None),
                               km.check_build_tree_host, *args)
    if problem:
        problems.append(f"the known lineage: {problem}")
    wide = torch.cat([parent_list, parent_list[:, :1]], dim=1)
    try:
        km.check_build_tree_host(wide, *args[1:])
        problems.append(f"the transcribed host check accepted parent_list of width "
                        f"{wide.shape[1]} with topk {topk}, depth {depth}")
    except km.HostCheckError as exc:
        if "parent_width" not in str(exc):
            problems.append(f"the transcription refused it for another reason: {exc}")
    if ctx.kernels is not None:
        try:
            ctx.kernels.host_checks(wide, *args[1:])
            problems.append("SGLang's host check accepted parent_list of width "
                            f"{wide.shape[1]} with topk {topk}, depth {depth}")
        except HostCheckFailed as exc:
            if "parent_width" not in str(exc):
                problems.append(f"refused for another reason: {exc}")
        done.append("SGLang's host checks and their transcription pass it and refuse a wrong "
                    "parent_list width")
    else:
        done.append(f"the transcribed host checks pass it and refuse a wrong parent_list width "
                    f"(SGLang's not run: {ctx.kernels_note})")
    if problems:
        return report.record("FAIL", name, "; ".join(problems))
    return report.record("PASS", name, "; ".join(done))


# ---------------------------------------------------------------------------------------------
# Greedy verify


def check_greedy_verify(report, ctx: Context, cfg: dd.Config, seed: int) -> bool:
    """SGLang's verify_tree_greedy on the built tree == DDTree's greedy walk, with the
    tensors EAGLE hands it: candidates and targets int64 [bs, n], predicts int32 [bs * n],
    accept_index int32 [bs, D + 1] (D = the worker's num_steps), accept_token_num int32 [bs].
    Targets follow a node's first child 70% of the time, so paths of many levels are walked."""
    name = f"verify_tree_greedy on the built tree == DDTree greedy walk: {cfg}"
    if ctx.missing_kernels():
        return report.record("FAIL", name, ctx.missing_kernels())
    inputs, layout, parent_list, sel, draft, topk, depth, bufs, n = build_config(ctx, cfg, seed)
    bs = cfg.batch
    model, violations = km.simulate(parent_list.cpu(), sel.cpu(), inputs.seq_lens.cpu(), topk,
                                    depth, n, dd.FULL_MASK, bufs.tree_mask.cpu())
    if violations:
        return report.record("FAIL", name, f"the tree is not built (see the tree check): "
                                           f"{violations[0]}")
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    follow = (torch.rand(bs, n, generator=gen) < 0.7).to(ctx.device)
    child = layout.tokens.gather(1, layout.retrieve_next_token.clamp(min=0))
    other = torch.randint(1, VOCAB, (bs, n), generator=gen).to(ctx.device)
    target = torch.where(follow & (layout.retrieve_next_token >= 0), child, other)
    # As eagle_utils.verify_tree_greedy_func gets them: the verify input's draft tokens
    # [bs, n], predicts zeros [bs * n], accept_index -1 [bs, spec_steps + 1], int32.
    candidates = torch.cat((inputs.roots.unsqueeze(1), draft), dim=1).contiguous()
    predicts = torch.zeros(bs * n, dtype=torch.int32, device=ctx.device)
    accept_index = torch.full((bs, depth + 1), -1, dtype=torch.int32, device=ctx.device)
    num = torch.zeros(bs, dtype=torch.int32, device=ctx.device)
    if ctx.on_gpu:
        try:
            dd.verify_tensors(ctx.kernels, parent_list, sel, inputs.seq_lens, bufs, topk,
                              depth, n)
        except HostCheckFailed as exc:
            return report.record("FAIL", name, f"tree kernel refused: {exc}")
        r = bufs.retrieve
    else:
        r = torch.stack([model.retrieve_index, model.retrieve_next_token,
                         model.retrieve_next_sibling])
    args = (predicts, accept_index, num, candidates, r[0], r[1], r[2], target)
    compiled = (None if ctx.kernels is None else
                lambda *a: ctx.kernels.verify_tree_greedy(*a, batch0=True))
    problem, host = host_checks(ctx, compiled, km.check_verify_greedy_host, *args)
    if problem:
        return report.record("FAIL", name, problem)
    walk, bad_walk = km.simulate_verify_greedy(candidates.cpu(), r[0].cpu(), r[1].cpu(),
                                               r[2].cpu(), target.cpu(), depth + 1)
    if bad_walk:
        return report.record("FAIL", name, f"{host}; {bad_walk[0]}")
    if ctx.on_gpu:
        try:
            ctx.kernels.verify_tree_greedy(*args)
        except HostCheckFailed as exc:
            return report.record("FAIL", name, f"verify_tree_greedy refused: {exc}")
        torch.cuda.synchronize()
        got = km.GreedyOutputs(predicts.cpu(), accept_index.cpu(), num.cpu())
        differ = _differ(got, walk, GREEDY_FIELDS)
        if differ:
            return report.record("FAIL", name, f"SGLang's kernel and our transcription differ "
                                               f"in {differ}")
        source = "SGLang's CUDA walk (== our transcription)"
    else:
        got = walk
        source = "our transcription of SGLang's walk (CUDA not here)"
    ref = ctx.utils.greedy_accept(layout, target)
    length, index, predicts = ref.accept_length.cpu(), ref.accept_index.cpu(), ref.predicts.cpu()
    w = min(got.accept_index.shape[1], index.shape[1])
    ai = got.accept_index.long()
    same = (torch.equal(got.accept_token_num.long(), length)
            and torch.equal(ai[:, :w], index[:, :w])
            and bool((ai[:, w:] == -1).all()) and bool((index[:, w:] == -1).all())
            and torch.equal(got.predicts.long(), predicts))
    if not same:
        return report.record("FAIL", name, f"{source}: accept lengths "
                                           f"{got.accept_token_num.tolist()[:8]} vs DDTree "
                                           f"{length.tolist()[:8]}")
    mean = float(length.float().mean())
    return report.record("PASS", name, f"{host}; {source} == DDTree: accept_index, accept "
                                       f"lengths, predicts (mean accepted {mean:.2f})")
