"""DDTree core benchmark (`python -m bench ddtree_bench`; ~1-2 min on CPU).

(a) Expected acceptance length (the paper's Proposition 1 objective, +1 for the bonus token)
    of the DDTree tree vs the DFlash chain on the same per-position draft distributions
    (random peaked Dirichlet marginals, depth 15), budgets 1..512, printed as ratios.
(b) Tree construction time, from top-K log-probs [bs, L, K] to the full verify layout:
    vectorised builder vs the heap, batch 1/8/32/64, budgets 16/64/256, depth 15.
(c) The top-k over a 32k and a 152k vocabulary, shared by every builder, timed separately.
(d) Target forward passes of DDTree vs greedy decoding on the tests' tiny Llama (CPU).

DDTREE_BENCH_DEVICE=cuda runs (b) and (c) on a GPU, adding the builder replayed from a CUDA
graph (it has no host sync, so it can be captured); the heap column then includes the
device-to-host copy. Times are medians of a few runs (one torch thread on CPU) on a possibly
shared machine: compare rows, not absolutes."""

from __future__ import annotations

import os
import statistics
import time

import torch

from ddtree_testkit import payload

du = payload("ddtree_utils")

DEPTH = 15
BUDGETS_OBJECTIVE = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
BATCHES = [1, 8, 32, 64]
BUDGETS_TIME = [16, 64, 256]


