"""Layouts in the rule language: `x.layout` and `layout(x)` in guards, and the harness drawing both layouts."""

import pytest
import torch

from gawee import load_rules_text
from gawee.errors import RuleError
from gawee.ir.builder import GraphBuilder
from gawee.ir.types import DType, Layout, TensorType
from gawee.rewrite.driver import rewrite
from gawee.testing import check_rule
from gawee.testing.generate import in_layout

DROP = """
# to_layout(x, l) with x in l -> x
rule drop:
    to_layout(x, layout=l) where {guard} => x
"""


@pytest.mark.parametrize("guard", ["x.layout == l", "layout(x) == l"])
def test_a_layout_guard_reads_each_values_layout(guard):
    rules = load_rules_text(DROP.format(guard=guard))
    b = GraphBuilder("g")
    x = b.input("x", TensorType((1, 2, 3, 3), DType.f32, Layout.channels_last))
    again = b.to_layout(b.to_layout(x, layout="channels_last"), layout="contiguous")
    g = b.output(b.relu(again))
    after, report = rewrite(g, rules)
    assert report.firings == {"drop": 1}  # the first conversion only: the second changes the layout
    assert [n.op for n in after] == ["to_layout", "relu"] and after.nodes[0].output.type.layout is Layout.contiguous


def test_layout_is_a_string_field():
    with pytest.raises(RuleError, match="expected a number, this is a str"):
        load_rules_text("rule r: relu(x) where x.layout + 1 => x")


@pytest.mark.parametrize("wanted", ["channels_last", "contiguous"])
def test_the_harness_draws_both_layouts_when_a_guard_reads_them(wanted):
    rule = load_rules_text(
        f"""
# relu(x), x {wanted} -> relu(relu(x)) (relu is idempotent: what matters is which layouts are drawn)
rule r:
    relu(x) where x.layout == "{wanted}" and x.rank == 4 => relu(relu(x))
"""
    ).rules[0]
    seen = []

    def record(ex, xs):  # x's data as the instance runs it: an input, or a constant
        x = ex.bindings["x"]
        seen.append(xs[ex.graph.inputs.index(x)] if x in ex.graph.inputs else x.data)

    result = check_rule(rule, examples=60, seed=0, on_example=record)
    assert result.verdict in ("proven", "sound") and result.hit_rate >= 0.3
    drawn = {Layout.of(x) for x in seen if x.dim() == 4 and x.shape[1] > 1 and x.shape[2] * x.shape[3] > 1}
    assert Layout(wanted) in drawn  # in memory, as the types say


def test_inputs_are_stored_in_their_types_layout():
    x = torch.randn(2, 3, 4, 5)
    assert Layout.of(in_layout(x, Layout.channels_last)) is Layout.channels_last
    assert in_layout(x, Layout.contiguous) is x and in_layout(torch.randn(3), Layout.channels_last).dim() == 1
