"""Patches 0004-0006 (DDTree verify input, worker wiring, server report) against the REAL
SGLang releases, on CPU: once per v1 family (sglang-0.5.12 on 0.5.12.post1, sglang-0.5.13
on 0.5.13.post1), so the lossless checks run through each family's real glue.

The whole series (patches/sglang-0.5.1x/) is applied with GNU patch (exact hunks only)
to the release wheel's files and overlaid on a host environment (ddtree_deploy/sandbox/hostenv.py).
The host interpreter then runs scripts/ddtree_verify_probe.py (``python <probe> <case>...``):
the patched ``dflash_info`` / ``dflash_worker`` are imported and driven with SGLang's
own CPU-constructible pieces: a real ``ScheduleBatch`` of real ``Req`` objects, a
real ``ReqToTokenPool``, ``TokenToKVPoolAllocator`` and ``ChunkCache``, a real
``SamplingBatchInfo`` and penalizer orchestrator, real ``VocabParallelEmbeddingShardIndices``.
Every expectation is recomputed by brute force in plain Python from the tree's parent
array (ancestor walk, greedy walk over children in index order), not by the code under
test.

Stand-ins (named): ``sgl_kernel`` for the worker-import probe only (the CUDA kernel
package cannot load without a GPU; sglang_host.write_kernel_standin); the target
model's logits and hidden states are random tensors (no forward pass on CPU); the LM
head handed to the worker's top-k helper is a plain object holding a weight tensor and
a real shard-indices record. What needs a GPU (sgl_kernel's verify_tree_greedy and
tree_speculative_sampling_target_only, attention kernels, a served model) is in
scripts/gpu_check_series.sh and docs/patches-0004-0005.md.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
FAMILIES = [("sglang-0.5.12", "0.5.12.post1"), ("sglang-0.5.13", "0.5.13.post1")]
PROBE = REPO / "scripts" / "ddtree_verify_probe.py"


def _probe_module():
    # Loaded by path: scripts/ is not a package. Its module level is stdlib-only.
    spec = importlib.util.spec_from_file_location("ddtree_verify_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = _probe_module().CASES


# ---------------------------------------------------------------------------
# pytest side: build the patched host environment once, run the probe once


def _apply_series(work: Path, family: Path, release: str) -> dict[str, bytes]:
    """Every series entry applied with GNU patch (-F0, no offset) to the pristine files."""
    from ddtree_deploy.sandbox import pristine_files

    entries = []
    for raw in (family / "series").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            entries.append(line.split())
    targets = set()
    for tokens in entries:
        if tokens[0] != "add":
            for line in (family / tokens[0]).read_text().splitlines():
                if line.startswith("+++ b/"):
                    targets.add(line[len("+++ b/"):].split("\t")[0])
    for rel, data in pristine_files(release, paths=sorted(targets)).items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    for tokens in entries:
        if tokens[0] == "add":
            (work / tokens[2]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / tokens[1], work / tokens[2])
            targets.add(tokens[2])
            continue
        run = subprocess.run(
            ["patch", "-p1", "-F0", "--no-backup-if-mismatch", "-i", str(family / tokens[0])],
            cwd=work, capture_output=True, text=True,
        )
        assert run.returncode == 0 and "offset" not in run.stdout, (
            f"{tokens[0]} does not apply exactly:\n{run.stdout}{run.stderr}"
        )
    return {rel: (work / rel).read_bytes() for rel in sorted(targets)}


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def probe_results(request, tmp_path_factory) -> dict:
    from ddtree_deploy.sandbox import make_host_env, run_python, write_kernel_standin

    name, release = request.param
    overlay = _apply_series(tmp_path_factory.mktemp("series"), REPO / "patches" / name, release)
    env = make_host_env(tmp_path_factory.mktemp("host") / "patched", overlay=overlay,
                        version=release, read_only=True)
    standin = write_kernel_standin(tmp_path_factory.mktemp("standin"))
    run = run_python(
        env, [str(PROBE), *CASES], timeout=600, extra_env={"PYTHONPATH": str(standin)}
    )
    tag = _probe_module().TAG
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(tag)]
    assert run.returncode == 0 and lines, (
        f"probe failed (rc {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len(tag):])


@pytest.mark.parametrize("case", CASES)
def test_ddtree_verify_case(probe_results: dict, case: str) -> None:
    result = probe_results[case]
    assert result == "ok", f"{case}:\n{result}"