def _device() -> torch.device:
    return torch.device(os.environ.get("DDTREE_BENCH_DEVICE", "cpu"))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn, device, reps: int) -> float:
    fn()  # warm-up (caches, lazy init)
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _peaked_marginals(requests, vocab, peak, rest_alpha, k, seed):
    """Top-k log-probs of random draft marginals: a peak of Beta-distributed mass on one
    random token, the rest spread by a Dirichlet(rest_alpha) over the vocabulary (a small
    alpha: a few strong alternatives, as real drafts have; a larger one: thin alternatives).
    Beta(9, 1.2) (top-1 mass ~0.88) gives DFlash-like chains (tau ~7.3, the paper's Qwen3-8B
    chains: 6.6-7.8); the flatter peaks are harder drafts."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # Dirichlet and Beta sample from the global generator
    spread = torch.distributions.Dirichlet(torch.full((vocab,), rest_alpha))
    spread = spread.sample((requests, DEPTH))
    mass = torch.distributions.Beta(*peak).sample((requests, DEPTH, 1))
    top = torch.randint(0, vocab, (requests, DEPTH, 1), generator=gen)
    probs = (1 - mass) * spread
    probs.scatter_add_(2, top, mass)
    values, tokens = torch.topk(probs.clamp_min(1e-30).log(), k, dim=-1)
    return values, tokens


def acceptance_table(requests: int = 256, vocab: int = 4096) -> None:
    print("(a) expected acceptance length per step, 1 + E[accepted drafts] (Prop. 1), depth 15")
    print("    tree = DDTree with B nodes; chain@B = DFlash argmax chain of min(B, 15) nodes;")
    print("    chain15 = DFlash's full block chain (15 nodes); mean over", requests, "requests")
    settings = [((9.0, 1.2), 0.001), ((9.0, 1.2), 0.05), ((4.0, 2.0), 0.001), ((1.0, 3.0), 0.001)]
    for peak, rest_alpha in settings:
        logprobs, tokens = _peaked_marginals(
            requests, vocab, peak, rest_alpha, max(BUDGETS_OBJECTIVE), 0
        )
        roots = torch.zeros(requests, dtype=torch.long)
        chain15 = 1 + du.chain_objective(logprobs, DEPTH).mean().item()
        print(f"\n  marginals: peak ~ Beta{peak}, rest ~ Dirichlet({rest_alpha}), V={vocab}; "
              f"mean top-1 / top-2 mass {logprobs[..., 0].exp().mean().item():.3f} / "
              f"{logprobs[..., 1].exp().mean().item():.3f}")
        print(f"  {'budget':>6} {'tree':>8} {'chain@B':>8} {'chain15':>8} "
              f"{'tree/chain@B':>13} {'tree/chain15':>13}")
        for budget in BUDGETS_OBJECTIVE:
            layout = du.build_ddtree(logprobs[..., :budget], tokens[..., :budget], roots, budget)
            tree = 1 + du.tree_objective(layout).mean().item()
            chain = 1 + du.chain_objective(logprobs, min(budget, DEPTH)).mean().item()
            print(f"  {budget:>6} {tree:>8.3f} {chain:>8.3f} {chain15:>8.3f} "
                  f"{tree / chain:>13.3f} {tree / chain15:>13.3f}", flush=True)


def _heap_then_assemble(logprobs, tokens, roots, budget):
    """The realistic host-side alternative: the heap picks nodes per request on the CPU
    (after a device-to-host copy), the layout is then assembled with batched torch ops."""
    lp = logprobs.float().cpu().tolist()
    tk = tokens.long().cpu().tolist()
    bs, n = len(lp), budget + 1
    toks, depths, parents, valid, scores = [], [], [], [], []
    for b in range(bs):
        nodes = du._reference_one(lp[b], tk[b], budget, budget)
        pad = budget - len(nodes)
        toks.append([0] + [t for t, _, _, _ in nodes] + [0] * pad)
        depths.append([0] + [d for _, d, _, _ in nodes] + [1] * pad)
        parents.append([-1] + [p for _, _, p, _ in nodes] + [0] * pad)
        valid.append([True] * (1 + len(nodes)) + [False] * pad)
        scores.append([0.0] + [s for _, _, _, s in nodes] + [float("-inf")] * pad)
    device = logprobs.device
    as_t = lambda x, dt: torch.tensor(x, dtype=dt).reshape(bs, n).to(device)  # noqa: E731
    toks_t = as_t(toks, torch.long)
    toks_t[:, 0] = roots
    return du._assemble(
        toks_t, as_t(depths, torch.long), as_t(parents, torch.long),
        as_t(valid, torch.bool), as_t(scores, torch.float32), logprobs.shape[1],
    )


def _heap_only(logprobs, tokens, budget):
    """Node selection alone: device-to-host copy and the per-request heap, no layout."""
    lp = logprobs.float().cpu().tolist()
    tk = tokens.long().cpu().tolist()
    return [du._reference_one(lp[b], tk[b], budget, budget) for b in range(len(lp))]


def _graphed_builder(logprobs, tokens, roots, budget):
    """Capture build_ddtree in a CUDA graph (static shapes); returns a replay function."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up on a side stream, as graph capture requires
            du.build_ddtree(logprobs, tokens, roots, budget)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        du.build_ddtree(logprobs, tokens, roots, budget)
    return graph.replay


