"""The command line's --dynamic short form and its capture."""

import pytest
import torch
from torch.export import Dim

from gawee.errors import ModelSpecError
from gawee.frontend.dynamic import dynamic_spec


class Two(torch.nn.Module):
    def forward(self, x, ids):
        return x.sum() + ids.sum()


class Star(torch.nn.Module):
    def forward(self, *tensors):
        return tensors[0]


def _names(spec):
    return [None if d is None else {k: v.__name__ for k, v in d.items()} for d in spec]


def test_shorthands_mark_every_input():
    x, ids = torch.randn(1, 3, 8), torch.zeros(1, 5, dtype=torch.long)
    spec, (x2, ids2) = dynamic_spec("batch", Two(), (x, ids))
    assert _names(spec) == [{0: "batch"}, {0: "batch"}]
    assert x2.shape == (2, 3, 8) and ids2.shape == (2, 5)  # size 1 would be specialized by export
    spec, _ = dynamic_spec("seq", Two(), (x, ids))
    assert _names(spec) == [{1: "seq"}, {1: "seq"}]


def test_named_items_share_sizes_by_index_or_name():
    x, ids = torch.randn(2, 3, 8), torch.zeros(2, 5, dtype=torch.long)
    spec, _ = dynamic_spec("x:0,ids:1", Two(), (x, ids))
    assert _names(spec) == [{0: "dim0"}, {1: "dim1"}]
    spec, _ = dynamic_spec("x:-1=n,1:0=n", Two(), (x, ids))
    assert _names(spec) == [{2: "n"}, {0: "n"}]
    (inner,), _ = dynamic_spec("tensors_0:0", Star(), (x,))  # *args: nested one level, as export wants
    assert _names(inner) == [{0: "dim0"}]
    assert isinstance(spec[0][2], type(Dim("a")))


@pytest.mark.parametrize(
    ("text", "message"), [("y:0", "no input 'y'"), ("x", "INPUT:DIM"), ("x:5", "has 3 dimensions")]
)
def test_bad_specs_are_typed_errors(text, message):
    with pytest.raises(ModelSpecError, match=message):
        dynamic_spec(text, Two(), (torch.randn(2, 3, 8), torch.zeros(2, 5)))


def test_cli_optimize_dynamic_batch_shows_formulas(capsys):
    from gawee.cli import main

    code = main(["optimize", "resnet18", "--dynamic", "batch", "--input-shape", "1,3,32,32", "--no-verify"])
    out = capsys.readouterr().out
    assert code == 0
    assert "FLOPs formula" in out and "rules fired: fold_conv_bn x20, fuse_conv_relu x17, fuse_conv_residual x8" in out
