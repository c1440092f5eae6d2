"""Benchmarks: each prints ratios against raw limits measured in the same run."""
