"""`make demo`, interim: snapshot a PyPI release of SGLang and check the series against it.

Until the deploy commands land (push, smoke, rollback), the demo shows the
first two steps of a deploy on real release files: take the snapshot, then
apply the series in memory and byte-compile the results. While the real DDTree
series (patches/sglang-0.5.12) is incomplete, it says so and runs the small test
series from tests/data instead, with its snapshots in a temporary folder so the
committed manifests are left alone. Each command is printed before it runs.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from ddtree_deploy.errors import BadInput
from ddtree_deploy.series import families, load_family, pick_family

REPO = Path(__file__).resolve().parent.parent
VERSION = "0.5.12.post1"  # the baseline release the series is made against


def real_series_problem() -> str | None:
    """None when the family for VERSION loads; else why not (one line)."""
    try:
        load_family(pick_family(VERSION, families()).folder)
    except BadInput as exc:
        return exc.message
    return None


def run(args: list[str], overrides: dict[str, str]) -> int:
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in overrides.items())
    print(f"\n$ {shown + ' ' if shown else ''}{shlex.join(['ddtree-deploy', *args])}", flush=True)
    exe = Path(sys.executable).parent / "ddtree-deploy"
    return subprocess.run([str(exe), *args], env={**os.environ, **overrides}, cwd=REPO).returncode


def main() -> int:
    print("ddtree-deploy demo (interim): until push/smoke/rollback land, this takes a snapshot of "
          f"SGLang {VERSION} from PyPI and checks the DDTree series against it.")
    overrides: dict[str, str] = {}
    problem = real_series_problem()
    with tempfile.TemporaryDirectory(prefix="ddtree-demo-") as tmp:
        if problem is not None:
            print(f"note: the real DDTree series is not complete yet ({problem}).\n"
                  "      Running the test series from tests/data instead (snapshots in a temp folder).")
            overrides = {
                "DDTREE_DEPLOY_PATCHES": "tests/data/patches",
                "DDTREE_DEPLOY_PAYLOAD": "tests/data/payload",
                "DDTREE_DEPLOY_SNAPSHOT": tmp,
            }
        for args in (["snapshot", "release", VERSION], ["check", "--release", VERSION]):
            rc = run(args, overrides)
            if rc != 0:
                print(f"demo: `ddtree-deploy {' '.join(args)}` exited {rc}", file=sys.stderr)
                return rc
    print("\ndemo: done (exit 0).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
