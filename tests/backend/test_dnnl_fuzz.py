"""gawee's oneDNN runtime against the reference interpreter on random small CNNs in float32, bf16 and int8.

A fixed, deterministic budget of benchmarks/dnnl_fuzz.py's cases (the script runs any number): each block is
built in every activation layout and must compute the rewritten graph's own outputs within the precision's
tolerance (the script's docstring says why each).
"""

import sys
from pathlib import Path

import pytest

from gawee.backend import dnnl
from gawee.machine import no_bf16

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import dnnl_fuzz

pytestmark = pytest.mark.skipif(dnnl.unavailable() is not None, reason=str(dnnl.unavailable()))

CASES = 12


@pytest.mark.parametrize("precision", ["f32", "bf16", "int8"])
def test_the_runtime_computes_the_graphs_outputs_in_every_layout(precision):
    if precision == "bf16" and no_bf16() is not None:  # gawee.compile keeps such a CPU in float32
        pytest.skip(no_bf16())
    seen = dnnl_fuzz.run(precision, CASES, seed=0)
    assert seen["bad"] == 0
    refused = sum(v for k, v in seen.items() if k.startswith("not run"))
    assert seen["cases"] + refused == CASES
    if precision == "f32":
        assert seen["cases"] == CASES  # float32 blocks of convolutions always run there
    if seen["cases"] and precision == "int8":
        assert seen["conv2d_int8_static"] == seen["cases"] and seen["conv2d_int8_static (requantized)"] > 0
        assert seen["a residual held as codes"] > 0  # summed from the destination (dnnl_plan._Plan.accumulator)
        assert seen["onednn_binary_int8 (requantized)"] > 0  # a multiply writing the codes a convolution reads
