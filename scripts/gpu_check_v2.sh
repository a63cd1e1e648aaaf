#!/usr/bin/env bash
# Prepared GPU check of DDTree on SGLang's v2 worker (family patches/sglang-0.5.20/, default
# release 0.5.23): the worker's tree build + EAGLE lineage against SGLang's real CUDA kernels,
# then a served tiny target + DFlash draft with CUDA graphs and the overlap scheduler on.
# Under 10 minutes on one GPU; no network. See docs/patches-v2.md ("The worker").
#
# Needs on the GPU machine: a Python 3.11 whose site-packages already run SGLang 0.5.20+ on
# CUDA (torch with CUDA, triton, flashinfer, sglang-kernel and SGLang's other dependencies:
# any environment that serves that release), and GNU patch.
# Carries (from this checkout): patches/, payload/, scripts/, tests/ (data/models and the
# kernel stand-ins it compares with), and the SGLang wheel (~40 MB): $SGLANG_WHEEL, else
# .gpu-carry/sglang-$RELEASE-*.whl, else the toolkit's cache (~/.cache/ddtree-deploy/wheels/).
#
# Steps: (1) the release wheel + the v2 series into a temp folder first on PYTHONPATH;
# (2) kernels: DDTree trees (batch 32, budget 64/256) through build_tree_kernel_efficient,
# verify_tree_greedy and tree_speculative_sampling_target_only on CUDA equal the DDTree
# reference and the CPU stand-ins, and the tree build runs with no host sync
# (torch.cuda.set_sync_debug_mode("error")); (3) serve: triton and flashinfer, plain greedy vs
# DFLASH vs DDTREE greedy (tokens must equal plain greedy) and DDTREE sampling; prints accept
# length and tokens/s, DDTree vs DFlash. Logs in $OUT. Exit 0 only if every step passed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
RELEASE=${RELEASE:-0.5.23}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
WHEEL=${SGLANG_WHEEL:-}
if [ -z "$WHEEL" ]; then
    for candidate in .gpu-carry/sglang-"$RELEASE"-*.whl \
        "$HOME"/.cache/ddtree-deploy/wheels/sglang-"$RELEASE"-*.whl; do
        if [ -f "$candidate" ]; then WHEEL=$candidate; break; fi
    done
fi
if [ -z "$WHEEL" ] || [ ! -f "$WHEEL" ]; then
    echo "gpu_check_v2: no SGLang $RELEASE wheel: set SGLANG_WHEEL or put it in .gpu-carry/" >&2
    exit 2
fi
if ! "$PY" -c 'import torch, triton; assert torch.cuda.is_available()' 2>"$OUT/precheck.txt"; then
    echo "gpu_check_v2: $PY lacks CUDA torch / triton (see $OUT/precheck.txt)" >&2
    exit 2
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "[1/3] SGLang $RELEASE + the v2 series, first on PYTHONPATH" >&2
SP=$WORK/site-packages
"$PY" scripts/gpu_check_v2.py install --wheel "$WHEEL" --site-packages "$SP" | tee "$OUT/install.txt"
export PYTHONPATH="$SP${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import sglang, sglang.srt.speculative.ddtree_worker_v2 as w; print("sglang", sglang.__version__, w.__file__, w.DDTreeWorkerV2.DDTREE_TREE_VERIFY)' \
    | tee -a "$OUT/install.txt"

status=0
echo "[2/3] tree build + lineage vs SGLang's CUDA tree kernels, no host sync" >&2
timeout 150 "$PY" scripts/gpu_check_v2.py kernels >"$OUT/kernels.txt" 2>&1 || status=1
grep '^GPU-V2:' "$OUT/kernels.txt" >&2 || tail -n 30 "$OUT/kernels.txt" >&2

echo "[3/3] served tiny target + draft: plain / DFLASH / DDTREE, triton + flashinfer" >&2
timeout 420 "$PY" scripts/gpu_check_v2.py serve >"$OUT/serve.txt" 2>&1 || status=1
grep '^GPU-V2:' "$OUT/serve.txt" >&2 || tail -n 40 "$OUT/serve.txt" >&2

if [ "$status" -ne 0 ]; then
    echo "gpu_check_v2: FAILED (logs in $OUT)" >&2
else
    echo "gpu_check_v2: passed (logs in $OUT)" >&2
fi
exit "$status"
