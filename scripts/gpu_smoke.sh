#!/usr/bin/env bash
# The prepared GPU smoke: push the DDTree series to a real GPU host with every smoke level
# (compile, import, cli, launch), print the proof that a tree was verified (import: DDTREE
# resolves to the family's tree worker and verify width budget + 1; launch: /server_info's
# ddtree_verify_width, ddtree_worker_class and ddtree_offchain_accepts after 8 extra
# prompts of 256 tokens), print the measured acceptance length, and (unless KEEP=1)
# roll the host back to pristine (a failed level already rolled it back). Run it from a checkout on the controller (or on the GPU
# box itself with a `transport = "local"` inventory):
#
#     scripts/gpu_smoke.sh ct200            # hosts/ct200.toml
#     KEEP=1 scripts/gpu_smoke.sh ct200     # leave DDTree deployed afterwards
#
# What the host needs (checked by the launch level itself, with a clear error when absent):
#   - SGLang 0.5.12.x or 0.5.13.x installed in [host].python, with its CUDA dependencies;
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

LEVELS=(--level compile --level import --level cli --level launch)

echo "== push, then every smoke level, launch included (a failed level rolls the host back)"
set +e
"$CLI" push --host "$HOST" "${LEVELS[@]}" --json >"$REPORT"
rc=$?
set -e
if "$REPO/.venv/bin/python" -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if "hosts" in d and d["hosts"][0].get("smoke") is None and d["ok"] else 1)' "$REPORT"; then
    echo "== already deployed (push switched nothing): smoke on its own"
    set +e
    "$CLI" smoke --host "$HOST" "${LEVELS[@]}" --json >"$REPORT"
    rc=$?
    set -e
fi

"$REPO/.venv/bin/python" - "$REPORT" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
if "error" in doc:
    print("error:", doc["error"]["message"])
    sys.exit(0)
if "hosts" in doc:  # the push document: the smoke and the auto-rollback are in it
    host = doc["hosts"][0]
    if "error" in host:
        print("error:", host["error"]["message"])
        sys.exit(0)
    print(host["summary"])
    rollback = host.get("auto_rollback")
    doc = host["smoke"]
else:
    rollback = None
for level in doc["levels"]:
    print(f"  {level['level']:<8} {level['status']:<8} {level['seconds']:7.1f} s  {level['detail']}")
launch = next((l for l in doc["levels"] if l["level"] == "launch"), None)
if launch and launch["status"] == "passed":
    ev = launch["evidence"]
    print(f"acceptance length: {ev.get('accept_length')} (completion_tokens / spec_verify_ct), "
          f"avg_spec_accept_length {ev.get('avg_spec_accept_length')}")
    tree = ev.get("tree")
    if tree:
        print(f"tree verify: width {tree['verify_width']} = budget {tree['budget']} + 1, worker "
              f"{tree['worker_class']}, {tree['offchain_accepts']} verify steps accepted an off-chain path "
              f"(after {ev.get('tree_requests', {}).get('completion_tokens')} more tokens)")
imported = next((l for l in doc["levels"] if l["level"] == "import"), None)
if imported and (imported.get("evidence") or {}).get("tree"):
    probe = imported["evidence"]["tree"]
    print(f"tree probe (import level): width {probe.get('width')}, worker "
          f"{(probe.get('worker') or {}).get('module')}.{(probe.get('worker') or {}).get('name')}")
# The tree proof (docs/patches-0004-0005.md, "Server-side report for the launch smoke"): the
# server's own report, whichever level carried it.
for level in doc["levels"]:
    proof = {k: v for k, v in (level.get("evidence") or {}).items() if k.startswith("ddtree_")}
    if proof:
        print(f"tree proof ({level['level']}): " + ", ".join(f"{k}={v}" for k, v in sorted(proof.items())))
if doc.get("log_copy"):
    print("server log copied to", doc["log_copy"])
if rollback:
    print("auto-rollback:", json.dumps(rollback)[:400])
PY

if [ "$rc" = "0" ] && [ "${KEEP:-0}" != "1" ]; then
    echo "== rollback to pristine (KEEP=1 leaves DDTree deployed)"
    "$CLI" rollback --host "$HOST"
fi
echo "== done in $(( $(date +%s) - started )) s; exit code $rc; report in $REPORT"
exit "$rc"
