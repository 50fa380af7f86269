"""gawee-rewrite: commands, exit codes and error messages as a user sees them."""

import json

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


def test_show_json_and_saved_graph(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "show", "squeezenet1_0", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["nodes"] > 0 and doc["flops"] > 0 and doc["opaque_ops"] == {}


def test_show_factory_file(capsys, tmp_path):
    src = tmp_path / "mymodel.py"
    src.write_text(
        "import torch\n"
        "def make():\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())\n"
        "    return m, (torch.randn(2, 8),)\n")
    code, out, _ = run_cli(capsys, "show", f"{src}:make", "--json")
    assert code == 0 and json.loads(out)["op_counts"] == {"linear": 1, "relu": 1}


@pytest.mark.parametrize("spec, message", [
    ("resnet181", "did you mean resnet18"),
    ("nothere.py:make", "no such file"),
    ("missing.json", "no such file"),
])
def test_bad_model_spec_exits_2_with_a_hint(capsys, spec, message):
    code, _out, err = run_cli(capsys, "show", spec)
    assert code == 2 and message in err and "Traceback" not in err


def test_factory_without_callable(capsys, tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def other():\n    pass\n")
    code, _, err = run_cli(capsys, "show", f"{src}:make")
    assert code == 2 and "has no callable 'make'" in err and "other" in err
