"""The mutation API keeps use lists right on both sides; erasing a used node is refused."""

import pytest
import torch

from gawee.errors import IRError
from gawee.ir.builder import GraphBuilder
from gawee.ir.verify import verify


def small():
    b = GraphBuilder("g")
    x = b.input("x", "f32[2,4]")
    y = b.relu(x)
    z = b.add(y, x)
    w = b.mul(z, 2.0)
    b.output(w)
    return b.graph, x, y, z, w


def test_uses_follow_operands():
    g, x, y, _z, w = small()
    assert [(u.node.op, u.index) for u in x.uses] == [("relu", 0), ("add", 1)]
    assert [u.node.op for u in y.uses] == ["add"]
    assert w.num_uses == 1 and w.is_graph_output
    verify(g)


def test_set_input_updates_both_sides():
    g, x, y, z, _ = small()
    add = z.producer
    add.set_input(0, x)
    assert add.inputs == (x, x)
    assert y.uses == ()
    assert [u.index for u in x.uses if u.node is add] == [1, 0]
    verify(g)


def test_replace_all_uses_includes_graph_outputs():
    g, _x, _y, z, w = small()
    changed = g.replace_all_uses_with(w, z)
    assert changed == []
    assert g.outputs == (z,)
    assert not w.is_graph_output and z.is_graph_output
    g.erase_node(w.producer)
    verify(g)


def test_replace_all_uses_refuses_type_change():
    b = GraphBuilder()
    x = b.input("x", "f32[2,4]")
    y = b.reshape(x, shape=[8])
    b.output(y)
    with pytest.raises(IRError, match="exact shape and dtype"):
        b.graph.replace_all_uses_with(y, x)


def test_erase_used_node_names_the_users():
    g, _x, y, _z, w = small()
    with pytest.raises(IRError, match=r"still used by add"):
        g.erase_node(y.producer)
    with pytest.raises(IRError, match="graph output"):
        g.erase_node(w.producer)


def test_erase_drops_operand_uses():
    g, x, y, z, w = small()
    g.set_outputs([y])
    g.erase_node(w.producer)
    g.erase_node(z.producer)
    assert [u.node.op for u in x.uses] == ["relu"]
    assert len(g) == 1
    verify(g)


def test_insert_before_and_positions():
    g, x, y, z, w = small()
    n = g.create_node("neg", [x], before=z.producer)
    assert [node.op for node in g] == ["relu", "neg", "add", "mul"]
    assert g.position(y.producer) < g.position(n) < g.position(z.producer) < g.position(w.producer)
    verify(g)


def test_iteration_survives_erasing_current_node():
    g, x, y, _z, w = small()
    g.set_outputs([y])
    seen = []
    for node in g:
        seen.append(node.op)
        if node.op == "add":  # erase the current node and the one after it
            g.erase_node(w.producer)
            g.erase_node(node)
    assert seen == ["relu", "add"]
    assert [n.op for n in g] == ["relu"] and [u.node.op for u in x.uses] == ["relu"]


def test_clone_is_independent_and_identical():
    g, *_ = small()
    c = g.clone()
    assert str(c) == str(g)
    c.set_outputs([c.inputs[0]])
    for node in reversed(c.nodes):
        c.erase_node(node)
    assert len(g) == 3 and len(c) == 0
    verify(g)


def test_unique_names():
    g, *_ = small()
    names = [g.unique_name("relu") for _ in range(3)]
    assert names == ["relu_1", "relu_2", "relu_3"]


def test_attrs_are_frozen_and_checked():
    b = GraphBuilder()
    x = b.input("x", "f32[1,2,3]")
    y = b.permute(x, dims=[2, 0, 1])
    assert y.producer.attrs["dims"] == (2, 0, 1)
    with pytest.raises(IRError, match="has no attribute 'dimz'"):
        b.permute(x, dimz=[0, 1, 2])
    with pytest.raises(IRError, match="needs attribute 'dims'"):
        b.permute(x)
    with pytest.raises(IRError, match="must be ints"):
        b.permute(x, dims="012")


def test_constant_values_and_printer():
    b = GraphBuilder("p")
    x = b.input("x", "f32[2]")
    w = b.const(torch.ones(2), "w")
    y = b.mul(b.add(x, w), 0.5)
    b.output(y)
    text = str(b.graph)
    assert "graph p(%x: f32[2]) {" in text
    assert "= add(%x, %w) : f32[2]" in text
    assert "mul(%add, 0.5:f32)" in text
    assert text.rstrip().endswith("return %mul\n}")


def test_a_types_hash_is_kept_and_not_carried_to_another_process():
    """A type's hash is computed once and kept; a pickled (or copied) type is rebuilt from its fields, since a
    hash kept from another process (salted str hashes) would be wrong in this one."""
    import copy
    import pickle

    from gawee.ir.types import DType, Layout, TensorType

    t = TensorType((2, 3), DType.f16, Layout.contiguous)
    assert t._hash is None and hash(t) == hash(((2, 3), DType.f16, Layout.contiguous)) and t._hash == hash(t)
    for again in (pickle.loads(pickle.dumps(t)), copy.deepcopy(t), copy.copy(t)):
        assert again == t and again._hash is None and hash(again) == hash(t)
    assert {t: 1}[TensorType((2, 3), DType.f16)] == 1 and repr(t) == "f16[2,3]"
