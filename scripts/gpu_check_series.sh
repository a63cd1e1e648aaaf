#!/usr/bin/env bash
# Prepared GPU check of the DDTree series on SGLang 0.5.12.post1 (patches 0004/0005:
# the tree verify input and the worker wiring) with SGLang's real CUDA kernels.
# Under 10 minutes on one GPU; no network. See docs/patches-0004-0005.md.
#
# Needs on the GPU machine: a Python 3.11 whose site-packages already run SGLang
# 0.5.12.x on CUDA (torch with CUDA, sgl_kernel, triton and SGLang's other
# dependencies: any environment that serves SGLang 0.5.12.x), and GNU patch.
# Carries (from this checkout): patches/, payload/, scripts/, tests/data/models/, and
# the SGLang 0.5.12.post1 wheel (~8 MB): $SGLANG_WHEEL, else .gpu-carry/*.whl, else
# the toolkit's wheel cache (~/.cache/ddtree-deploy/wheels/).
#
# Steps: (1) the release wheel and the patched files installed into a temp folder put
# first on PYTHONPATH (ahead of any SGLang the machine has; no venv, so a machine whose
# python is itself a venv keeps its packages); (2) the verify-input probe with --device cuda
# (verify_tree_greedy / tree_speculative_sampling_target_only / the batched tree
# builder on CUDA, every result against brute force); (3) served tiny targets (random, and a
# cycle target with a draft built from its own weights) with --speculative-algorithm DDTREE on
# Triton and FlashInfer, greedy and sampling, against plain greedy and DFLASH.
# Writes its logs to $OUT (or a temp folder). Exit 0 only if every step passed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
WHEEL=${SGLANG_WHEEL:-}
if [ -z "$WHEEL" ]; then
    for candidate in .gpu-carry/sglang-0.5.12.post1-*.whl \
        "$HOME"/.cache/ddtree-deploy/wheels/sglang-0.5.12.post1-*.whl; do
        if [ -f "$candidate" ]; then WHEEL=$candidate; break; fi
    done
fi
if [ -z "$WHEEL" ] || [ ! -f "$WHEEL" ]; then
    echo "gpu_check_series: no SGLang 0.5.12.post1 wheel: set SGLANG_WHEEL or put it in .gpu-carry/" >&2
    exit 2
fi
if ! "$PY" -c 'import torch, sgl_kernel, triton; assert torch.cuda.is_available()' 2>"$OUT/precheck.txt"; then
    echo "gpu_check_series: $PY lacks CUDA torch / sgl_kernel / triton (see $OUT/precheck.txt)" >&2
    exit 2
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "[1/3] SGLang 0.5.12.post1 + the series, first on PYTHONPATH" >&2
SP=$WORK/site-packages
"$PY" scripts/gpu_check_series.py install --wheel "$WHEEL" --site-packages "$SP" \
    | tee "$OUT/install.txt"
export PYTHONPATH="$SP${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import sglang, sglang.srt.speculative.ddtree_utils as du; print("sglang", sglang.__version__, sglang.__file__, du.__file__)' \
    | tee -a "$OUT/install.txt"

echo "[2/3] tree verify on CUDA (SGLang kernels vs brute force)" >&2
status=0
timeout 240 "$PY" scripts/ddtree_verify_probe.py --device cuda --strict gpu \
    >"$OUT/verify.txt" 2>&1 || status=1
tail -n 20 "$OUT/verify.txt" >&2

echo "[3/3] served tiny targets + a draft from the target's weights: Triton + FlashInfer, greedy + sampling" >&2
timeout 540 "$PY" scripts/gpu_check_series.py serve --models tests/data/models \
    >"$OUT/serve.txt" 2>&1 || status=1
grep '^GPU-SERVE:' "$OUT/serve.txt" >&2 || tail -n 40 "$OUT/serve.txt" >&2

if [ "$status" -ne 0 ]; then
    echo "gpu_check_series: FAILED (logs in $OUT)" >&2
else
    echo "gpu_check_series: passed (logs in $OUT)" >&2
fi
exit "$status"
