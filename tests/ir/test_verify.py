"""verify() catches each broken invariant with a message that names the culprit."""

import pytest

from gawee.errors import IRError
from gawee.ir.builder import GraphBuilder
from gawee.ir.core import Use
from gawee.ir.types import DType, TensorType
from gawee.ir.verify import verify


def graph():
    b = GraphBuilder("g")
    x = b.input("x", "f32[2,4]")
    y = b.relu(x)
    z = b.sigmoid(y)
    b.output(z)
    return b.graph, x, y, z


def test_valid_graph_passes():
    verify(graph()[0])


def test_out_of_order_use_is_caught():
    g, x, y, z = graph()
    relu, sig = y.producer, z.producer
    g.set_outputs([x])
    g.erase_node(sig)
    g.insert(sig, before=relu)  # sigmoid now reads relu's output before relu runs
    with pytest.raises(IRError, match="before it is defined"):
        verify(g)


def test_stale_use_list_is_caught():
    g, x, _y, z = graph()
    x._uses.append(Use(z.producer, 0))
    with pytest.raises(IRError, match="use list of %x"):
        verify(g)


def test_wrong_recorded_type_is_caught():
    g, _x, y, _z = graph()
    y.type = TensorType((2, 4), DType.f16)
    with pytest.raises(IRError, match="typed"):
        verify(g)


def test_wrong_arity_is_caught():
    g, x, y, _z = graph()
    y.producer._inputs = (x, x)
    with pytest.raises(IRError, match="operands"):
        verify(g)
