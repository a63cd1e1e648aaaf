"""The whole DDTree step on the device: no host sync, CUDA-graph replay == eager, timings.

The step is ddtree.step: the worker's top-K head over a 151,936-token LM head (Qwen's
vocabulary), build_ddtree, eagle_lineage, and SGLang's tree kernel writing the verify
tensors (mask, positions, retrieve arrays) into preallocated buffers, as the worker runs it
on the overlap scheduler and inside the target's CUDA graph.

- sync: after a warm-up step (which fills the builder's per-device caches, as the server's
  first steps do), one step under ``torch.cuda.set_sync_debug_mode("error")``: any
  synchronising call raises.
- graph: capture the step into a CUDA graph on static inputs, then give the inputs new
  values (hidden states, roots, the sequence lengths permuted so the mask layout keeps its
  size) and replay; every output must equal an eager step on the new values, bit for bit
  (integers and the float32 log-probs alike).
- timings: CUDA events around each phase, 3 warm-up steps, the median of 20, for batch
  1..64 x budget 16..256 (top-K 8, block 16), eager and graph replay.
"""

from __future__ import annotations

import statistics
import time
from typing import List

import torch

from . import ddtree as dd

VOCAB = 151_936
HIDDEN = 256  # the head's matmul is DFlash's too; a narrow hidden size keeps memory small
BATCHES = (1, 2, 4, 8, 16, 32, 64)
BUDGETS = (16, 32, 64, 128, 256)
PHASES = ("head", "tree", "verify")


