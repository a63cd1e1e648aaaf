"""Sum a DDTREE_TEST_CPU file (tests/conftest.py) into the suite's CPU table, largest first.

    DDTREE_TEST_CPU=/tmp/cpu.tsv make test; python scripts/test_cpu.py /tmp/cpu.tsv [N]

Prints the N (default 30) units of work that cost the most CPU, their wall time, and the
totals: on a 2-core machine the suite can take no less wall time than its CPU over 2."""

from __future__ import annotations

import sys
from collections import defaultdict


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    top = int(argv[1]) if len(argv) > 1 else 30
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    with open(argv[0], encoding="utf-8") as lines:
        for line in lines:
            c, w, unit = line.rstrip("\n").split("\t", 2)
            cpu[unit] += float(c)
            wall[unit] += float(w)
    total = sum(cpu.values())
    print(f"{'cpu s':>8} {'wall s':>8} {'share':>6}  unit")
    for unit in sorted(cpu, key=cpu.__getitem__, reverse=True)[:top]:
        print(f"{cpu[unit]:8.1f} {wall[unit]:8.1f} {cpu[unit] / total:6.1%}  {unit}")
    print(f"{total:8.1f} {sum(wall.values()):8.1f}         all {len(cpu)} units (CPU / 2 cores: "
          f"{total / 2 / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