def construction_table() -> None:
    device = _device()
    print(f"\n(b) tree construction, top-K log-probs -> full verify layout, depth 15, on {device}")
    print("    vectorised = build_ddtree; heap+asm = per-request heap on the host + batched "
          "layout assembly;")
    print("    reference = build_ddtree_reference (heap and layout in plain Python, the "
          "readable oracle)")
    print("    heap only = the heap's node selection alone (no layout), for scale")
    cols = (f"  {'batch':>5} {'budget':>6} {'vectorised':>11} {'heap+asm':>9} {'heap only':>9}"
            f" {'reference':>10}")
    if device.type == "cuda":
        cols += f" {'graphed':>8}"
    print(cols + f" {'heap+asm/vec':>13}   (ms per batch; vec per request)")
    gen = torch.Generator().manual_seed(1)
    for budget in BUDGETS_TIME:
        for bs in BATCHES:
            logits = torch.randn(bs, DEPTH, 4 * budget, generator=gen) * 3
            logprobs, tokens = du.topk_logprobs(logits, budget)
            logprobs, tokens = logprobs.to(device), tokens.to(device)
            roots = torch.zeros(bs, dtype=torch.long, device=device)
            reps = 5 if bs * budget <= 2048 else 3
            vec = _median_ms(lambda: du.build_ddtree(logprobs, tokens, roots, budget), device, reps)
            heap = _median_ms(lambda: _heap_then_assemble(logprobs, tokens, roots, budget), device, reps)
            pick = _median_ms(lambda: _heap_only(logprobs, tokens, budget), device, reps)
            ref = _median_ms(
                lambda: du.build_ddtree_reference(logprobs, tokens, roots, budget), device, 1
            )
            row = f"  {bs:>5} {budget:>6} {vec:>11.3f} {heap:>9.3f} {pick:>9.3f} {ref:>10.2f}"
            if device.type == "cuda":
                replay = _graphed_builder(logprobs, tokens, roots, budget)
                row += f" {_median_ms(replay, device, 20):>8.3f}"
            print(row + f" {heap / vec:>13.2f}   (vec {vec / bs:.3f} ms/request)", flush=True)


def topk_table() -> None:
    device = _device()
    print(f"\n(c) shared by every builder: topk_logprobs (log_softmax + top-k) over the draft "
          f"logits [bs, 15, V], on {device}")
    print(f"  {'vocab':>7} {'batch':>5} {'k':>4} {'ms':>9}")
    gen = torch.Generator().manual_seed(2)
    for vocab in (32_000, 152_000):
        for bs in (1, 8, 32):
            logits = torch.randn(bs, DEPTH, vocab, generator=gen).to(device)
            for k in (16, 256):
                ms = _median_ms(lambda logits=logits, k=k: du.topk_logprobs(logits, k), device, 3)
                print(f"  {vocab:>7} {bs:>5} {k:>4} {ms:>9.3f}", flush=True)
            del logits


def tiny_llama_table(num_tokens: int = 64, depth: int = 8) -> None:
    """Target forward passes of DDTree decoding vs greedy on the tests' tiny Llama (CPU).
    Reuses the end-to-end test's decoders (ddtree_testkit/ddtree_support.py) so the figures are the
    ones the test asserts on; the emitted tokens are checked equal to greedy here too."""
    from ddtree_testkit import ddtree_support as sup

    print(f"\n(d) tiny random Llama (tests' model, CPU): target forwards for {num_tokens} tokens,"
          f" draft depth {depth}")
    print(f"  {'seed':>4} {'draft':>16} {'budget':>6} {'forwards':>8} {'greedy':>6} "
          f"{'ratio':>6} {'accepted/step':>13} {'same tokens':>11}")
    for seed in (0, 1):
        target = sup.tiny_llama(seed)
        prompt = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(seed))
        greedy = sup.greedy_decode(target, prompt.tolist(), num_tokens)
        drafts = [("perturbed 0.03", sup.perturbed_copy(target, 0.03, seed + 100)),
                  ("= target", target)]
        for name, draft in drafts:
            for budget in (1, 4, 16, 64):
                run = sup.ddtree_decode(target, draft, prompt.tolist(), num_tokens, budget, depth)
                mean_acc = sum(run.accept_lengths) / len(run.accept_lengths)
                print(f"  {seed:>4} {name:>16} {budget:>6} {run.target_forwards:>8} "
                      f"{greedy.target_forwards:>6} "
                      f"{greedy.target_forwards / run.target_forwards:>6.2f} {mean_acc:>13.2f} "
                      f"{str(run.tokens == greedy.tokens):>11}", flush=True)


def main() -> None:
    # One intra-op thread on CPU: steadier numbers on a shared machine (restored after).
    threads = torch.get_num_threads()
    if _device().type == "cpu":
        torch.set_num_threads(1)
    try:
        acceptance_table()
        construction_table()
        topk_table()
        tiny_llama_table()
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
