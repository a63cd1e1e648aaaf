"""Benchmarks: `make bench` runs `python -m bench`. Each module prints ratios against a
baseline measured in the same run; none of them asserts a time."""
