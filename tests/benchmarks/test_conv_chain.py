"""benchmarks/conv_chain.py: a chain of convolutions timed through each runtime, per convolution."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import conv_chain


def test_a_chain_alternates_dense_and_depthwise_convolutions():
    model = conv_chain.chain(8, "alt", 4)
    groups = [m.groups for m in model if isinstance(m, torch.nn.Conv2d)]
    assert groups == [1, 8, 1, 8] and sum(isinstance(m, torch.nn.ReLU) for m in model) == 4


def test_every_runtime_computes_the_chain_and_is_timed(capsys):
    model, x = conv_chain.chain(8, "alt", 2), torch.randn(1, 8, 4, 4)
    found = conv_chain.runtimes(model, x)
    assert {"eager", "torch lowering NCHW", "torch lowering NHWC"} <= set(found)
    from gawee.backend import dnnl

    primitives = {f"oneDNN primitives {layout}" for layout in dnnl.LAYOUTS}
    assert primitives <= set(found) or dnnl.unavailable() is not None
    with torch.no_grad():
        expected = model(x)
        for name, fn in found.items():
            got = fn()
            got = got[0] if isinstance(got, (tuple, list)) else got
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=name)
    assert conv_chain.main(["--chains", "8x4:alt", "--convs", "2", "--calls", "2"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("8x4:alt: eager ") and "torch lowering NHWC " in line
