"""CPU cost of one DDTree verify step's SGLang glue (patch 0004), per batch shape.

    python -m bench ddtree_verify_bench

Installs SGLang 0.5.12.post1 + the series into a throwaway host environment (as
scripts/gpu_check_series.py does), then, inside it, times on CPU
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
import sysconfig
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


def main() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    import gpu_check_series  # noqa: E402  (scripts/ is not a package)

    from ddtree_deploy.locations import cache_dir

    wheels = sorted((cache_dir() / "wheels").glob("sglang-0.5.12.post1-*.whl"))
    if not wheels:
        print("skipped: the SGLang 0.5.12.post1 wheel is not cached (run the tests first)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = getattr(sys, "_base_executable", None) or sys.executable
        subprocess.run([base, "-m", "venv", "--without-pip", f"{tmp}/host"], check=True)
        python = f"{tmp}/host/bin/python"
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        gpu_check_series.install(wheels[0], Path(site))
        shared = sysconfig.get_paths()["purelib"]
        Path(site, "zz_shared.pth").write_text(f"import site; site.addsitedir({shared!r})\n")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
        run = subprocess.run([python, __file__, "--inner"], capture_output=True, text=True,
                             env=env, timeout=900)
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
