"""benchmarks/bench_allocator.py: each allocator setting timed in processes of their own."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_allocator


def test_the_allocator_bench_times_each_setting_in_processes_of_their_own(capsys):
    lines = bench_allocator.rows(["resnet18"], [1], ["torch"], runs=1)
    assert len(lines) == 3 and lines[2].startswith("| resnet18 | 1 | torch | ") and lines[2].endswith("× |")
    plain, kept = lines[2].split(" | ")[3:5]
    for cell in (plain, kept):  # "<ms> (<page faults per call>)"
        ms, faults = cell.rstrip(")").split(" (")
        assert float(ms) > 0 and float(faults) >= 0
    assert capsys.readouterr().out.splitlines()[-1] == lines[2]
