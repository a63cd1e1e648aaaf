"""Run every benchmark module (or the ones named on the command line).

    python -m bench                 # all
    python -m bench ddtree_bench    # one
"""

from __future__ import annotations

import importlib
import sys
import time

# In the order docs/benchmarks.md presents them.
MODULES = ["check_bench", "ddtree_bench", "ddtree_verify_bench", "patchset_bench", "release_corpus_bench", "push_bench",
           "smoke_bench", "matrix_bench", "fleet_bench", "ansible_bench", "analysis_bench"]


def main(argv: list[str]) -> int:
    names = argv or MODULES
    for name in names:
        try:
            module = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"bench.{name}" and not argv:
                continue  # that benchmark has not landed
            raise
        print(f"\n=== bench.{name} ===", flush=True)
        started = time.perf_counter()
        module.main()
        print(f"(bench.{name} took {time.perf_counter() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
