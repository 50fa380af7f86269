"""Bad input ends in one typed error: README's exit code, one screen with a location, no traceback, no partial file.

Each case here once ended in a traceback (issue 36) or in the wrong exit code.
"""

import functools
import logging

import pytest
import torch

import gawee
from gawee.cli import main
from gawee.dsl.parser import INT_LITERAL_MAX, MAX_NESTING
from gawee.errors import GaweeError, RuleError, RuleSyntaxError
from gawee.ir.builder import GraphBuilder
from gawee.ir.serialize import check_writable, write_output


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_screen(err: str, lines: int = 8) -> bool:
    return 0 < len(err.strip().splitlines()) <= lines and all(len(line) <= 200 for line in err.splitlines())


@pytest.fixture
def tiny(tmp_path):
    """A saved graph: relu(x) * 2, then a sigmoid."""
    b = GraphBuilder("tiny")
    x = b.input("x", "f32[2,3]")
    graph = b.output(b.sigmoid(b.mul(b.relu(x), b.const(torch.tensor(2.0), "two"))))
    path = tmp_path / "tiny.json"
    graph.save(path)
    return path


# -- nesting --------------------------------------------------------------------------------
def test_a_rule_nested_3000_deep_is_one_located_error(capsys, tmp_path):
    path = tmp_path / "deep.rules"
    path.write_text("rule r: " + "relu(" * 3000 + "x" + ")" * 3000 + " => x\n")
    code, _, err = run_cli(capsys, "check", path)
    col = len("rule r: ") + 5 * MAX_NESTING + 1  # the first relu( past the limit
    assert code == 2 and err.startswith(f"{path}:1:{col}: syntax error: nesting deeper than {MAX_NESTING} levels")
    assert one_screen(err) and "..." in err  # the 27,000-character line is quoted as a window


@pytest.mark.parametrize(
    "nest",
    [
        lambda n: "rule r: " + "relu(" * n + "x" + ")" * n + " => x",
        lambda n: "rule r: relu(x) => " + "neg(" * n + "x" + ")" * n,
        lambda n: "rule r: relu(x) => x" + " + x" * n,
        lambda n: "rule r: relu(x) => " + "-" * n + "x",
        lambda n: "rule r: relu(x) where " + "not " * n + "true => x",
        lambda n: "rule r: relu(x) where true" + " and true" * n + " => x",
        lambda n: "rule r: relu(x) where " + "[" * n + "1" + "]" * n + " != [] => x",
    ],
)
def test_nesting_is_bounded_for_every_construct(nest):
    gawee.load_rules_text(nest(MAX_NESTING - 1), "ok.rules")
    with pytest.raises(RuleSyntaxError, match="nesting deeper than"):
        gawee.load_rules_text(nest(5000), "deep.rules")


def test_a_rule_nested_to_the_limit_is_checked_without_recursion_errors(capsys, tmp_path):
    path = tmp_path / "d.rules"
    n = MAX_NESTING
    path.write_text("rule r: " + "relu(" * n + "x" + ")" * n + " => " + "relu(" * (n - 1) + "x" + ")" * (n - 1) + "\n")
    code, out, _ = run_cli(capsys, "check", path, "--examples", 10, "--jobs", 1)
    assert code == 0 and "sound" in out


# -- encodings ------------------------------------------------------------------------------
def test_a_rules_file_that_is_not_utf8_is_one_line(capsys, tmp_path):
    path = tmp_path / "utf16.rules"
    path.write_bytes(b"\xff\xfe\x00r\x00u\x00l\x00e")
    code, _, err = run_cli(capsys, "check", path)
    assert code == 2 and err.startswith(f"{path}: syntax error: not a UTF-8 text file (byte 0xff at line 1, column 1)")
    assert one_screen(err, 2)


def test_the_bad_byte_is_located_and_a_bom_is_accepted(tmp_path):
    path = tmp_path / "latin1.rules"
    path.write_bytes(b"# ok\nrule r: relu(x) => x  # caf\xe9\n")
    with pytest.raises(RuleSyntaxError, match=r"byte 0xe9 at line 2, column 28"):
        gawee.load_rules(path)
    path.write_bytes(b"\xef\xbb\xbfrule r: relu(x) => x\n")
    assert [r.name for r in gawee.load_rules(path).rules] == ["r"]


def test_a_graph_file_that_is_not_utf8_is_one_line(capsys, tmp_path):
    path = tmp_path / "g.json"
    path.write_bytes(b'{"format": "gawee.graph", "name": "\xff"}')
    code, _, err = run_cli(capsys, "show", path)
    assert code == 2 and "load error: not a UTF-8 text file (byte 0xff at line 1, column 36)" in err
    assert one_screen(err, 2)


