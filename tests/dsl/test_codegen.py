"""Generated matchers (gawee.dsl.codegen) match exactly what the interpreted patterns match."""

import marshal
import traceback

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gawee.dsl import code_cache, codegen
from gawee.dsl.matcher import MatchContext
from gawee.ir.builder import GraphBuilder
from gawee.ops import sampling as S
from gawee.rewrite.driver import match_roots, rewrite
from gawee.rewrite.ruleset import RULES_DIR, load_rules, load_rules_text
from gawee.testing.generate import generate
from tests.conftest import captured

BUNDLED = load_rules(RULES_DIR, RULES_DIR / "layout")


def matches(rule, node, interpreted: bool) -> list:
    """Every match of ``rule`` at ``node``, in order: roots, bindings and matched nodes at each."""
    env: dict = {}
    ctx = MatchContext()
    out = []
    for roots in match_roots(rule, node, env, ctx, interpreted=interpreted):
        out.append(([id(n) for n in roots], dict(env), [id(n) for n in ctx.nodes]))
    return out


def assert_agree(graph, rules) -> int:
    """Both matchers on every rule × node of ``graph``; returns how many pairs matched."""
    matched = 0
    for rule in rules:
        for node in list(graph):
            if len(node.outputs) != 1 and rule.whole_node is None:
                continue
            got, want = matches(rule, node, False), matches(rule, node, True)
            assert got == want, f"{rule.label} at {node.name}: generated {got}, interpreted {want}"
            matched += bool(want)
    return matched


def test_every_bundled_rule_has_generated_code():
    interpreted = [r.label for r in BUNDLED.rules if not codegen.match_functions(r)]
    assert interpreted == []
    for r in BUNDLED.rules:
        assert f"# {r.location}" in r.code and f"rule {r.label}" in r.code


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_generated_and_interpreted_agree_on_models(name, resnet18):
    graph = resnet18[0] if name == "resnet18" else captured(name)[0]
    assert assert_agree(graph, BUNDLED.rules) > 10


@pytest.mark.parametrize("rule", BUNDLED.rules, ids=lambda r: r.label)
def test_generated_and_interpreted_agree_on_each_rules_instances(rule):
    """On graphs the soundness harness draws to match each rule (so every rule matches somewhere, commutative
    operands, `|>`, alternatives and several roots included), for every rule of the set at every node."""
    found = []

    @settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        try:
            ex = generate(rule, data)
        except S.Reject:
            return
        found.append(assert_agree(ex.graph, BUNDLED.rules))

    check()
    assert any(found), f"{rule.label}: no drawn instance matched"


def test_commutative_matches_come_in_the_interpreters_order():
    rules = load_rules_text("rule either: add(relu(x), mul(y, z)) => x")
    b = GraphBuilder("g")
    a, c = b.input("a", "f32[4]"), b.input("c", "f32[4]")
    ra, rc = b.relu(a), b.relu(c)
    m = b.mul(ra, rc)
    out = b.output(b.add(b.add(ra, m), m))
    node = out.outputs[0].producer.inputs[0].producer  # add(relu(a), mul(relu(a), relu(c)))
    got = matches(rules.rules[0], node, False)
    assert got == matches(rules.rules[0], node, True)
    names = [{k: v.name for k, v in env.items()} for _, env, _ in got]
    assert [(e["y"], e["z"]) for e in names] == [(ra.name, rc.name), (rc.name, ra.name)]  # mul's orders, in turn


def test_generated_code_names_its_rule_and_a_failure_inside_points_there():
    rule = load_rules_text("# relu of relu\nrule rr: relu(relu(x)) => relu(x)", name="t.rules").rules[0]
    (fn,) = codegen.match_functions(rule)
    assert "# t.rules:2  rule rr" in rule.code and "# t.rules:2:" in rule.code

    class Broken:  # a value whose producer cannot be read
        @property
        def producer(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError) as info:
        next(fn(Broken(), {}, MatchContext()))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-2].filename == "t.rules:2 (rr, generated)"
    assert frames[-2].line == "n1 = v0.producer"


