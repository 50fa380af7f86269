"""The bundled rules fire the same way on real models as when benchmarks/traces.json was recorded.

The digests cover every firing in order (rule, nodes matched and created, values replaced) and the
rewritten graph (structure and constants); benchmarks/trace_identity.py checks all 80 torchvision
models the same way and records new digests when the rules change on purpose (``--record``).
"""

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import captured

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import trace_identity  # noqa: E402

RECORDED = json.loads((BENCHMARKS / "traces.json").read_text())


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_b_16"])
def test_bundled_rules_trace_as_recorded(name):
    graph, _, _ = captured(name)
    got = trace_identity.digests(graph)
    want = RECORDED[name]
    assert (got["firings"], got["nodes"]) == (want["firings"], want["nodes"])
    assert got["trace"] == want["trace"], "the firings differ from the recorded ones"
    assert got["graph"] == want["graph"], "the rewritten graph differs from the recorded one"
    assert got["data"] == want["data"], "the folded constants differ from the recorded ones"


def test_a_changed_firing_changes_the_trace_digest(resnet18):
    import gawee

    _, report = gawee.rewrite(resnet18[0], trace=True)
    trace = list(report.trace)
    assert trace_identity.trace_digest(trace) != trace_identity.trace_digest(trace[::-1])
    assert trace_identity.trace_digest(trace) != trace_identity.trace_digest(trace[:-1])
