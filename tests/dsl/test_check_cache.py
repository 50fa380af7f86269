"""Checked rule files kept on disk: a file loaded again is not checked again and its rules are compiled on first
use, yet every diagnostic is still given at load time, and a stale entry is never read."""

import json
import logging

import pytest
import torch

import gawee
from gawee.dsl import check_cache, compiler
from gawee.dsl.check_cache import LazyRule
from gawee.errors import RuleError
from gawee.ir.builder import GraphBuilder
from gawee.ops import ACTIVATIONS
from gawee.rewrite import ruleset
from gawee.rewrite.ruleset import RULES_DIR, load_rules

TEXT = """
# relu(relu(x)) -> relu(x)
rule relu_twice: relu(relu(x)) => relu(x)

rule mul_one: mul(x, 1) where x.rank >= 1 => x

# either activation twice is once
rule act_twice: (relu(relu(x)) | sigmoid(sigmoid(x))) => x

rule unused_var: add(x, y) where x.rank >= 0 => x
"""

BAD_REPLACEMENT = "rule bad: relu(x) => x.rank\n"
"""A replacement of the wrong kind: an int, not a tensor."""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    where = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(where))
    return where / "gawee" / "rules"


def _entries(cache):
    return sorted(cache.glob("*.checked.json")) if cache.is_dir() else []


def _load_logged(path, caplog):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gawee.rules"):
        rules = load_rules(path)
    return rules, [r.getMessage() for r in caplog.records]


def test_a_kept_file_loads_the_same_rules_compiled_on_first_use(tmp_path, cache, caplog):
    path = tmp_path / "mine.rules"
    path.write_text(TEXT)
    first, warned = _load_logged(path, caplog)
    assert not any(isinstance(r, LazyRule) for r in first.rules)
    assert len(_entries(cache)) == 1
    assert any("`y` is bound here and never used" in w for w in warned)
    again, warned_again = _load_logged(path, caplog)
    assert warned_again == warned  # the same warnings, with file:line:col and caret, at load time
    assert all(isinstance(r, LazyRule) and not r.compiled for r in again.rules)
    assert [r.label for r in again.rules] == [r.label for r in first.rules]
    for a, b in zip(first.rules, again.rules):
        fields = ("root_op", "priority", "variant", "whole_node", "comment", "index", "phase")
        assert str(b.span) == str(a.span) and [getattr(b, f) for f in fields] == [getattr(a, f) for f in fields]
        assert (b.root_output, b.approximate, b.bound_text) == (a.root_output, a.approximate, a.bound_text)
        assert [str(w) for w in b.warnings] == [str(w) for w in a.warnings]
    lazy = again.rule("act_twice")
    variants = [r for r in again.rules if r.name == "act_twice"]
    assert len(variants) == 2 and variants[0].span is variants[1].span  # as compiled alternatives share it
    assert lazy.ast == first.rule("act_twice").ast  # the first access compiles ...
    assert all(r.compiled for r in variants)  # ... every variant of the rule, and no other rule
    assert not again.rule("mul_one").compiled
    assert [t for t, _ in again.rule("mul_one").guard_parts] == [t for t, _ in first.rule("mul_one").guard_parts]


def test_a_type_error_in_a_replacement_is_rejected_at_every_load(tmp_path, cache):
    path = tmp_path / "bad.rules"
    path.write_text(TEXT)
    load_rules(path)  # kept as checked
    load_rules(path)
    path.write_text(TEXT + BAD_REPLACEMENT)  # edited: the entry of the old text is not this file's
    messages = []
    for _ in range(2):  # a file that fails leaves no entry: checked, and rejected, again
        with pytest.raises(RuleError) as err:
            load_rules(path)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert "the replacement must be a tensor" in messages[0]
    assert f"bad.rules:{TEXT.count(chr(10)) + 1}:" in messages[0] and "^" in messages[0]
    assert len(_entries(cache)) == 1  # the good text's only


def test_an_edited_file_is_checked_again(tmp_path, cache, monkeypatch):
    path = tmp_path / "mine.rules"
    path.write_text(TEXT)
    load_rules(path)
    calls = []
    real = compiler.compile_rule
    monkeypatch.setattr(ruleset, "compile_rule", lambda *a, **k: calls.append(1) or real(*a, **k))
    load_rules(path)
    assert calls == []  # kept: not checked again
    path.write_text(TEXT.replace("rule mul_one", "rule mul_by_one"))
    edited = load_rules(path)
    assert calls and [r.name for r in edited.rules if r.name.startswith("mul")] == ["mul_by_one"]
    assert not any(isinstance(r, LazyRule) for r in edited.rules)


