"""Each target's lowering table: which ops it cannot lower is written down here, so that a new op without a
lowering, or a lowering taken away, is a choice someone made and not an accident."""

from __future__ import annotations

from pathlib import Path

import pytest

from gawee.backend.lower_mlir import MLIR
from gawee.backend.lower_onnx import ONNX
from gawee.backend.lower_torch import TORCH
from gawee.backend.lowering import LoweringTable
from gawee.backend.ops_reference import reference
from gawee.ops import OPAQUE, all_ops
from gawee.ops.quantized import RULE_ONLY
from gawee.ops.targets import TARGET_OPS

TABLES = {"torch": TORCH, "onnx": ONNX, "mlir": MLIR}

REFERENCE_DEFAULT = frozenset({"torch"})
"""Targets that run an op without an entry by its reference semantics (``OpDef.evaluate``): every op lowers."""

CANNOT_LOWER = {
    "torch": frozenset(),
    "onnx": frozenset(
        {
            OPAQUE,  # an arbitrary ATen call runs through torch only
            "index_put",  # no ONNX form yet (ScatterND with accumulate and a broadcast value would be one)
            *RULE_ONLY,  # int8 quantization (DynamicQuantizeLinear + MatMulInteger would be one for the linear)
            *TARGET_OPS,  # oneDNN's target ops: only its own target phase makes them, on the graph it builds
        }
    ),
    "mlir": frozenset({OPAQUE, *RULE_ONLY, *TARGET_OPS}),  # int8 quantization: no StableHLO form yet
}
"""Per target, the registered ops it cannot lower. Adding an op without a lowering for a target means adding it
here; giving one a lowering means taking it out."""


@pytest.mark.parametrize("target", sorted(TABLES))
def test_the_ops_a_target_cannot_lower_are_the_listed_ones(target):
    table = TABLES[target]
    missing = frozenset() if target in REFERENCE_DEFAULT else frozenset(all_ops()) - set(table.ops())
    assert missing == CANNOT_LOWER[target], (
        f"{target} cannot lower {sorted(missing - CANNOT_LOWER[target])} (give them a lowering, or list them in "
        f"CANNOT_LOWER); it lowers {sorted(CANNOT_LOWER[target] - missing)} now (take them out of CANNOT_LOWER)"
    )


@pytest.mark.parametrize("target", sorted(TABLES))
def test_every_entry_is_a_registered_op(target):
    stale = sorted(set(TABLES[target].ops()) - set(all_ops()))
    assert not stale, f"the {target} table lowers ops the registry does not have: {stale}"


def test_an_op_registers_once_per_table():
    table = LoweringTable("demo")
    table.add("relu", "Relu")
    with pytest.raises(ValueError, match="op 'relu' has two demo lowerings"):
        table.register("relu")(lambda c: c)


def test_docs_ops_md_is_current():
    doc = Path(__file__).resolve().parents[2] / "docs" / "ops.md"
    assert doc.read_text() == reference(), "regenerate it: python -m gawee.backend.ops_reference > docs/ops.md"
