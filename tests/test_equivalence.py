"""verify_equivalent compares shapes, dtypes and numbers with a per-dtype tolerance."""

import torch

import gawee
from gawee.ir.builder import GraphBuilder


def pair(second_op="relu", scale=1.0):
    graphs = []
    for op in ("relu", second_op):
        b = GraphBuilder()
        x = b.input("x", "f32[8]")
        b.output(b.mul(b.node(op, x).outputs[0], scale if op != "relu" else 1.0))
        graphs.append(b.graph)
    return graphs


def test_equal_graphs_are_equivalent():
    a, b = pair()
    r = gawee.verify_equivalent(a, b, trials=3)
    assert r.ok and r.max_error == 0.0 and "equivalent" in str(r)


def test_a_numeric_difference_is_caught():
    a, b = pair("abs")
    r = gawee.verify_equivalent(a, b)
    assert not r.ok and r.max_error > 0 and "NOT equivalent" in str(r)


def test_small_float_noise_is_within_tolerance():
    a, b = pair("relu")
    x = torch.randn(8)
    r = gawee.verify_equivalent(a, b, [x])
    assert r.ok


def test_nan_positions_must_agree():
    b1 = GraphBuilder()
    x = b1.input("x", "f32[3]")
    b1.output(b1.sqrt(x))
    b2 = GraphBuilder()
    x = b2.input("x", "f32[3]")
    b2.output(b2.sqrt(b2.abs(x)))
    r = gawee.verify_equivalent(b1.graph, b2.graph, [torch.tensor([-1.0, 4.0, 9.0])])
    assert not r.ok and r.max_error == float("inf")


def test_different_signatures_are_reported():
    b1 = GraphBuilder()
    b1.output(b1.relu(b1.input("x", "f32[3]")))
    b2 = GraphBuilder()
    b2.output(b2.relu(b2.input("x", "f32[4]")))
    r = gawee.verify_equivalent(b1.graph, b2.graph)
    assert not r.ok and "inputs differ" in r.problem