def test_the_key_covers_text_file_code_and_registry(monkeypatch):
    k = check_cache.key(TEXT, "a.rules")
    assert k == check_cache.key(TEXT, "a.rules")
    assert k != check_cache.key(TEXT, "b.rules")
    assert k != check_cache.key(TEXT + " ", "a.rules")
    monkeypatch.setitem(ACTIVATIONS, "not_an_activation", 0)
    assert k != check_cache.key(TEXT, "a.rules")


def test_a_corrupt_entry_is_ignored_and_the_file_checked_again(tmp_path, cache):
    path = tmp_path / "mine.rules"
    path.write_text(TEXT)
    names = [r.label for r in load_rules(path).rules]
    (entry,) = _entries(cache)
    for garbage in ["{not json", "[]", json.dumps({"format": 1, "file": "x", "rules": []}), '{"format": 1}']:
        entry.write_text(garbage)
        assert [r.label for r in load_rules(path).rules] == names
        assert [r.label for r in load_rules(path).rules] == names  # the entry was written anew


def test_rules_loaded_with_helpers_are_not_kept(tmp_path, cache):
    path = tmp_path / "mine.rules"
    path.write_text("rule r: relu(x) where big(x) => x\n")
    load_rules(path, helpers={"big": lambda x: True})
    rules = load_rules(path, helpers={"big": lambda x: True})
    assert _entries(cache) == [] and not isinstance(rules.rules[0], LazyRule)


def test_lazy_bundled_rules_rewrite_as_checked_ones(resnet18, cache):
    graph = resnet18[0]
    checked = load_rules(RULES_DIR)
    lazy = load_rules(RULES_DIR)
    assert all(isinstance(r, LazyRule) and not r.compiled for r in lazy.rules)
    _, a = gawee.rewrite(graph, checked, trace=True)
    _, b = gawee.rewrite(graph, lazy, trace=True)
    assert [str(f) for f in a.trace] == [str(f) for f in b.trace]
    assert 0 < sum(r.compiled for r in lazy.rules) < len(lazy.rules)  # only the rules that matched


def _kept(tmp_path, text: str):
    """The rules ``text``, checked and kept on disk by one load, as a second load gives them (each a LazyRule)."""
    path = tmp_path / "mine.rules"
    path.write_text(text)
    load_rules(path)
    return load_rules(path)


def test_a_rule_tried_where_its_pattern_fails_stays_uncompiled(tmp_path, cache):
    """The rewriter tries a kept rule at every node of its root op; only a match of its generated matcher compiles it
    (reading its deferred fields, `extra_roots` included, before that would compile every rule tried)."""
    lazy = _kept(tmp_path, "rule twice: relu(relu(x)) => relu(x)\nrule exp_log: exp(log(x)) => x\n")
    b = GraphBuilder("g")
    x = b.input("x", "f32[4]")
    graph = b.output(b.add(b.relu(b.exp(x)), b.exp(b.relu(x))))  # both root ops, neither pattern
    _, report = gawee.rewrite(graph, lazy)
    assert report.total == 0 and not any(r.compiled for r in lazy.rules)


def test_a_rewrite_with_calibration_compiles_only_the_kept_rules_that_name_calibrated(tmp_path, cache):
    """Calibration runs before a phase whose rules match `calibrated`; asking the kept rules does not compile those
    whose text cannot name it (the CLI passes calibration on every run)."""
    from gawee.rewrite.calibration import Calibration

    lazy = _kept(tmp_path, "rule twice: relu(relu(x)) => relu(x)\nrule seen: relu(calibrated(x, ...)) => relu(x)\n")
    b = GraphBuilder("g")
    x = b.input("x", "f32[4]")
    graph = b.output(b.exp(x))
    calibration = Calibration.of([torch.zeros(4)], "zeros")
    _, report = gawee.rewrite(graph, lazy, calibration=calibration)
    assert report.total == 0 and [r.compiled for r in lazy.rules] == [False, True]
    assert [r.names_op("calibrated") for r in lazy.rules] == [False, True]
