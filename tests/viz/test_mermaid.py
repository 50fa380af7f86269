"""Mermaid output: structure, made nodes marked with their rules, escaping, determinism."""

import re

import gawee
from gawee.viz.mermaid import _text, to_mermaid
from tests.viz.conftest import conv_block


def test_one_graph_is_a_flowchart_with_a_line_per_box_and_edge(block):
    _, optimized, report = block
    text = to_mermaid(optimized, trace=report.trace)
    lines = text.splitlines()
    assert lines[1] == "flowchart TB" and "subgraph" not in text
    boxes = [ln for ln in lines if re.match(r"  g_n\d+[\[(]", ln)]
    edges = [ln for ln in lines if " --> " in ln or re.search(r" -->\|", ln)]
    assert len(boxes) == 1 + len(optimized) + 2 and len(edges) == 7
    assert "  g_n0 -->|residual| g_n2" in lines
    assert not any("c1.weight" in ln or "conv2d_2.weight" in ln for ln in lines)  # constants are not boxes


def test_fused_nodes_are_classed_and_name_their_rules(block):
    _, optimized, report = block
    text = to_mermaid(optimized, trace=report.trace)
    assert "  class g_n1,g_n2 rule" in text.splitlines()
    assert "classDef rule fill:#fff4e6,stroke:#e8590c" in text
    assert "by fold_conv_bn → fuse_conv_residual<br/>→ fuse_conv_relu" in text


def test_before_and_after_are_two_subgraphs(block):
    graph, optimized, report = block
    text = to_mermaid(optimized, trace=report.trace, before=graph)
    assert '  subgraph b["before: block, 9 nodes"]' in text and '  subgraph a["after: block, 4 nodes"]' in text
    assert text.count("\n  end\n") == 2
    replaced = next(ln for ln in text.splitlines() if ln.endswith(" replaced"))
    assert replaced.split()[1].split(",") == [f"b_n{i}" for i in range(1, 8)]  # all but split and mul


def test_output_is_deterministic_across_rewrites():
    texts = set()
    for _ in range(2):
        graph = conv_block()
        optimized, report = gawee.rewrite(graph, trace=True)
        texts.add(to_mermaid(optimized, trace=report.trace, before=graph))
    assert len(texts) == 1


def test_labels_are_escaped_for_mermaid():
    assert _text('say "hi" <b> & #1; |') == "say &quot;hi&quot; &lt;b&gt; &amp; &num;1; &vert;"
