"""Runtimes that could crash the process are built and run in a child process on the user's graph first."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
import torch.nn.functional as F

import gawee
from gawee.backend import attention, compiler, dnnl, isolation, onednn_graph
from gawee.backend.torch_backend import TorchOptions
from gawee.errors import GaweeError
from tests.backend.test_compiler import block

pytestmark = pytest.mark.skipif(not isolation.supported(), reason="this OS has no fork")


def _abort(message: str) -> None:
    os.write(2, f"{message}\n".encode())
    os.abort()


def test_each_piece_of_work_answers_or_says_how_its_child_died():
    def raises():
        raise ValueError("refused\nsecond line")

    def prints_then_exits():
        print("a line on stdout", flush=True)
        os._exit(3)

    tried = isolation.tried(
        {
            "answers": lambda: f"{torch.get_num_threads()} thread",
            "returns nothing": lambda: None,
            "raises": raises,
            "aborts": lambda: _abort("free(): invalid size"),
            "exits": prints_then_exits,
            "hangs": lambda: time.sleep(60),
        },
        timeout_s=2.0,
    )
    assert tried["answers"] == isolation.Tried(answer="1 thread", seconds=tried["answers"].seconds)
    assert tried["returns nothing"].died is None and tried["returns nothing"].answer is None
    assert tried["raises"].error == "refused" and tried["raises"].died is None
    assert tried["aborts"].died == "SIGABRT: free(): invalid size"
    assert tried["aborts"].why == "it crashed in a trial process (SIGABRT: free(): invalid size)"
    assert tried["exits"].died == "exit status 3: a line on stdout"
    assert tried["hangs"].died == "no answer within 2 s" and tried["hangs"].seconds < 30
    assert tried["hangs"].why == "its trial process gave no answer within 2 s"


def test_without_fork_nothing_runs_and_each_piece_of_work_is_taken_for_dead(monkeypatch):
    monkeypatch.setattr(isolation, "supported", lambda: False)
    ran = []
    tried = isolation.tried({"work": lambda: ran.append(1)})
    assert ran == [] and "no fork" in tried["work"].died


def _plant(monkeypatch, runtime: str) -> list:
    """``runtime`` (``onednn_graph`` or ``onednn:blocked``) replaced by a module that aborts the process when it
    runs a graph with a convolution (the user's), the only whole-graph candidate; the list of the modules built in
    this process."""
    built = []

    class Aborts(torch.nn.Module):
        def __init__(self, graph, *args, **kwargs):
            super().__init__()
            self.graph = graph
            built.append(self)

        def forward(self, *xs):
            if any(node.op in ("conv2d", "onednn_conv") for node in self.graph):
                _abort("planted: this graph brings the runtime down")
            return tuple(torch.zeros(v.type.shape) for v in self.graph.outputs)

    if runtime == "onednn_graph":
        monkeypatch.setattr(onednn_graph, "supports", lambda graph: None)
        monkeypatch.setattr(onednn_graph, "OneDNNGraphModule", Aborts)
    else:
        monkeypatch.setattr(dnnl, "supports", lambda graph: None)
        monkeypatch.setattr(dnnl, "DnnlModule", Aborts)
    monkeypatch.setattr(compiler, "_whole_graph_runtimes", lambda graph, lowered, spent: ([runtime], {}))
    monkeypatch.setattr(compiler, "WHOLE_GRAPH_MIN_BUDGET_S", 1e9)  # measured, however long a call takes
    return built


@pytest.mark.parametrize("runtime", ["onednn_graph", "onednn:blocked"])
def test_the_default_compile_survives_a_runtime_that_aborts_on_the_users_graph(monkeypatch, runtime):
    built = _plant(monkeypatch, runtime)
    model, x = block(), torch.randn(1, 4, 8, 8)
    module = gawee.compile(model, (x,))
    assert built == []  # never built in this process
    choice = module.gawee_report.backend
    assert choice.chosen == "torch" and isinstance(module, torch.fx.GraphModule)
    why = choice.not_candidates[runtime]
    assert why == (
        "it crashed in a trial process (SIGABRT: planted: this graph brings the runtime down), "
        "so it was not built in this process"
    )
    assert why in str(module.gawee_report)
    torch.testing.assert_close(module(x)["logits"], model(x)["logits"])


def test_a_runtime_asked_for_by_name_that_aborts_is_a_gawee_error(monkeypatch):
    built = _plant(monkeypatch, "onednn_graph")
    with pytest.raises(GaweeError, match=r"onednn_graph runtime cannot run Block: it crashed .*SIGABRT: planted"):
        gawee.compile(block(), (torch.randn(1, 4, 8, 8),), backend="onednn_graph")
    assert built == []


class _Attend(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def test_an_attention_partition_that_aborts_leaves_the_attention_to_aten(monkeypatch):
    monkeypatch.setattr(onednn_graph, "unavailable", lambda part="partitions": None)
    monkeypatch.setattr(attention, "_MEASURED", {})
    monkeypatch.setattr(attention, "_partition", lambda *args: _abort("planted: the fuser dies on this shape"))
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    module = gawee.compile(_Attend(), (q, k, v), options=TorchOptions(whole_graph=False))
    (choice,) = [c for c in module.gawee_report.kernels if c.op == "attention"]
    assert choice.kernel == "aten"
    assert (
        choice.why
        == "oneDNN Graph's partition: it crashed in a trial process (SIGABRT: planted: the fuser dies on this shape)"
    )


@pytest.mark.slow  # timm's import and a real transformer block: about 10 s of compile on 2 cores
def test_volo_class_attention_whose_onednn_graph_runtime_aborts_compiles_equal_to_eager():
    """timm's VOLO class block (384 channels, 12 heads): TorchScript's oneDNN Graph fuser aborts the process on it
    (``munmap_chunk(): invalid pointer`` or ``free(): invalid size``) where the fuser runs; the default compile
    drops that runtime and returns a module equal to the model."""
    volo = pytest.importorskip("timm.models.volo")
    torch.manual_seed(0)
    model = volo.ClassBlock(dim=384, num_heads=12).eval()
    x = torch.randn(1, 17, 384)
    module = gawee.compile(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-4, atol=1e-4)
    why = module.gawee_report.backend.not_candidates.get("onednn_graph", "")
    assert "crashed in a trial process (SIG" in why or onednn_graph.unavailable() is not None or sys.platform != "linux"


@pytest.mark.skipif(dnnl.unavailable() is not None, reason="oneDNN's primitives are not available here")
def test_a_runtimes_first_variant_is_tried_and_built_before_its_others_are_tried(monkeypatch):
    """The selection tries (in child processes) the first variant of each runtime, all at once, and builds them
    here; only then are the other variants tried, so their trials skip the kernels the first one's build raced
    here (``shared``)."""
    events, apart, candidate = [], compiler._apart, compiler._candidate

    def trying(work):
        events.append(("try", sorted(work)))
        return apart(work)

    def building(name, build, *args):
        result = candidate(name, build, *args)
        events.append(("build", result[0].layout if isinstance(result[0], dnnl.DnnlModule) else None))
        return result

    monkeypatch.setattr(compiler, "_apart", trying)
    monkeypatch.setattr(compiler, "_candidate", building)
    monkeypatch.setattr(compiler, "WHOLE_GRAPH_MIN_BUDGET_S", 1e9)  # measured, however long a call takes
    model, x = block(), torch.randn(1, 4, 8, 8)
    module = gawee.compile(model, (x,))
    first, *others = dnnl.RUNTIME.variants
    tries = [names for kind, names in events if kind == "try"]
    assert f"onednn:{first}" in tries[0] and not any(f"onednn:{v}" in tries[0] for v in others)
    assert tries[1] == sorted(f"onednn:{v}" for v in others)
    built = [layout for kind, layout in events if kind == "build" and layout is not None]
    assert built == [first, *others]
    assert events.index(("build", first)) < events.index(("try", tries[1]))
    torch.testing.assert_close(module(x)["logits"], model(x)["logits"])
