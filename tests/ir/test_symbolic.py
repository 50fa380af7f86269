"""Symbolic dimensions: the Sym type, sound decisions over ranges, binding concrete shapes, JSON."""

import json

import pytest
import sympy
import torch

from gawee.ir.builder import GraphBuilder
from gawee.ir.serialize import load, save
from gawee.ir.symbolic import ShapeOutOfRange, Sym, bind, draw_values, parse, prove, subs
from gawee.ir.types import DType, TensorType
from gawee.ir.verify import verify
from gawee.ops import get_op

S = Sym("s0", 1, 64, 4)


def test_sym_identity_carries_range():
    assert Sym("s0", 1, 64, 4) == S
    assert Sym("s0", 1, 32, 4) != S  # another range is another symbol
    assert hash(Sym("s0", 1, 64, 4)) == hash(S)
    assert str(2 * S) == "2*s0" and (2 * S).free_symbols == {S}


def test_type_text_numel_and_at():
    t = TensorType((S, 3, 8), DType.f32)
    assert str(t) == "f32[s0,3,8]" and t.symbolic
    assert t.numel == 24 * S and t.nbytes == 96 * S
    assert t.at({S: 5}) == TensorType((5, 3, 8), DType.f32)
    assert not TensorType((2, 3), DType.f32).symbolic


def test_prove_is_sound_over_the_range():
    assert prove(S, "==", S) is True
    assert prove(S * 2, "==", S + S) is True
    assert prove(S, "==", 4) is None  # true at the example only
    assert prove(S, ">=", 1) is True and prove(S, "<=", 64) is True
    assert prove(S, ">", 1) is None and prove(S, "==", 0) is False
    assert prove(2 * S, ">", S) is True
    unbounded = Sym("n", 1, None, 7)
    assert prove(unbounded, "<", 10**9) is None
    assert prove(unbounded, "<=", 2**63 - 1) is True  # no tensor size exceeds int64


def test_a_slice_to_int64_max_covers_an_unbounded_size():
    """torch spells x[:, :] of a dynamic size as slice(0, 2**63 - 1): canonical [0:n], not refused."""
    n = Sym("n", 1, None, 7)
    x = TensorType((n, 3), DType.f32)
    op = get_op("slice")
    attrs = op.prepare_attrs({"dim": 0, "start": 0, "end": 2**63 - 1}, [x])
    assert (attrs["start"], attrs["end"]) == (0, n)
    assert op.infer_types([x], attrs) == [x]


def test_bind_solves_and_names_out_of_range_dims():
    assert bind([("x", (S, 3))], [(7, 3)]) == {S: 7}
    with pytest.raises(ShapeOutOfRange, match=r"input x dimension 0 is 65, outside the range of s0: 1..64"):
        bind([("x", (S, 3))], [(65, 3)])
    with pytest.raises(ShapeOutOfRange, match="dimension 1 is 4, the graph needs 3"):
        bind([("x", (S, 3))], [(2, 4)])
    with pytest.raises(ShapeOutOfRange, match="needs 10"):
        bind([("x", (S,)), ("y", (2 * S,))], [(5,), (11,)])


def test_draw_values_cover_the_range():
    rows = draw_values([S], 4)
    assert [r[S] for r in rows] == [1, 4, 16, 8]
    assert all(S.contains(r[S]) for r in rows)


def test_parse_and_subs():
    assert parse("2*s0 + 1", {"s0": S}) == 2 * S + 1
    assert parse("3", {}) == 3
    assert subs((S, 2 * S), {S: 3}) == (3, 6)
    with pytest.raises(Exception, match="undeclared"):
        parse("t0", {})


