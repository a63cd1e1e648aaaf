#!/usr/bin/env bash
# DDTree core on a GPU: the same tests as CI, run on CUDA, then the benchmark on CUDA.
# Under 5 minutes on one GPU. Needs torch with CUDA (and pytest) in $PY (default: the
# project's .venv if present, else python3); sgl_kernel is optional (when importable, greedy
# verify is also compared with SGLang's own verify_tree_greedy kernel).
#
#   scripts/gpu_check_ddtree.sh            # tests + benchmark
#   scripts/gpu_check_ddtree.sh --tests    # tests only
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

"$PY" - <<'PYEOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check_ddtree: torch sees no CUDA device (torch %s)" % torch.__version__)
print("gpu_check_ddtree: torch %s on %s" % (torch.__version__, torch.cuda.get_device_name(0)))
try:
    import sgl_kernel  # noqa: F401
    print("gpu_check_ddtree: sgl_kernel present: greedy verify is compared with it")
except Exception as exc:  # optional
    print("gpu_check_ddtree: no sgl_kernel (%s): that comparison is skipped" % type(exc).__name__)
PYEOF

export DDTREE_TEST_DEVICE=cuda DDTREE_BENCH_DEVICE=cuda
# The end-to-end tiny-Llama test (tests/integration/test_ddtree_e2e.py) is CPU-defined and is left to CI.
timeout 200 "$PY" -m pytest -q -p no:cacheprovider -rs \
  tests/integration/test_ddtree_build.py tests/integration/test_ddtree_optimal.py \
  tests/integration/test_ddtree_accept.py tests/integration/test_ddtree_cuda.py tests/integration/test_ddtree_utils_issue12.py

if [ "${1:-}" != "--tests" ]; then
  timeout 90 "$PY" -m bench ddtree_bench
fi
echo "gpu_check_ddtree: OK"
