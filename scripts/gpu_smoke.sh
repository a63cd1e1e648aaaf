#!/usr/bin/env bash
# The prepared GPU smoke: push the DDTree series to a real GPU host, run every smoke level
# (compile, import, cli, launch), print the measured acceptance length, and (unless KEEP=1)
# roll the host back to pristine. Run it from a checkout on the controller (or on the GPU
# box itself with a `transport = "local"` inventory):
#
#     scripts/gpu_smoke.sh ct200            # hosts/ct200.toml
#     KEEP=1 scripts/gpu_smoke.sh ct200     # leave DDTree deployed afterwards
#
# What the host needs (checked by the launch level itself, with a clear error when absent):
#   - SGLang 0.5.12.post1 installed in [host].python, with its CUDA dependencies;
#   - one NVIDIA GPU with >= 40 GiB free (H100/H200/A100-80G; the default below);
#   - the models ON THE HOST, already downloaded (the smoke never downloads):
#       target  Qwen/Qwen3-8B                 (~16.4 GB, bf16)
#       draft   z-lab/Qwen3-8B-DFlash-b16      (the public DFlash draft for it, block size 16)
#     e.g. on the host: huggingface-cli download Qwen/Qwen3-8B --local-dir /models/Qwen3-8B
#                       huggingface-cli download z-lab/Qwen3-8B-DFlash-b16 --local-dir /models/Qwen3-8B-DFlash-b16
#   - in hosts/<host>.toml (see docs/smoke.md):
#       [smoke]
#       levels = ["compile", "import", "cli", "launch"]
#       [smoke.launch]
#       model = "/models/Qwen3-8B"
#       draft_model = "/models/Qwen3-8B-DFlash-b16"
#       budget = 64
#       port = 30188
#       min_free_gib = 40
#       ready_timeout_s = 900
#
# How long: push + compile/import/cli about 1 minute; launch about 3-6 minutes on one H200
# (weights load ~1 min from local disk, CUDA-graph capture of target and draft ~1-3 min,
# the probe seconds); about 5-8 minutes in all. The launch level gives up after
# ready_timeout_s (900 s by default) and stops the server's whole process group in every case.
#
# Output: the per-level summary on stdout, the full JSON report in smoke-<host>.json, and on
# a failed launch the server log copied back (its path is in the summary).
set -euo pipefail

HOST="${1:?usage: scripts/gpu_smoke.sh HOST   (hosts/HOST.toml, with [smoke.launch] set)}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CLI="${DDTREE_DEPLOY:-$REPO/.venv/bin/ddtree-deploy}"
REPORT="${REPORT:-smoke-$HOST.json}"
started=$(date +%s)

echo "== push (the push runs the host's smoke levels and rolls back by itself if one fails)"
"$CLI" push --host "$HOST"

echo "== smoke: every level, launch included"
set +e
"$CLI" smoke --host "$HOST" --level compile --level import --level cli --level launch --json >"$REPORT"
rc=$?
set -e

"$REPO/.venv/bin/python" - "$REPORT" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
if "error" in doc:
    print("smoke error:", doc["error"]["message"])
    sys.exit(0)
for level in doc["levels"]:
    print(f"  {level['level']:<8} {level['status']:<8} {level['seconds']:7.1f} s  {level['detail']}")
launch = next((l for l in doc["levels"] if l["level"] == "launch"), None)
if launch and launch["status"] == "passed":
    ev = launch["evidence"]
    print(f"acceptance length: {ev.get('accept_length')} (completion_tokens / spec_verify_ct), "
          f"avg_spec_accept_length {ev.get('avg_spec_accept_length')}")
if doc.get("log_copy"):
    print("server log copied to", doc["log_copy"])
PY

if [ "${KEEP:-0}" != "1" ]; then
    echo "== rollback to pristine (KEEP=1 leaves DDTree deployed)"
    "$CLI" rollback --host "$HOST"
fi
echo "== done in $(( $(date +%s) - started )) s; smoke exit code $rc; report in $REPORT"
exit "$rc"
