"""gawee-rewrite optimize --html / --mermaid / --dot: the files, and the errors a user can make."""

import json
import shutil

import pytest

from gawee.cli import main
from gawee.errors import GaweeError
from gawee.viz.files import DOT_EXT, HTML_EXT, MERMAID_EXT, plan_pictures

MODEL = "docs/examples/swish_net.py:make"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_optimize_writes_the_report_and_both_pictures(capsys, tmp_path):
    html, mmd, dot = tmp_path / "r.html", tmp_path / "sub" / "r.md", tmp_path / "r.gv"
    code, out, _ = run_cli(capsys, "optimize", MODEL, "--html", str(html), "--mermaid", str(mmd), "--dot", str(dot))
    assert code == 0
    assert f"wrote {html}" in out and f"wrote {mmd}" in out and f"wrote {dot}" in out
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg ") == 2 and "fold_conv_bn" in page
    markdown = mmd.read_text()
    assert markdown.startswith("# swish_net.py:make: 13 -> ") and "```mermaid\n%% made by gawee-rewrite" in markdown
    assert "subgraph b[" in markdown and "subgraph a[" in markdown
    assert "subgraph cluster_b" in dot.read_text() and "subgraph cluster_a" in dot.read_text()
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_json_output_lists_the_pictures(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "optimize", MODEL, "--json", "--no-verify", "--mermaid", str(tmp_path / "g.mmd"))
    assert code == 0 and json.loads(out)["pictures"] == [str(tmp_path / "g.mmd")]
    assert json.loads(out)["trace"] is None  # the trace the picture needs is not forced into the JSON


@pytest.mark.parametrize(
    "flag, name, message",
    [
        ("--html", "report.txt", "--html writes .html or .htm files"),
        ("--dot", "graph.png", ".svg renders the DOT with Graphviz"),
        ("--mermaid", "graph", "unknown extension '(none)'"),
    ],
)
def test_an_unknown_extension_exits_2_with_a_hint(capsys, tmp_path, flag, name, message):
    code, _, err = run_cli(capsys, "optimize", MODEL, flag, str(tmp_path / name))
    assert code == 2 and message in err and "hint:" in err and "Traceback" not in err


def test_svg_without_graphviz_exits_2_before_any_work(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    code, _, err = run_cli(capsys, "optimize", "no_such_model", "--dot", str(tmp_path / "g.svg"))
    assert code == 2 and "Graphviz" in err and "apt-get install graphviz" in err  # checked before the model


def test_an_unwritable_destination_exits_2_before_any_work(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli(capsys, "optimize", "no_such_model", "--html", str(blocker / "r.html"))
    assert code == 2 and f"--html {blocker / 'r.html'}: {blocker} is not a directory" in err and "hint:" in err


def test_picture_extensions_keep_every_file_apart_from_the_inputs_and_each_other(tmp_path):
    kinds = [set(HTML_EXT), set(MERMAID_EXT), set(DOT_EXT), {".json", ".npz", ".py"}]  # the last: inputs and -o
    assert all(not (a & b) for i, a in enumerate(kinds) for b in kinds[i + 1 :])
    (tmp_path / "d.html").mkdir()
    with pytest.raises(GaweeError, match="is a directory"):
        plan_pictures(html=str(tmp_path / "d.html"))
    assert not plan_pictures() and plan_pictures(html="a.HTML").html.name == "a.HTML"
