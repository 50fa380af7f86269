"""What the pictures show: boxes, folded constants, provenance from the trace and from node.source."""

import torch

import gawee
from gawee.viz.view import build_view, provenance, rule_of_source, sections


def test_a_box_per_input_node_and_output_and_constants_folded_into_labels(block):
    graph, _, _ = block
    view = build_view(graph)
    kinds = [b.kind for b in view.boxes]
    assert kinds.count("input") == 1 and kinds.count("output") == 2
    assert view.num_nodes == len(graph)
    conv = view.boxes[1]
    assert (conv.title, conv.attrs, conv.consts) == ("conv2d", ("padding=[1,1]",), "weight f32[4,4,3,3]")
    assert conv.values == ("%conv2d: f32[1,4,8,8]",)
    assert view.boxes[2].consts == "const 4× f32[4]"  # batch_norm's four statistics, grouped
    mul = next(b for b in view.boxes if b.title == "mul")
    assert mul.consts == "other=2.0"  # a scalar constant by value
    # no box for a constant, and every edge joins two boxes
    ids = {b.id for b in view.boxes}
    assert all(e.src in ids and e.dst in ids for e in view.edges)
    tensor_operands = sum(v is not None and not v.is_const for n in graph for v in n.inputs)
    assert len(view.edges) == tensor_operands + len(graph.outputs) == 10 + 2


def test_edges_name_non_first_operands_and_multi_output_results(block):
    _, optimized, _ = block
    view = build_view(optimized)
    labels = sorted(e.label for e in view.edges if e.label)
    assert labels == ["%split.0", "%split.1", "residual"]


def test_made_nodes_carry_their_whole_rule_chain_from_the_trace(block):
    graph, optimized, report = block
    prov = provenance(report.trace)
    convs = [b for b in build_view(optimized, prov).boxes if b.title == "conv2d"]
    assert [b.rules for b in convs] == [
        ("fold_conv_bn", "fuse_conv_relu"),
        ("fold_conv_bn", "fuse_conv_residual", "fuse_conv_relu"),
    ]
    assert convs[1].notes == ("by fold_conv_bn → fuse_conv_residual", "→ fuse_conv_relu")
    assert "source: fuse_conv_relu (rules/3-fuse.rules:" in convs[0].tooltip
    before = build_view(graph, prov, original=True)
    replaced = {b.values[0].split(":")[0]: b.replaced_by for b in before.boxes if b.replaced_by}
    assert replaced == {
        "%conv2d": "fold_conv_bn",
        "%batch_norm": "fold_conv_bn",
        "%relu": "fuse_conv_relu",
        "%conv2d_1": "fold_conv_bn",
        "%batch_norm_1": "fold_conv_bn",
        "%add": "fuse_conv_residual",
        "%relu_1": "fuse_conv_relu",
    }


def test_without_a_trace_the_rule_comes_from_node_source(block):
    _, optimized, _ = block
    convs = [b for b in build_view(optimized).boxes if b.title == "conv2d"]
    assert [b.rules for b in convs] == [("fuse_conv_relu",), ("fuse_conv_relu",)]
    assert rule_of_source("fuse_conv_relu (rules/3-fuse.rules:11)") == ("fuse_conv_relu", "rules/3-fuse.rules:11")
    assert rule_of_source("aten.conv2d.default") is None
    assert rule_of_source("") is None


def test_opaque_nodes_show_their_aten_target_and_constant_outputs_are_drawn():
    g = gawee.Graph("opaque")
    x = g.add_input(gawee.TensorType((2, 3), gawee.DType.parse("f32")), "x")
    node = g.create_node("aten", [x], {"target": "aten.sin.default", "args": (("$in", 0),)}, types=[x.type])
    g.set_outputs([node.output, g.constant(torch.zeros(3), "zeros")])
    view = build_view(g)
    box = view.boxes[1]
    assert (box.kind, box.attrs) == ("opaque", ("aten.sin.default",))
    out = view.boxes[-1]
    assert (out.kind, out.consts, out.values) == ("output", "const f32[3]", ("%zeros",))


def test_sections_pair_the_graphs_with_distinct_prefixes(block):
    graph, optimized, report = block
    parts = sections(optimized, report.trace, graph)
    assert [(p.caption, p.prefix) for p in parts] == [("before: block, 9 nodes", "b"), ("after: block, 4 nodes", "a")]
    assert [p.caption for p in sections(optimized)] == ["block: 4 nodes"]


def test_a_matched_node_that_survives_is_not_drawn_as_replaced(block):
    graph, optimized, report = block
    from gawee.rewrite.driver import Firing

    keeps_split = Firing("some_rule", "x.rules:1", "mul", ("mul:mul", "split:split"), (), "mul", "p")
    before = sections(optimized, [*report.trace, keeps_split], graph)[0].view
    marks = {b.title: b.replaced_by for b in before.boxes if b.kind == "op"}
    assert marks["split"] == marks["mul"] == "" and marks["add"] == "fuse_conv_residual"
