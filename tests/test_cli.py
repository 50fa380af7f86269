"""gawee-rewrite: commands, exit codes and error messages as a user sees them."""

import json
import sys

import pytest

from gawee.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_resnet18(capsys):
    code, out, _ = run_cli(capsys, "show", "resnet18")
    assert code == 0
    for text in ["resnet18: 69 nodes", "FLOPs", "3.64 G", "peak memory", "batch_norm", "opaque ops: none"]:
        assert text in out
    assert "no functionalization" in out  # its relu_ and add_ write fresh results only


def test_show_json_and_saved_graph(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "show", "squeezenet1_0", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["nodes"] > 0 and doc["flops"] > 0 and doc["opaque_ops"] == {}


def test_show_factory_file(capsys, tmp_path):
    """The factory's file imports a module next to it (its folder is on the import path while it loads, and
    off it afterwards); the report is titled by the factory."""
    src = tmp_path / "mymodel.py"
    (tmp_path / "gawee_test_helper_layers.py").write_text(
        "import torch\ndef block():\n    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())\n"
    )
    src.write_text(
        "import torch\n"
        "import gawee_test_helper_layers\n"
        "def make():\n"
        "    return gawee_test_helper_layers.block(), (torch.randn(2, 8),)\n"
    )
    path = list(sys.path)
    code, out, err = run_cli(capsys, "show", f"{src}:make", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["op_counts"] == {"linear": 1, "relu": 1} and doc["graph"] == "mymodel.py:make"
    assert sys.path == path


@pytest.mark.parametrize(
    "spec, message",
    [
        ("resnet181", "did you mean resnet18"),
        ("nothere.py:make", "no such file"),
        ("missing.json", "no such file"),
    ],
)
def test_bad_model_spec_exits_2_with_a_hint(capsys, spec, message):
    code, _out, err = run_cli(capsys, "show", spec)
    assert code == 2 and message in err and "Traceback" not in err


def test_factory_without_callable(capsys, tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def other():\n    pass\n")
    code, _, err = run_cli(capsys, "show", f"{src}:make")
    assert code == 2 and "has no callable 'make'" in err and "other" in err


def test_explain_command(capsys):
    code, out, _ = run_cli(capsys, "explain", "resnet18", "conv2d_1")
    assert code == 0
    assert "fold_conv_bn (rules/2-fold.rules:6)" in out and "via its user batch_norm_1" in out
    code, out, _ = run_cli(capsys, "explain", "resnet18", "max_pool2d", "--after", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["op"] == "max_pool2d"
    assert {e["rule"] for e in doc["explanations"]} == {"cse", "fold_constants"}
    code, _, err = run_cli(capsys, "explain", "resnet18", "conv2d_99")
    assert code == 2 and "did you mean conv2d_9" in err


def test_optimize_writes_output_atomically_and_never_over_the_input(capsys, tmp_path):
    out_path = tmp_path / "r.json"
    code, _, _ = run_cli(capsys, "optimize", "squeezenet1_0", "-o", str(out_path), "--no-verify")
    assert code == 0 and out_path.exists() and out_path.with_suffix(".npz").exists()
    before = out_path.read_bytes()
    code, _, err = run_cli(capsys, "optimize", str(out_path), "-o", str(out_path))
    assert code == 2 and "would overwrite the input" in err and out_path.read_bytes() == before
    code, _, err = run_cli(capsys, "optimize", str(out_path), "-o", str(tmp_path / "x.onnx"))
    assert code == 2 and ".json" in err
