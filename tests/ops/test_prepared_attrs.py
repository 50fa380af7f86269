"""OpDef.prepare_attrs keeps what it prepared: same answers, fresh dicts, values told apart by type."""

import torch

from gawee.ir.types import TensorType
from gawee.ops import base, get_op


def test_prepared_attributes_are_kept_and_handed_out_fresh(monkeypatch):
    op = get_op("transpose")
    rank3, rank4 = [TensorType.of(torch.empty(2, 3, 4))], [TensorType.of(torch.empty(2, 3, 4, 5))]
    base._PREPARED.clear()
    calls = []
    real = base.OpDef._prepare
    monkeypatch.setattr(base.OpDef, "_prepare", lambda *a: calls.append(1) or real(*a))
    first = op.prepare_attrs({"dim0": -2, "dim1": -1}, rank3)
    assert first == {"dim0": 1, "dim1": 2}  # canonicalized for rank 3
    first["dim0"] = 99
    assert op.prepare_attrs({"dim0": -2, "dim1": -1}, rank3) == {"dim0": 1, "dim1": 2}
    assert len(calls) == 1  # the second came from the cache, untouched by the caller's edit
    assert op.prepare_attrs({"dim0": -2, "dim1": -1}, rank4) == {"dim0": 2, "dim1": 3}
    assert len(calls) == 2  # other operand types: prepared again


def test_keys_tell_apart_what_equality_does_not():
    assert base._typed((1, 2)) != base._typed((True, 2)) != base._typed((1.0, 2))
    assert base._typed(0.0) != base._typed(-0.0) and base._typed([1]) != base._typed((1,))
