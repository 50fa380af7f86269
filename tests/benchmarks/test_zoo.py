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
    # both tables render the row, one cell per header
    assert len(zoo.table_rows([row])[0]) == len(zoo.HEADERS)
    cells = dict(zip(zoo.TRANSFORMER_HEADERS, zoo.transformer_rows([row])[0]))
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
