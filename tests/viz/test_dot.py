"""Graphviz DOT output and its rendering to SVG through `dot`."""

import re
import shutil

import pytest

import gawee
from gawee.viz.dot import RenderError, _quote, to_dot, to_svg
from tests.conftest import renderer
from tests.viz.conftest import conv_block


def test_one_graph_is_a_digraph_with_a_statement_per_box_and_edge(block):
    _, optimized, report = block
    text = to_dot(optimized, trace=report.trace)
    assert text.splitlines()[1] == 'digraph "block" {' and text.endswith("}\n")
    assert len(re.findall(r"^  g_n\d+ \[label=<", text, re.M)) == 1 + len(optimized) + 2
    assert len(re.findall(r"^  g_n\d+ -> g_n\d+", text, re.M)) == 7
    assert '  g_n0 -> g_n2 [label="residual"];' in text
    assert "cluster" not in text


def test_fused_nodes_are_painted_and_name_their_rules(block):
    _, optimized, report = block
    text = to_dot(optimized, trace=report.trace)
    fused = [ln for ln in text.splitlines() if 'fillcolor="#fff4e6"' in ln]
    assert len(fused) == 2 and all("penwidth=2" in ln for ln in fused)
    assert '<FONT COLOR="#d9480f">by fold_conv_bn → fuse_conv_residual</FONT>' in fused[1]


def test_before_and_after_are_two_clusters_with_dashed_replaced_nodes(block):
    graph, optimized, report = block
    text = to_dot(optimized, trace=report.trace, before=graph)
    assert "  subgraph cluster_b {" in text and "  subgraph cluster_a {" in text
    assert len(re.findall(r'^    b_n\d+ .*style="rounded,filled,dashed"', text, re.M)) == 7


def test_output_is_deterministic_across_rewrites():
    texts = set()
    for _ in range(2):
        graph = conv_block()
        optimized, report = gawee.rewrite(graph, trace=True)
        texts.add(to_dot(optimized, trace=report.trace, before=graph))
    assert len(texts) == 1


def test_strings_are_quoted_for_dot():
    assert _quote('a "b"\\c\nd') == '"a \\"b\\"\\\\c\\nd"'


def test_to_svg_renders_with_graphviz(block, request):
    renderer(request.config, ["dot"], "Graphviz renders DOT to SVG (apt-get install -y graphviz; .ci/run installs it)")
    graph, optimized, report = block
    svg = to_svg(to_dot(optimized, trace=report.trace, before=graph))
    assert "<svg" in svg and svg.count('class="node"') == (1 + len(graph) + 2) + (1 + len(optimized) + 2)
    with pytest.raises(RenderError, match="failed"):
        to_svg("digraph { this is not dot")


def test_to_svg_without_graphviz_is_a_render_error_with_a_hint(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(RenderError) as err:
        to_svg("digraph {}")
    assert "not installed" in str(err.value) and "apt-get install graphviz" in str(err.value)
