"""benchmarks/bench_int8.py: its table and verdicts on fixed rows, and its workers on a tiny BERT."""

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_int8
from bench_runtime import Quiet

ROWS = [
    bench_int8.Row("bert", "eager", latency_ms=20.0, foreign_load=0.1),
    bench_int8.Row("bert", "gawee", latency_ms=10.0, compile_s=2.5, max_abs_error=1e-6, cosine=1.0),
    bench_int8.Row(
        "bert", "gawee_int8", latency_ms=5.0, compile_s=3.0, max_abs_error=0.01, mean_abs_error=0.001, cosine=0.9999
    ),
    bench_int8.Row("bert", "ort_all", error="RuntimeError: export failed"),
    bench_int8.Row(
        "bert",
        "ort_int8",
        latency_ms=8.0,
        compile_s=4.0,
        max_abs_error=0.05,
        mean_abs_error=0.002,
        cosine=0.9995,
        recipe=bench_int8.QUANTIZE_RECIPE.replace("per_channel=True", "per_channel=False"),
    ),
]


def test_the_table_has_a_line_per_method_with_latency_and_agreement():
    text = bench_int8.markdown(ROWS)
    lines = text.splitlines()
    assert lines[0].startswith("| model | method | median latency |") and lines[1].startswith("|---|")
    assert (
        lines[2]
        == "| bert | eager PyTorch f32 | 20.00 ms (1.00×) | – | (reference) | (reference) | (reference) | 0.10 cores |"
    )
    assert lines[4] == (
        '| bert | gawee.compile(precision="int8") | 5.00 ms (4.00×) | 3.0 s | 0.01 | 0.001 | 0.999900 | ? |'
    )
    assert lines[5] == "| bert | ONNX Runtime f32 (all optimizations) | failed | – | – | – | – | ? |"
    assert "| 8.00 ms (2.50×) | 4.0 s | 0.05 | 0.002 | 0.999500 |" in lines[6]
    assert "- ⚠ bert ONNX Runtime f32 (all optimizations): RuntimeError: export failed" in text
    assert "per_channel=False" in text  # the fallback recipe is said


def test_the_verdicts_compare_gawee_int8_with_ort_int8():
    text = bench_int8.verdicts(ROWS)
    assert text.startswith("- bert: gawee int8 5.00 ms vs ORT int8 8.00 ms (1.600×) — at least as fast: **yes**")
    assert "agreement at least as good: **yes**" in text
    slower = [
        r
        if r.method != "gawee_int8"
        else bench_int8.Row("bert", "gawee_int8", latency_ms=9.0, cosine=0.9, max_abs_error=0.5)
        for r in ROWS
    ]
    text = bench_int8.verdicts(slower)
    assert "at least as fast: **no**" in text and "agreement at least as good: **no**" in text
    assert "not compared" in bench_int8.verdicts(ROWS[:3])


def test_readme_refuses_tiny_models():
    with pytest.raises(SystemExit):
        bench_int8.main(["--tiny", "--readme"])


@pytest.mark.parametrize("method", ["gawee_int8", "ort_int8"])
def test_the_int8_workers_build_compare_and_time_a_tiny_bert(method):
    if method == "ort_int8":
        pytest.importorskip("onnxruntime", reason="the bench extra: pip install 'gawee[bench]'")
        pytest.importorskip("onnxscript", reason="torch.onnx's export: the bench extra, pip install 'gawee[bench]'")
        if importlib.util.find_spec("onnxruntime.quantization") is None:
            pytest.skip("onnxruntime.quantization is not installed")
    quiet = Quiet(max_foreign=float("inf"), timeout_s=0.0, attempts=1)  # a smoke run: measure whatever the load
    row = bench_int8.measure(method, "bert", bench_int8.TINY["bert"], reps=2, warmup=1, passes=1, quiet=quiet)
    assert not row.error, row.error
    assert row.latency_ms is not None and row.latency_ms > 0 and len(row.latencies_ms) == 2
    assert row.cosine > 0.9 and row.max_abs_error < 1.0 and row.compile_s > 0
    if method == "ort_int8":
        assert row.recipe.startswith("quantize_dynamic(fp32, int8, per_channel=")


def test_the_readme_section_states_the_command_machine_recipe_and_table(tmp_path):
    meta = {
        "date": "d",
        "gawee": "gawee abc",
        "machine": "some cpu, 2 cores",
        "threads": 2,
        "torch": "t",
        "onnxruntime": "o",
        "reps": 20,
        "warmup": 5,
        "passes": 4,
    }
    table, checks = bench_int8.markdown(ROWS), bench_int8.verdicts(ROWS)
    body = bench_int8.readme_section(table, checks, "python benchmarks/bench_int8.py --readme", meta)
    readme = tmp_path / "README.md"
    bench_int8.replace_section(bench_int8.HEADING, body, readme)
    text = readme.read_text()
    assert f"{bench_int8.HEADING}\n\nProduced by `make bench-int8`" in text
    assert "```sh\npython benchmarks/bench_int8.py --readme\n```" in text and "Machine: some cpu, 2 cores" in text
    assert "per_channel=True, weight_type=QuantType.QInt8)" in text and table in text and checks in text


def test_rounds_merge_into_the_median_of_each_column_and_show_each_rounds_ratio():
    """--rounds: each column's latency is the median of its rounds, the verdict gives each round's ratio, and a
    column that failed in any round is reported failed."""
    rounds = [
        [
            bench_int8.Row("bert", m, latency_ms=t, cosine=1.0, max_abs_error=0.1)
            for m, t in zip(("gawee_int8", "ort_int8"), ts)
        ]
        for ts in ((5.0, 6.0), (9.0, 6.0), (6.0, 7.0))
    ]
    merged = bench_int8.merge_rounds(rounds)
    assert [r.latency_ms for r in merged] == [6.0, 6.0] and merged[0].rounds_ms == [5.0, 9.0, 6.0]
    assert "(1.000×; per round 1.200, 0.667, 1.167) — at least as fast: **yes**" in bench_int8.verdicts(merged)
    rounds[1][1] = bench_int8.Row("bert", "ort_int8", error="its process timed out")
    assert bench_int8.merge_rounds(rounds)[1].error == "its process timed out"


def test_interleaved_columns_are_timed_pass_by_pass_in_processes_alive_together():
    """--interleave: each column serves from a process of its own, built and checked once, then timed a pass at a
    time in turn; a column that cannot build is a row with the reason, and the others still run."""
    quiet = Quiet(max_foreign=float("inf"), timeout_s=0.0, attempts=1)
    script = Path(bench_int8.__file__)
    timing = dict(reps=4, warmup=1, passes=2, quiet=quiet, threads=1, script=script)
    rows = bench_int8.interleaved(["eager", "gawee_int8", "no_such_method"], "bert", bench_int8.TINY["bert"], **timing)
    assert [r.method for r in rows] == ["eager", "gawee_int8", "no_such_method"]
    assert all(len(r.latencies_ms) == 4 and r.latency_ms > 0 for r in rows[:2])
    assert rows[1].cosine > 0.99 and rows[1].compile_s > 0 and rows[1].foreign_load is not None
    assert rows[2].latency_ms is None and "KeyError" in rows[2].error