# -- outputs --------------------------------------------------------------------------------
def test_an_output_directory_that_cannot_be_created_is_refused_before_any_work(capsys, tmp_path):
    code, _, err = run_cli(capsys, "optimize", "no_such_model", "-o", "/proc/forbidden/x.json")
    assert code == 2 and err.startswith("error: -o /proc/forbidden/x.json: cannot create files in /proc")
    assert one_screen(err, 2)
    blocker = tmp_path / "file"
    blocker.write_text("")
    for flag, name in (("-o", "x.json"), ("--mlir", "x.mlir"), ("--mermaid", "x.mmd")):
        code, _, err = run_cli(capsys, "optimize", "no_such_model", flag, blocker / "sub" / name)
        assert code == 2 and f"{blocker} is not a directory" in err and one_screen(err, 2)


def test_a_failed_write_is_a_gawee_error_and_leaves_nothing(tmp_path):
    (tmp_path / "taken.json").mkdir()
    (tmp_path / "taken.json" / "inside").write_text("")  # a non-empty directory: the final rename fails
    with pytest.raises(GaweeError, match=r"cannot write .*taken.json"):
        write_output(tmp_path / "taken.json", b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.json"]  # no temporary file left behind
    with pytest.raises(GaweeError, match="is a directory"):
        check_writable(tmp_path / "taken.json", "-o")
    check_writable(tmp_path / "new" / "deeper" / "x.json", "-o")  # creatable: fine, and nothing is created
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.json"]


# -- rules that change nothing ----------------------------------------------------------------
def test_a_replacement_that_is_its_pattern_warns_and_never_fires(capsys, caplog, tmp_path, tiny):
    path = tmp_path / "same.rules"
    path.write_text("# nothing\nrule same: relu(x) => relu( x )\n")
    with caplog.at_level(logging.WARNING, logger="gawee.rules"):
        code, out, _ = run_cli(capsys, "optimize", tiny, "--rules", path)
    assert code == 0 and "rules fired" not in out and "tiny: 3 -> 3 nodes" in out
    assert f"{path}:2:23: warning: the replacement is the pattern itself" in caplog.text


@pytest.mark.parametrize(
    "text",
    [
        "rule r: relu(relu(x)) => relu(relu(x))",
        "rule r: y: relu(x) => relu(x)",  # not the same text: the same node
        "rule r: x |> relu() => relu(x)",
        "rule r: mul(x, y) => mul(y, x)",  # commutative: the matcher takes either order
        "rule r: mul(x, c) where const(c) => mul(x, c * 1.0)",  # an equal constant, folded anew
        "rule r: relu(relu(x)) => relu(x)",  # a real change, for contrast
    ],
)
def test_a_replacement_that_rebuilds_what_it_matched_never_fires(text):
    b = GraphBuilder("g")
    x = b.input("x", "f32[2,3]")
    graph = b.output(b.sigmoid(b.relu(b.relu(b.mul(x, b.const(torch.tensor(2.0), "two"))))))
    out, report = gawee.rewrite(graph, gawee.load_rules_text(text, "r.rules"), trace=True)
    if text == "rule r: relu(relu(x)) => relu(x)":
        assert report.firings["r"] == 1 and [n.op for n in out] == ["mul", "relu", "sigmoid"]
    else:
        assert report.total == 0 and [n.op for n in out] == [n.op for n in graph]


def test_a_constant_of_another_shape_is_a_change_once(tmp_path):
    b = GraphBuilder("g")
    x = b.input("x", "f32[2,3]")
    graph = b.output(b.mul(x, b.const(torch.full((3,), 2.0), "twos")))
    rules = gawee.load_rules_text("rule r: mul(x, 2.0) => mul(x, 2.0)", "r.rules")  # [3] of 2s -> a 0-d 2
    out, report = gawee.rewrite(graph, rules)
    assert report.firings["r"] == 1 and next(iter(out)).inputs[1].type.shape == ()


# -- literals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "literal, message",
    [
        ("99999999999999999999999999999999999999", "is beyond every integer dtype"),
        (str(INT_LITERAL_MAX + 1), "is beyond every integer dtype"),
        ("9" * 5000, "999999999999999999...999999999999999999 is beyond every integer dtype"),
        ("1e400", "1e400 overflows to inf in every dtype"),
        ("1e-400", "1e-400 underflows to 0 in every dtype"),
    ],
)
def test_a_literal_no_dtype_holds_is_refused_where_it_is_written(capsys, tmp_path, literal, message):
    path = tmp_path / "big.rules"
    path.write_text(f"rule r: add(x, {literal}) => x\n")
    code, _, err = run_cli(capsys, "check", path)
    assert code == 2 and err.startswith(f"{path}:1:16: rule error: the ") and message in err and one_screen(err)


