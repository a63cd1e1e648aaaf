#!/usr/bin/env python3
"""The GPU check: `make gpu-check` on the lent GPU machine, `make gpu-check-dry` on CPU.

    python3 scripts/gpu_check.py [--dry-run] [--prepare] [--carry DIR] [--out DIR]

See scripts/ddtree_gpu_check/ (run.py for the order of the checks) and docs/gpu-checks.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddtree_gpu_check.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