def test_symbolic_inference_through_fake_tensors():
    x = TensorType((S, 3, 16, 16), DType.f32)
    w = TensorType((8, 3, 3, 3), DType.f32)
    conv = get_op("conv2d")
    (y,) = conv.infer_types([x, w, None], conv.complete_attrs({"stride": (2, 2)}))
    assert y == TensorType((S, 8, 7, 7), DType.f32)
    reshape = get_op("reshape")
    attrs = reshape.prepare_attrs({"shape": (S, -1)}, [y])
    assert attrs["shape"] == (S, 392)
    assert reshape.infer_types([y], attrs) == [TensorType((S, 392), DType.f32)]
    # a broadcast of two different symbols is refused only if it cannot hold; s0 x 1 broadcasts
    (z,) = get_op("add").infer_types([y, TensorType((8, 1, 1), DType.f32)], {})
    assert z.shape == (S, 8, 7, 7)


def _dynamic_graph():
    b = GraphBuilder("dyn")
    x = b.input("x", TensorType((S, 4), DType.f32))
    y = b.relu(x)
    b.output(b.reshape(y, shape=(2 * S, 2)))
    return b.graph


def test_symbolic_graph_verifies_prints_and_round_trips(tmp_path):
    g = _dynamic_graph()
    verify(g)
    text = str(g)
    assert "%x: f32[s0,4]" in text and "shape=[2*s0,2]" in text and ": f32[2*s0,2]" in text
    save(g, tmp_path / "g.json")
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["version"] == 2
    assert doc["symbols"] == {"s0": {"min": 1, "max": 64, "example": 4}}
    assert doc["inputs"][0]["type"]["shape"] == ["s0", 4]
    g2 = load(tmp_path / "g.json")
    assert str(g2) == text
    assert g2.inputs[0].shape[0] == S


def test_version_1_files_still_load(tmp_path):
    b = GraphBuilder("static")
    b.output(b.relu(b.input("x", TensorType((2, 3), DType.f32))))
    save(b.graph, tmp_path / "g.json")
    doc = json.loads((tmp_path / "g.json").read_text())
    assert "symbols" not in doc
    doc["version"] = 1
    (tmp_path / "g.json").write_text(json.dumps(doc))
    assert str(load(tmp_path / "g.json")) == str(b.graph)


def test_undeclared_symbol_in_a_file_is_a_typed_error(tmp_path):
    save(_dynamic_graph(), tmp_path / "g.json")
    doc = json.loads((tmp_path / "g.json").read_text())
    del doc["symbols"]
    (tmp_path / "g.json").write_text(json.dumps(doc))
    with pytest.raises(Exception, match=r"inputs\[0\].type.shape.*undeclared symbol"):
        load(tmp_path / "g.json")


def test_interpreter_runs_every_size_in_range():
    import gawee

    g = _dynamic_graph()
    for n in (1, 3, 64):
        x = torch.randn(n, 4)
        (y,) = gawee.run(g, x)
        assert torch.equal(y, torch.relu(x).reshape(2 * n, 2))
    with pytest.raises(ShapeOutOfRange, match=r"outside the range of s0: 1\.\.64"):
        gawee.run(g, torch.randn(65, 4))
    assert isinstance(sympy.sympify("s0"), sympy.Symbol)


def test_cost_is_a_formula_and_evaluates_at_the_example():
    import gawee
    from gawee.report import Column, summary_rows

    g = _dynamic_graph()
    c = gawee.cost(g)
    assert c.symbols == [S]
    assert c.formulas() == {
        "flops": "4*s0",
        "bytes_read": "16*s0",
        "bytes_written": "16*s0",
        "peak_memory": "32*s0",
    }
    at = c.at()
    assert (at.flops, at.bytes_read, at.peak_memory) == (16, 64, 128)
    assert c.at({S: 10}).flops == 40
    assert c.as_dict()["formulas"]["flops"] == "4*s0" and c.as_dict()["flops"] == 16
    rows = {r[0]: r[1:] for r in summary_rows([Column("g", c)])}
    assert rows["FLOPs"] == ["16"] and rows["FLOPs formula"] == ["4*s0"]