def test_literals_at_the_edges_load():
    for literal in (str(INT_LITERAL_MAX), "-" + str(INT_LITERAL_MAX), "1e308", "5e-324", "0e5", "0.0", "inf"):
        gawee.load_rules_text(f"rule r: add(x, {literal}) => x", "ok.rules")
    for text in (
        "rule r (priority=" + "9" * 30 + "): relu(x) => x",
        "rule r: relu(split(x, ...)[" + "9" * 30 + "]) => x",
    ):
        with pytest.raises(RuleError, match="beyond every integer dtype"):
            gawee.load_rules_text(text, "big.rules")


# -- exit codes -------------------------------------------------------------------------------
def test_a_replacement_of_the_wrong_type_is_a_finding(capsys, tmp_path, tiny):
    path = tmp_path / "wrong.rules"
    path.write_text("rule wrong: relu(x) => sum(x, dim=[1])\n")
    code, _, err = run_cli(capsys, "optimize", tiny, "--rules", path)
    assert code == 1 and err.startswith(f"rewrite error: rule wrong ({path}:1) on node relu: the replacement is f32[2]")
    assert one_screen(err, 3)


# -- saved graphs (each once found by benchmarks/fuzz_cli.py) -----------------------------------
@pytest.fixture
def conv_json(tmp_path):
    """A saved graph, conv2d then relu, as its JSON document (the .npz beside it)."""
    import json

    b = GraphBuilder("conv")
    x = b.input("x", "f32[1,2,4,4]")
    graph = b.output(b.relu(b.conv2d(x, b.const(torch.ones(3, 2, 1, 1), "w"))))
    path = tmp_path / "conv.json"
    graph.save(path)
    return path, json.loads(path.read_text())


def _set(doc, path, value):
    *keys, last = path
    for k in keys:
        doc = doc[k]
    doc[last] = value


def _edited(path, doc, edit, value) -> None:
    import json

    *keys, last = edit
    target = doc
    for k in keys:
        target = target[k]
    target[last] = value
    path.write_text(json.dumps(doc).replace('"__deep__"', "[" * 100_000 + "]" * 100_000))


@pytest.mark.parametrize(
    "edit, value, where, message",
    [
        (("nodes", 0, "attrs", "act_params"), "__deep__", "", "load error: nested deeper than 32 levels"),
        (("nodes", 0, "attrs", "act_params"), functools.reduce(lambda v, _: [v], range(40), 1), "nodes[0]", "deeper"),
        (("constants",), 7, "constants", "expected list, got int"),
        (("constants", 0), [], "constants[0]", "expected an object, got list"),
        (("outputs", 0), [1], "outputs[0]", "output [1] is not defined"),
        (("nodes", 0, "source"), 3, "nodes[0].source", "expected str, got int"),
        (("inputs", 0, "type", "layout"), ["nchw"], "inputs[0].type.layout", "expected str, got list"),
        (("inputs", 0, "type", "shape"), [1, 2**70, 4, 4], "inputs[0].type.shape", "shape must be ints in 0..2**62"),
        (("constants", 0, "meta"), True, "", "load error"),  # a meta constant: no .npz entry needed, loads
        # the op's own inference refuses: an activation its table lacks (a KeyError inside), an absent operand
        (("nodes", 0, "attrs", "act"), "2*s9", "", "node conv2d (conv2d): conv2d("),
        (("nodes", 0, "inputs", 0), None, "", "node conv2d (conv2d): operand 0 (input) is required but absent"),
    ],
)
def test_a_broken_saved_graph_is_one_error_at_its_json_path(capsys, conv_json, edit, value, where, message):
    path, doc = conv_json
    _edited(path, doc, edit, value)
    code, _, err = run_cli(capsys, "show", path)
    if edit[-1] == "meta":
        assert code == 0
        return
    assert code == 2 and err.startswith(f"{path}: {where}") and message in err and one_screen(err, 4), err


def test_a_saved_graph_with_a_broken_npz_is_one_error(capsys, conv_json):
    path, _ = conv_json
    npz = path.with_suffix(".npz")
    data = bytearray(npz.read_bytes())
    central = data.index(b"PK\x01\x02")  # the central directory's first entry: its flags at +8
    data[central + 8] |= 0x40  # "strong encryption": zipfile raises NotImplementedError
    npz.write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "show", path)
    assert code == 2 and "load error: cannot read tensor data" in err and one_screen(err, 2), err
