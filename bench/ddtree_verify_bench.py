"""CPU cost of one DDTree verify step's SGLang glue (patch 0004), per batch shape.

    python -m bench ddtree_verify_bench

Installs SGLang 0.5.12.post1 + the series (applied by the toolkit's own check) into a
throwaway sandbox host environment (ddtree_deploy.sandbox), then, inside it, times on CPU
``DDTreeVerifyInput.prepare_for_verify`` (slot allocation, req_to_token, the FULL tree
mask) and ``verify`` (greedy walk, per-request append loop, KV split, req_to_token
rewrite, next context) on real SGLang batches with random trees and random target logits
(no model forward). Median of 5 runs after a warm-up. The FULL mask has
n * (prefix + n) entries per request (n = budget + 1), so its size is printed too: it is
what grows with the budget and the context. GPU timings come from the GPU check.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = [  # (batch size, budget, prefix length)
    (1, 16, 512), (1, 64, 512), (1, 256, 512), (1, 1024, 512),
    (8, 64, 512), (48, 64, 512), (48, 64, 4096), (48, 256, 512),
]
VOCAB = 4096


def _inner() -> None:
    import importlib.util

    import torch

    torch.set_num_threads(1)
    # The GPU check's own probe (scripts/gpu_check_series.sh runs it as a script on the host),
    # loaded by its file in the sandbox host's Python: the bench times exactly that code.
    spec = importlib.util.spec_from_file_location(
        "ddtree_verify_probe", REPO / "scripts" / "ddtree_verify_probe.py"
    )
    probe_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe_mod)
    probe = probe_mod._Probe("cpu")
    rows = []
    for bs, budget, prefix in SHAPES:
        gen = torch.Generator().manual_seed(bs * 7919 + budget)
        prep_t, ver_t = [], []
        for rep in range(6):
            layout = probe.layout(gen, bs, depth=15, budget=budget, vocab=VOCAB, k=budget)
            n = layout.num_nodes
            batch = probe.batch([prefix] * bs, vocab=VOCAB, max_context_len=prefix + n + 16,
                                kv_slots=bs * (prefix + n) + 16)
            # The target agrees with every node's first child: deep accepted paths.
            first = layout.retrieve_next_token
            agree = layout.tokens.gather(1, first.clamp(min=0))
            argmax = torch.where(first >= 0, agree, 0).reshape(-1)
            logits = torch.randn(bs * n, VOCAB, generator=gen)
            logits[torch.arange(bs * n), argmax] += 100.0
            out = probe.logits_output(logits, hidden_dim=64)
            vi = probe.DDTreeVerifyInput.from_layout(layout, batch.seq_lens)
            t0 = time.perf_counter()
            vi.prepare_for_verify(batch, 1)
            t1 = time.perf_counter()
            vi.verify(batch=batch, logits_output=out, page_size=1)
            t2 = time.perf_counter()
            if rep:  # the first run warms up
                prep_t.append(t1 - t0)
                ver_t.append(t2 - t1)
        mask_mb = bs * n * (prefix + n) / 2**20  # bool: one byte per entry
        rows.append([bs, budget, prefix, statistics.median(prep_t) * 1e3,
                     statistics.median(ver_t) * 1e3, mask_mb])
    print("BENCH:" + json.dumps(rows), flush=True)


# --- v2 worker (SGLang 0.5.20+, payload/ddtree_worker_v2.py) -------------------------------
V2_SHAPES = [(32, 64, 8), (32, 256, 8)]  # (batch size, budget, per-depth top-K); block 16
V2_VOCAB = 32768


class _HostSyncCounter:
    """Counts host reads of tensor values (.item/.tolist/.cpu/.numpy, int/float/bool/index of
    a tensor): on a GPU each one stalls the stream the overlap scheduler keeps busy."""

    NAMES = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")

    def __init__(self, torch):
        self.torch, self.count = torch, 0

    def __enter__(self):
        self.saved = {n: getattr(self.torch.Tensor, n) for n in self.NAMES}
        for name, fn in self.saved.items():
            def wrapped(t, *a, _fn=fn, **k):
                self.count += 1
                return _fn(t, *a, **k)
            setattr(self.torch.Tensor, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(self.torch.Tensor, name, fn)


def _v2_main() -> None:
    """The v2 worker's per-step tree work on CPU, batch 32, budget 64 / 256: the draft head's
    top-K (sharded_topk_logprobs), the DDTree build and its EAGLE lineage (what
    DDTreeWorkerV2._ddtree_build runs), and the verify tensors EAGLE's tree builder makes from
    it (FULL mask + positions, the torch reference); host syncs counted over one step's worker
    code. Baseline in the same run: DFlash's chain step on the same logits (argmax + chain
    positions + its FULL mask). Median of 5 after a warm-up; one thread."""
    import torch

    from ddtree_testkit import payload

    dl, du = payload("ddtree_lineage"), payload("ddtree_utils")

    torch.set_num_threads(1)
    depth, prefix = 15, 512
    print(f"{'bs':>3} {'budget':>6} {'K':>2} {'top-K ms':>9} {'tree+lineage ms':>16}"
          f" {'verify tensors ms':>18} {'chain ms':>9} {'ratio':>6} {'host syncs':>10}")
    for bs, budget, k in V2_SHAPES:
        gen = torch.Generator().manual_seed(budget)
        logits = torch.randn(bs * depth, V2_VOCAB, generator=gen) * 3
        roots = torch.randint(0, V2_VOCAB, (bs,), generator=gen)
        seq_lens = torch.full((bs,), prefix)
        head_t, tree_t, verify_t, chain_t, syncs = [], [], [], [], 0
        for rep in range(6):
            counter = _HostSyncCounter(torch)
            t0 = time.perf_counter()
            with counter:
                lp, tok = dl.sharded_topk_logprobs(logits, k)
                th = time.perf_counter()
                cand = tok.view(bs, depth, -1)
                layout = du.build_ddtree(lp.view(bs, depth, -1), cand, roots, budget)
                dl.eagle_lineage(layout, cand)
            t1 = time.perf_counter()
            du.flat_mask_for_sglang(layout, seq_lens, bs * prefix)
            du.positions(layout, seq_lens)
            t2 = time.perf_counter()
            chain = torch.cat([roots[:, None], logits.view(bs, depth, -1).argmax(-1)], 1)
            chain_pos = seq_lens[:, None] + torch.arange(depth + 1)
            n = depth + 1
            chain_mask = torch.ones(bs * n * (prefix + n), dtype=torch.bool)
            chain_mask.view(bs, n, prefix + n)[:, :, prefix:] = torch.ones(n, n).tril().bool()
            t3 = time.perf_counter()
            del chain, chain_pos
            if rep:
                head_t.append(th - t0)
                tree_t.append(t1 - th)
                verify_t.append(t2 - t1)
                chain_t.append(t3 - t2)
                syncs = max(syncs, counter.count)
        head_ms = statistics.median(head_t) * 1e3
        tree_ms = statistics.median(tree_t) * 1e3
        verify_ms = statistics.median(verify_t) * 1e3
        chain_ms = statistics.median(chain_t) * 1e3
        print(f"{bs:>3} {budget:>6} {k:>2} {head_ms:>9.2f} {tree_ms:>16.2f} {verify_ms:>18.2f}"
              f" {chain_ms:>9.2f} {(head_ms + tree_ms + verify_ms) / chain_ms:>6.1f} {syncs:>10}")
    print(f"(CPU, one thread, vocab {V2_VOCAB}, depth {depth}, prefix {prefix}; ratio = "
          "(top-K + tree + verify tensors) / chain (argmax + chain mask); host syncs per step in the worker's tree code, "
          "target 0; GPU timings come from scripts/gpu_check_v2.sh)")


def main() -> None:
    _v2_main()
    from ddtree_deploy.base.locations import cache_dir, repo_dir
    from ddtree_deploy.engine.check import check_series
    from ddtree_deploy.engine.series import load_family
    from ddtree_deploy.release import releases
    from ddtree_deploy.sandbox import make_host_env

    wheels = sorted((cache_dir() / "wheels").glob("sglang-0.5.12.post1-*.whl"))
    if not wheels:
        print("skipped: the SGLang 0.5.12.post1 wheel is not cached (run the tests first)")
        return
    series = load_family(repo_dir("patches") / "sglang-0.5.12")
    wanted = series.touched_paths()
    found = releases.read_wheel_files(wheels[0], wanted)
    report = check_series(series, {p: found.get(p) for p in wanted})
    if not report.ok:
        raise RuntimeError("ddtree_verify_bench: the series does not apply to SGLang 0.5.12.post1")
    with tempfile.TemporaryDirectory() as tmp:
        env = make_host_env(Path(tmp) / "host", overlay={p: f.patched for p, f in report.patched.items()})
        environ = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
        run = subprocess.run([str(env.python), __file__, "--inner"], capture_output=True, text=True,
                             env=environ, timeout=900)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("BENCH:")]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"ddtree_verify_bench failed:\n{run.stdout[-2000:]}{run.stderr[-4000:]}")
    print(f"{'bs':>3} {'budget':>6} {'prefix':>6} {'prepare ms':>11} {'verify ms':>10} {'mask MB':>8}")
    for bs, budget, prefix, prep, ver, mask in json.loads(lines[-1][len("BENCH:"):]):
        print(f"{bs:>3} {budget:>6} {prefix:>6} {prep:>11.2f} {ver:>10.2f} {mask:>8.1f}")
    print("(CPU, one thread, SGLang glue only: no model forward, no CUDA kernel)")


if __name__ == "__main__":
    if sys.argv[1:] == ["--inner"]:
        _inner()
    else:
        main()