def test_the_cached_source_is_used_and_a_stale_one_never(tmp_path, monkeypatch):
    text = "rule rr: relu(relu(x)) => relu(x)\n"
    rules = load_rules_text(text, name="t.rules").rules
    code_cache.attach_cached(rules, text, "t.rules", where=tmp_path)
    (entry,) = tmp_path.glob("*.py")
    assert "def _r0_0(" in entry.read_text()
    # an entry read back is what the rules run: mark it, and the next load runs the mark
    entry.write_text(entry.read_text().replace("    if v0 is None:", "    env['from_cache'] = 1\n    if v0 is None:"))
    again = load_rules_text(text, name="t.rules").rules
    code_cache.attach_cached(again, text, "t.rules", where=tmp_path)
    assert "from_cache" in again[0].code
    # another text, or another generator, is another entry: the marked one is never read for it
    other = load_rules_text(text.replace("relu(x)\n", "x\n"), name="t.rules").rules
    code_cache.attach_cached(other, text.replace("relu(x)\n", "x\n"), "t.rules", where=tmp_path)
    assert "from_cache" not in other[0].code
    assert code_cache.key(again, text, "t.rules") == entry.stem
    monkeypatch.setattr(codegen, "generator_digest", lambda: "another generator")
    assert code_cache.key(again, text, "t.rules") != entry.stem
    monkeypatch.undo()
    monkeypatch.setattr(code_cache, "registry_digest", lambda: "an op's defaults changed")
    assert code_cache.key(again, text, "t.rules") != entry.stem
    monkeypatch.undo()
    # an entry that does not split into the rules it was made for is regenerated
    entry.write_text("garbage")
    fresh = load_rules_text(text, name="t.rules").rules
    code_cache.attach_cached(fresh, text, "t.rules", where=tmp_path)
    assert "def _r0_0(" in fresh[0].code and "garbage" not in entry.read_text()


def test_rewrite_through_generated_code_equals_interpreted(resnet18):
    """The whole rewrite, generated matchers against interpreted ones (every rule with code removed)."""
    rules = load_rules(RULES_DIR)
    _, report = rewrite(resnet18[0], rules, trace=True)
    plain = load_rules(RULES_DIR)
    for r in plain.rules:
        r.code, r.match_fns = "", []
    _, want = rewrite(resnet18[0], plain, trace=True)
    assert [f.as_dict() for f in report.trace] == [f.as_dict() for f in want.trace]


def test_nothing_from_a_rule_file_or_its_name_becomes_code():
    name = "evil\nraise SystemExit('ran')\n.rules"
    text = "# a comment\rraise SystemExit('ran')\nrule rr: relu(relu(x)) => relu(x)\n"
    rule = load_rules_text(text, name=name).rules[0]
    codegen.match_functions(rule)  # compiles and runs the module: nothing raised
    assert not any(line.lstrip().startswith("raise") for line in rule.code.splitlines())


def test_show_rule_prints_the_rule_and_its_generated_code(capsys):
    from gawee.cli import main

    assert main(["show-rule", "fuse_conv_relu", "--code"]) == 0
    out = capsys.readouterr().out
    assert "rule fuse_conv_relu:" in out and "conv2d(x, w, b, act=none, ...attrs) |> relu()" in out
    assert "def _r" in out and "n1.op != 'relu'" in out and "# rules/3-fuse.rules:12:" in out
    assert main(["show-rule", "fuse_conv_relu"]) == 0 and "def _r" not in capsys.readouterr().out
    assert main(["show-rule", "no_such_rule"]) == 2


def test_code_objects_are_kept_beside_the_source_and_never_for_another(tmp_path, monkeypatch):
    text = "rule rr: relu(relu(x)) => relu(x)\n"
    rules = load_rules_text(text, name="t.rules").rules
    code_cache.attach_cached(rules, text, "t.rules", where=tmp_path)
    (kept,) = tmp_path.glob("*.code")
    again = load_rules_text(text, name="t.rules").rules
    with monkeypatch.context() as m:
        m.setattr(code_cache, "compile", lambda *a: pytest.fail("compiled again"), raising=False)
        code_cache.attach_cached(again, text, "t.rules", where=tmp_path)
    assert again[0].code_object is not None and again[0].code_object.co_filename == "t.rules:1 (rr, generated)"
    assert codegen.match_functions(again[0])  # runs from the kept code object
    # an edited source is another entry; a corrupt or foreign one is compiled again and replaced
    (entry,) = tmp_path.glob("*.py")
    entry.write_text(entry.read_text().replace("    if v0 is None:", "    env['from_cache'] = 1\n    if v0 is None:"))
    marked = load_rules_text(text, name="t.rules").rules
    code_cache.attach_cached(marked, text, "t.rules", where=tmp_path)
    assert "from_cache" in _strings(marked[0].code_object) and "from_cache" not in _strings(again[0].code_object)
    assert len(list(tmp_path.glob("*.code"))) == 2
    for garbage in [b"", b"not marshal", marshal.dumps([compile("x = 1", "other", "exec")])]:
        kept.write_bytes(garbage)
        fresh = load_rules_text(text, name="t.rules").rules
        code_cache.attach_cached(fresh, text, "t.rules", where=tmp_path)
        assert fresh[0].code_object.co_filename == "t.rules:1 (rr, generated)"


def _strings(code) -> set[str]:
    """Every string constant of a code object and the code objects inside it."""
    out = set()
    for c in code.co_consts:
        out |= _strings(c) if hasattr(c, "co_consts") else {c} if isinstance(c, str) else set()
    return out
