"""benchmarks/zoo.py: the worker verifies the rewrite as `gawee-rewrite optimize` does and the row says how."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import zoo

DISTRIBUTIONS = {"normal", "x10", "x100", "awkward"}


def test_worker_row_has_the_rewrite_verification():
    row = zoo.run_one("squeezenet1_0", threads=1, timeout=300)  # its own process, as in the zoo
    assert row["status"] == "ok", row.get("message")
    assert row["nodes_after"] < row["nodes_before"] and row["firings"]  # the bundled rules did something
    # verify_rewrite, not verify_equivalent: four input sets, values compared through provenance
    assert row["verify_ok"] is True and row["verify_failed"] == [] and row["verify_blame"] is None
    assert set(row["verify_distributions"]) == DISTRIBUTIONS
    assert set(row["verify_distributions"].values()) <= {"ok", "skipped"}
    assert row["verify_values"] > len(row["firings"])  # intermediate values, not just the graph output
    assert row["verify_worst_distribution"] in DISTRIBUTIONS
    assert 0 <= row["verify_ratio"] < float("inf") and row["verify_s"] > 0
    # captured again with a dynamic batch: the same optimized node count, right at batch 1 and 3
    assert row["dynamic_status"] == "same" and row["dynamic_nodes"] == row["nodes_after"]
    # both tables render the row, one cell per header
    assert len(zoo.table_rows([row])[0]) == len(zoo.HEADERS)
    cells = dict(zip(zoo.TRANSFORMER_HEADERS, zoo.transformer_rows([row])[0]))
    assert cells["dynamic batch (nodes after, vs static)"] == f"same ({row['nodes_after']})"
    assert cells["verification"].startswith("ok") and cells["status"] == "ok"


def test_a_failed_verification_names_the_distributions_and_the_rule():
    row = {
        "model": "m",
        "status": "FAIL",
        "stage": "verify",
        "message": "verification failed: NOT equivalent",
        "verify_ok": False,
        "verify_failed": ["x10", "x100"],
        "verify_blame": {"rule": "relu6_is_relu", "distribution": "x10"},
        "verify_ratio": 12.0,
        "verify_worst_distribution": "x100",
    }
    assert zoo.fmt_verification(row) == "FAILED x10, x100: relu6_is_relu"
    assert zoo.fmt_ratio(row) == "12 (x100)"
    assert "m (x10, x100: relu6_is_relu)" in zoo.summary([row], 60.0)[0]


def test_iree_column_runs_the_optimized_graph_and_lists_ops_without_a_lowering():
    import pytest
    import torch

    pytest.importorskip("iree.runtime", reason="the IREE extra: pip install 'gawee[iree]'")
    import gawee
    from gawee.ir.builder import GraphBuilder

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    optimized, _ = gawee.rewrite(gawee.capture(model, (x,)), gawee.default_rules())
    with torch.no_grad():
        row = zoo.measure_iree(optimized, (x,), [model(x)])
    assert row["iree_status"] == "ok" and row["iree_error"] <= row["iree_tolerance"] == 1e-4
    assert zoo.fmt_iree(dict(row, model="m")).startswith("ok ")

    b = GraphBuilder("opaque")  # an op with no lowering: listed, nothing compiled
    v = b.input("x", "f32[4]")
    node = b.graph.create_node(
        "aten", [v], {"target": "aten.cumprod.default", "args": (("$in", 0), 0), "kwargs": ()}, types=[v.type]
    )
    row = dict(zoo.measure_iree(b.output(b.relu(node.output)), (torch.randn(4),), [torch.randn(4)]), model="m")
    assert row["iree_status"] == "no lowering" and row["iree_missing"] == {"aten:aten.cumprod.default": 1}
    assert zoo.fmt_iree(row) == "no lowering: aten:aten.cumprod.default×1"
    assert "ops without a lowering: aten:aten.cumprod.default (1 models)" in zoo.iree_summary([row])[0]
    wrong = {"model": "w", "iree_status": "differs", "iree_message": "error 0.5 > 0.0001"}
    assert "failed: w (differs)" in zoo.iree_summary([row, wrong])[0]


def test_dynamic_column_compares_with_a_static_capture_at_the_dynamic_example_size():
    """At batch 1 the expand of the batch mean back to [1, ...] is a no-op and folds; under a symbolic batch
    it is a real expand. The row then compares with a static capture at the dynamic example's batch (2)."""
    import torch

    import gawee

    class BatchMean(torch.nn.Module):
        def forward(self, x):
            return x.mean(0, keepdim=True).expand(x.shape[0], -1, -1) * x

    model, x, rules = BatchMean().eval(), torch.randn(1, 3, 4), gawee.default_rules()
    at_1 = len(gawee.rewrite(gawee.capture(model, (x,)), rules)[0])
    row = zoo.measure_dynamic(model, (x,), "m", rules, at_1)
    assert row["dynamic_status"] == "same", row.get("dynamic_message")
    basis = row["dynamic_basis"]
    assert basis["batch"] == 2 and basis["nodes"] == row["dynamic_nodes"] != at_1 == basis["batch1_nodes"]
    cell = f"{row['dynamic_nodes']} = static at batch 2 (batch 1: {at_1}, size-1 specializations)"
    assert zoo.fmt_dynamic(row) == cell
    # captured at batch 2 already: no second static capture, a different count fails the row
    row = zoo.measure_dynamic(model, (torch.cat([x, x]),), "m", rules, at_1)
    assert row["dynamic_status"] == "differs" and "dynamic_basis" not in row
    assert row["dynamic_message"] == f"{basis['nodes']} vs {at_1} nodes"


def test_dynamic_column_expects_the_size_computations_a_static_capture_folds():
    """A mask built from arange(batch) is a constant in a static capture and nodes under a symbolic batch;
    the row is "same" with those counted, and a further difference still fails it."""
    import torch

    import gawee

    class RowIndex(torch.nn.Module):
        def forward(self, x):
            return x * torch.arange(x.shape[0]).unsqueeze(1).unsqueeze(2).to(x.dtype)

    model, x, rules = RowIndex().eval(), torch.randn(2, 3, 4), gawee.default_rules()
    static = len(gawee.rewrite(gawee.capture(model, (x,)), rules)[0])
    row = zoo.measure_dynamic(model, (x,), "m", rules, static)
    assert row["dynamic_status"] == "same", row.get("dynamic_message")
    sized = row["dynamic_size_nodes"]
    assert sized >= 1 and row["dynamic_nodes"] == static + sized
    assert zoo.fmt_dynamic(row) == f"{static + sized} = static + {sized} size computations"
    row = zoo.measure_dynamic(model, (x,), "m", rules, static - 1)
    assert row["dynamic_status"] == "differs"

    class ClassToken(torch.nn.Module):  # a constant expanded to the batch: kept by the static capture too
        def __init__(self):
            super().__init__()
            self.token = torch.nn.Parameter(torch.randn(1, 1, 4))

        def forward(self, x):
            return torch.cat([self.token.expand(x.shape[0], -1, -1), x], dim=1)

    model, x = ClassToken().eval(), torch.randn(2, 3, 4)
    static = len(gawee.rewrite(gawee.capture(model, (x,)), rules)[0])
    row = zoo.measure_dynamic(model, (x,), "m", rules, static)
    assert row["dynamic_status"] == "same" and "dynamic_size_nodes" not in row, row
