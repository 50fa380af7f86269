"""benchmarks/bench_runtime.py: each method's compile time measured in a process of its own."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_runtime


def test_a_compile_is_timed_in_a_fresh_process_and_a_failure_says_why():
    seconds = bench_runtime.isolated_compile_s("resnet18", 1, "fx_fuse")
    assert 0.0 < seconds < 60.0
    with pytest.raises(RuntimeError, match="compiling no_such_method in its own process failed"):
        bench_runtime.isolated_compile_s("resnet18", 1, "no_such_method")
