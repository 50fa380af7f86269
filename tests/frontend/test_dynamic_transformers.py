"""One compile of BERT with a dynamic sequence length serves lengths 7, 32 and 77."""

import pytest
import torch
from torch.export import Dim

import gawee

pytest.importorskip("transformers")


def _text(n: int, vocab: int = 1000):
    ids = torch.randint(0, vocab, (2, n))
    mask = torch.ones(2, n, dtype=torch.long)
    mask[:, n - n // 4 :] = 0
    return ids, mask


@pytest.mark.parametrize("family", ["hf:bert:seq=80"])
def test_dynamic_sequence_length(family):
    from gawee.frontend.families import hugging_face

    torch.manual_seed(0)
    model, inputs = hugging_face(family, 2, "cpu")
    seq = Dim("seq", min=2, max=80)
    module = gawee.compile(model, inputs, dynamic_shapes=(({1: seq}, {1: seq}),))
    report = module.gawee_report
    assert report.rewrite.firings["fuse_linear_gelu"] == 2  # every fusion of the static capture
    (s,) = {d for v in report.graph.inputs for d in v.shape if not isinstance(d, int)}
    assert (s.lo, s.hi) == (2, 80)
    for n in (7, 32, 77):
        xs = _text(n)
        with torch.no_grad():
            ref = model(*xs)
        got = module(*xs)
        assert got.shape == (2, n, 64)
        assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)
        assert torch.allclose(gawee.run(report.optimized, *xs)[0], ref, atol=1e-4, rtol=1e-4)
