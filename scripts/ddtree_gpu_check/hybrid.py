"""The hybrid targets' part of the GPU check: SGLang's recurrent kernels on the DDTree tree path
(scripts/gpu_check_hybrid.py: the causal conv, GDN and KDA delta-rule updates, Mamba2's
selective state update, the accepted node's state commit, and a control that must miss) against
a sequential float32 reference over each node's path, on the kernel files ``make gpu-check-dry``
carries.

It runs in a process of its own: the script installs its own stand-in ``sglang`` modules for the
kernel files, which must not meet the ones attention.py installs for the extend-attention files,
and a time limit bounds it (a Triton build that hangs leaves the rest of the check its time).
One PASS / FAIL line per record (check x budget); a record missing from the output (the script
crashed, or ran past its limit) is a FAIL by name.

GPU: budgets 64 and 256 (the default and the largest budget of the timings), bf16 activations,
Qwen3-Next's head dims. Dry run: budget 16 (a depth-15 tree, the default draft's depth) in
Triton's CPU interpreter, float32 activations, small shapes (gpu_check_hybrid.dims_for).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

from . import carry

GPU_BUDGETS = (64, 256)
DRY_BUDGETS = (16,)
TIME_LIMIT_S = {"cuda": 240, "cpu": 240}


def command(release_root: Path, device: str, budgets) -> List[str]:
    return [sys.executable, str(carry.HYBRID_SCRIPT), "--sglang", str(release_root),
            "--budgets", ",".join(str(b) for b in budgets), "--device", device]


def collect(release_root: Path, device: str, budgets) -> Tuple[list, str]:
    """(records, why the run is incomplete: "" when it ended by itself with exit 0 or 1)."""
    script = carry.hybrid_script()
    limit = TIME_LIMIT_S[device]
    why = ""
    try:
        run = subprocess.run(command(release_root, device, budgets), capture_output=True,
                             text=True, timeout=limit, env=dict(os.environ))
        out, err, rc = run.stdout, run.stderr, run.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err, rc = "", None
        why = f"ran past its {limit} s limit"
    records = [json.loads(line[len(script.TAG):]) for line in out.splitlines()
               if line.startswith(script.TAG)]
    if rc not in (None, 0, 1):
        tail = " | ".join(err.strip().splitlines()[-3:])
        why = f"exit {rc}: {tail[-400:]}"
    return records, why


def _detail(r: dict) -> str:
    facts = {k: v for k, v in r.items() if k not in ("check", "budget", "ok", "seconds", "depth")}
    shown = ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                      for k, v in facts.items())
    if "error" in r:
        pass
    elif r["check"].startswith("control-"):
        shown = (f"a chain's parents on the tree miss the sequential reference ({shown}; must "
                 "be > 0.1): the check sees a wrong path")
    elif r["check"] == "commit":
        shown = (f"each request's accepted node's state and conv window scattered into its "
                 f"slot, the other slots untouched ({shown})")
    else:
        shown = f"max relative error vs the float32 sequential reference: {shown}"
    return f"{shown}; {r['seconds']} s"


def check(report, release_root: Path, device: str, budgets) -> None:
    script = carry.hybrid_script()
    records, why = collect(release_root, device, budgets)
    seen = set()
    for r in records:
        seen.add((r["check"], r["budget"]))
        report.record("PASS" if r["ok"] else "FAIL",
                      f"hybrid tree path: {r['check']}, budget {r['budget']} (depth "
                      f"{r['depth']})", _detail(r))
    missing = [f"{c} at budget {b}" for b in budgets for c in script.CHECKS
               if (c, b) not in seen]
    if missing or why:
        report.record("FAIL", "hybrid tree path: every check reported",
                      f"{why or 'the script stopped'}; no result for {', '.join(missing) or '-'}")