class StepRunner:
    """The payload's worker (dd.worker_for) stepping on fixed inputs: its head, its tree and
    lineage, SGLang's kernel with the arguments of its own verify call. ``entries``: a
    resolved budget schedule (cfg is then one of its entries, run at cfg.batch)."""

    def __init__(self, kernels, device, cfg: dd.Config, lm_head=None, vocab: int = VOCAB,
                 hidden: int = HIDDEN, seed: int = 0, entries=None):
        self.kernels, self.device, self.cfg = kernels, device, cfg
        self.inputs = dd.make_inputs(cfg, device, vocab=vocab, hidden=hidden, seed=seed,
                                     lm_head=lm_head)
        self.worker = dd.worker_for(cfg, self.inputs.lm_head, device, entries)
        with torch.no_grad():
            self.call = dd.worker_call(self.inputs, cfg, self.worker)
        self.bufs = dd.VerifyBuffers.allocate(cfg, self.inputs.seq_lens_sum, device)

    def __call__(self, marks=None, bufs=None) -> dict:
        with torch.no_grad():
            return dd.step(self.worker, self.kernels, self.inputs, self.cfg, bufs or self.bufs,
                           self.call, marks)

    def new_values(self, seed: int) -> None:
        """Other hidden states and roots, the same lengths in another order (in place)."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        inp = self.inputs
        inp.hidden.copy_(torch.randn(inp.hidden.shape, generator=gen) * 3)
        inp.roots.copy_(torch.randint(1, inp.lm_head.shape[0], inp.roots.shape, generator=gen))
        perm = torch.randperm(inp.seq_lens.shape[0], generator=gen).to(inp.seq_lens.device)
        inp.seq_lens.copy_(inp.seq_lens[perm].clone())


def _snapshot(out: dict) -> dict:
    return {k: v.clone() for k, v in out.items()}


def _without_kernels(report, name: str, runner: StepRunner) -> bool:
    if runner.kernels is None:
        report.record("FAIL", name, "SGLang's tree kernels are not built (see the build line)")
        return True
    return False


def check_sync_free(report, runner: StepRunner) -> bool:
    name = (f"DDTree step (head + tree + lineage + verify tensors) without a host sync: "
            f"{runner.cfg}")
    if _without_kernels(report, name, runner):
        return False
    runner()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        runner()
    except RuntimeError as exc:
        return report.record("FAIL", name, f"a synchronising call: {str(exc).splitlines()[0]}")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return report.record("PASS", name, 'torch.cuda.set_sync_debug_mode("error") raised nothing')


def capture(runner: StepRunner, graph_bufs: dd.VerifyBuffers):
    """(graph, its static outputs): warm-up on a side stream, then capture (torch's recipe)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            runner(bufs=graph_bufs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = runner(bufs=graph_bufs)
    return graph, static


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Integers bit for bit; float32 log-probs within 1e-6 (the same kernels on the same
    inputs; a tolerance only so a cuBLAS algorithm chosen differently under capture is not
    taken for a wrong graph)."""
    if a.is_floating_point():
        return not torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    return not torch.equal(a, b)


def check_graph(report, runner: StepRunner) -> bool:
    name = f"DDTree step captured in a CUDA graph, replayed == eager: {runner.cfg}"
    if _without_kernels(report, name, runner):
        return False
    graph_bufs = dd.VerifyBuffers.allocate(runner.cfg, runner.inputs.seq_lens_sum,
                                           runner.device)
    graph, static = capture(runner, graph_bufs)
    differ = []
    for seed in (11, 12):
        runner.new_values(seed)
        graph.replay()
        eager = runner()
        torch.cuda.synchronize()
        differ += [f"{k} (values {seed})" for k in eager if _mismatch(eager[k], static[k])]
    del graph
    if differ:
        return report.record("FAIL", name, f"replay differs from eager in {differ}")
    return report.record("PASS", name, f"{len(static)} outputs equal after replays on two new "
                                       "sets of inputs (integers bit for bit, log-probs within "
                                       "1e-6)")


# ---------------------------------------------------------------------------------------------
# Timings


class _Timer:
    """Per-phase times of one step: CUDA events on CUDA, the wall clock elsewhere."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.points: List = []

    def start(self) -> None:
        self.points = []
        self.mark("start")

    def mark(self, name: str) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.points.append((name, ev))
        else:
            self.points.append((name, time.perf_counter()))

    def phases_ms(self) -> dict:
        if self.cuda:
            torch.cuda.synchronize()
            gap = lambda a, b: a.elapsed_time(b)  # noqa: E731
        else:
            gap = lambda a, b: (b - a) * 1e3  # noqa: E731
        out = {}
        for (_, a), (name, b) in zip(self.points, self.points[1:]):
            out[name] = gap(a, b)
        out["step"] = gap(self.points[0][1], self.points[-1][1])
        return out


def time_cell(runner: StepRunner, warmup: int, iters: int, graph: bool) -> dict:
    timer = _Timer(runner.device)
    for _ in range(warmup):
        runner()
    samples = []
    for _ in range(iters):
        timer.start()
        runner(marks=timer.mark)
        samples.append(timer.phases_ms())
    result = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    if graph:
        g_bufs = dd.VerifyBuffers.allocate(runner.cfg, runner.inputs.seq_lens_sum,
                                           runner.device)
        g, _ = capture(runner, g_bufs)
        times = []
        for _ in range(warmup):
            g.replay()
        for _ in range(iters):
            timer.start()
            g.replay()
            timer.mark("graph")
            times.append(timer.phases_ms()["step"])
        result["graph"] = statistics.median(times)
        del g
    return result


def timings(report, kernels, device, *, batches=BATCHES, budgets=BUDGETS,
            vocab: int = VOCAB, warmup: int = 3, iters: int = 20) -> bool:
    on_gpu = device.type == "cuda"
    gen = torch.Generator(device="cpu").manual_seed(5)
    lm_head = (torch.randn(vocab, HIDDEN, generator=gen) / HIDDEN ** 0.5).to(device)
    rows, refused = [], []
    for budget in budgets:
        for bs in batches:
            cfg = dd.Config("timing", budget, 8, dd.DFLASH_DEFAULT_BLOCK, bs)
            runner = StepRunner(kernels, device, cfg, lm_head=lm_head, vocab=vocab)
            try:
                t = time_cell(runner, warmup, iters, graph=on_gpu)
                verify = f"{t['verify']:.3f}"
            except Exception as exc:  # the tree kernel refused this lineage: time the rest
                refused.append(f"budget {budget} batch {bs}: {str(exc)[:120]}")
                runner.kernels = None
                t = time_cell(runner, warmup, iters, graph=False)
                verify, t["graph"] = "refused", float("nan")
            rows.append([str(budget), str(bs), f"{t['head']:.3f}", f"{t['tree']:.3f}", verify,
                         f"{t['step']:.3f}", f"{t.get('graph', float('nan')):.3f}"])
            del runner
        if on_gpu:
            torch.cuda.empty_cache()
    clock = "CUDA events" if on_gpu else "wall clock (no CUDA: the table's code path only)"
    report.table(
        f"DDTree step per decode step, ms (median of {iters} after {warmup} warm-up; top-K 8, "
        f"block 16, vocab {vocab:,}; {clock})",
        ["budget", "batch", "head", "tree+lineage", "verify", "step", "graph replay"], rows,
        note="head: LM head matmul + top-K log-probs; verify: mask fill + SGLang's tree kernel;"
             " step: all three, eager; graph replay: the same step as one CUDA graph")
    name = f"per-step timings, batch {batches[0]}..{batches[-1]} x budget {budgets[0]}..{budgets[-1]}"
    if on_gpu and kernels is None:
        return report.record("FAIL", name, "SGLang's tree kernels are not built: the verify "
                                           "column is the mask fill only")
    if refused:
        return report.record("FAIL", name, f"the tree kernel refused {len(refused)} cells "
                                           f"(timed without it): {refused[0]}")
    return report.record("PASS", name, f"{len(rows)} cells timed")
