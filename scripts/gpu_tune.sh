#!/usr/bin/env bash
# Prepared GPU run of `ddtree-deploy tune` (issue 15): a tiny target/draft pair served by a
# REAL SGLang 0.5.12.post1 with the DDTree series, swept by the real tune command with
# SGLang's own bench_serving; prints the ranked table and the choice. Under 10 minutes on
# one GPU; no network. (Not yet run on a GPU: the session that wrote it had none.)
#
# Needs on the GPU machine: a Python 3.11 ($PYTHON) whose site-packages run SGLang 0.5.12.x
# on CUDA (torch with CUDA, sgl_kernel, triton, datasets and SGLang's other dependencies),
# this toolkit importable by it (`pip install -e '.[tune]'` from this checkout: typer, rich,
# paramiko, fabric, unidiff, tomlkit, matplotlib), and the SGLang 0.5.12.post1 wheel
# ($SGLANG_WHEEL, else .gpu-carry/*.whl, else ~/.cache/ddtree-deploy/wheels/).
#
# Steps: (1) the pristine release into a temp site-packages put first on PYTHONPATH;
# (2) the models of scripts/gpu_check_series.py (the CYCLE target, whose greedy orbit is
# 10 -> 11 -> 12, and the pass-through draft built from its weights: a chain accepts <= 2
# tokens per step, a tree ~5) plus a word-level tokenizer, so SGLang and bench_serving
# both have one; (3) a `transport = "local"` inventory and a real `ddtree-deploy push`
# (the journal must say DDTree is deployed); (4) `ddtree-deploy tune`: DFlash chain and no
# speculation, then budgets 8/32/128 x top-K 2/4, concurrency 1 and 8, 32 prompts of
# 64 + 64 tokens, one noise repeat. Expected: DDTree beats the chain by a wide margin
# (accept length ~4-5 vs <= 2). Writes everything to $OUT (results.jsonl, tune.png, logs).
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
    echo "gpu_tune: no SGLang 0.5.12.post1 wheel: set SGLANG_WHEEL or put it in .gpu-carry/" >&2
    exit 2
fi
if ! "$PY" -c 'import torch, sgl_kernel, triton, datasets; assert torch.cuda.is_available()' 2>"$OUT/precheck.txt"; then
    echo "gpu_tune: $PY lacks CUDA torch / sgl_kernel / triton / datasets (see $OUT/precheck.txt)" >&2
    exit 2
fi
if ! "$PY" -c 'import ddtree_deploy.cli, tomlkit, matplotlib' 2>>"$OUT/precheck.txt"; then
    echo "gpu_tune: $PY cannot import this toolkit: pip install -e '.[tune]' (see $OUT/precheck.txt)" >&2
    exit 2
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SP=$WORK/site-packages
echo "[1/4] pristine SGLang 0.5.12.post1 first on PYTHONPATH" >&2
"$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$WHEEL" "$SP"
export PYTHONPATH="$SP${PYTHONPATH:+:$PYTHONPATH}"

echo "[2/4] tiny cycle target + pass-through draft + tokenizer" >&2
"$PY" - "$WORK/models" <<'PYEOF'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
import gpu_check_series as g
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

dest = Path(sys.argv[1])
src = Path("tests/data/models")
target = g._cycle_target(src, dest / "target")
g._passthrough_draft(src, dest / "draft")
# A word-level tokenizer over the target's 512 ids ("w0".."w511"): SGLang detokenizes with
# it, bench_serving counts and builds its random-id prompts with it.
vocab = {f"w{i}": i for i in range(512)}
tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tk.decoder = decoders.WordPiece(prefix="##")
PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0", bos_token="w1",
                        eos_token="w2").save_pretrained(str(target))
print("models in", dest)
PYEOF

PORT=${PORT:-30199}
mkdir -p "$WORK/hosts"
INV=$WORK/hosts/gpu-tune.toml
cat >"$INV" <<TOML
# gpu_tune.sh: this machine, through the local transport
transport = "local"

[host]
python = "$(command -v "$PY")"
state_dir = "$WORK/state"

[smoke]
levels = ["compile"]

[smoke.launch]
model = "$WORK/models/target"
draft_model = "$WORK/models/draft"
budget = 64
port = $PORT
extra_args = ["--attention-backend", "triton", "--dtype", "float32", "--mem-fraction-static", "0.3",
              "--disable-cuda-graph", "--log-level", "warning"]
min_free_gib = 4
ready_timeout_s = 300
term_grace_s = 20
TOML

CLI=("$PY" -m ddtree_deploy)
echo "[3/4] push the series (local transport; journal -> deployed)" >&2
# The host's own files as its pristine snapshot (offline: no release download), in a
# throwaway snapshot folder, then the real push.
export DDTREE_DEPLOY_SNAPSHOT="$WORK/snapshot"
"${CLI[@]}" snapshot pull --host "$INV" 2>&1 | tail -n 3 >&2
"${CLI[@]}" push --host "$INV" --no-smoke 2>&1 | tail -n 5 >&2

echo "[4/4] tune (8 or 9 launches; the table follows)" >&2
status=0
timeout 480 "${CLI[@]}" tune --host "$INV" --baseline dflash,none --budgets 8,32,128 --topk 2,4 \
    --concurrency 1,8 --requests 32 --input-len 64 --output-len 64 --repeats 1 \
    --out "$OUT/tune" 2>"$OUT/tune-progress.txt" | tee "$OUT/tune-table.txt" || status=$?
tail -n 5 "$OUT/tune-progress.txt" >&2
cp -r "$WORK/state/tune" "$OUT/host-logs" 2>/dev/null || true
if [ "$status" -ne 0 ]; then
    echo "gpu_tune: FAILED (exit $status; logs in $OUT)" >&2
else
    echo "gpu_tune: done (results, plot and logs in $OUT)" >&2
fi
exit "$status"
