"""Parsed rule files kept on disk: reused while nothing they depend on changes, never when it does."""

import json

import pytest

import gawee
from gawee.dsl import ast_cache, parser
from gawee.rewrite.ruleset import RULES_DIR, load_rules

TEXT = """
# relu(relu(x)) -> relu(x)
rule relu_twice: relu(relu(x)) => relu(x)

rule mul_one: mul(x, 1) where x.rank >= 1 => x
"""


def test_bundled_rules_round_trip_through_an_entry():
    for path in sorted(RULES_DIR.glob("*.rules")):
        text = path.read_text()
        asts = parser.parse_rules(text, f"rules/{path.name}")
        back = ast_cache.from_json(json.loads(json.dumps(ast_cache.to_json(asts))), text)
        assert back == asts  # fields compare; spans do not: compare them apart
        assert [(str(b.span), b.span.end_line, b.span.end_col, b.text) for b in back] == [
            (str(a.span), a.span.end_line, a.span.end_col, a.text) for a in asts
        ]
        assert [r.pattern.span.render_caret() for r in back] == [r.pattern.span.render_caret() for r in asts]


def test_a_kept_entry_is_used_and_an_edited_file_is_parsed_again(tmp_path, monkeypatch):
    path = tmp_path / "mine.rules"
    path.write_text(TEXT)
    first = load_rules(path)
    with monkeypatch.context() as m:
        m.setattr(parser, "parse_rules", lambda *a: pytest.fail("parsed again"))
        again = load_rules(path)
    assert [r.name for r in again.rules] == [r.name for r in first.rules] == ["relu_twice", "mul_one"]
    assert again.rule("mul_one").location == first.rule("mul_one").location
    path.write_text(TEXT.replace("rule mul_one", "rule mul_by_one"))  # stale entry: never read
    assert [r.name for r in load_rules(path).rules] == ["relu_twice", "mul_by_one"]


def test_a_corrupt_entry_is_ignored_and_rewritten(tmp_path):
    where = tmp_path / "cache"
    ast_cache.parse_rules_cached(TEXT, "x.rules", where)
    (entry,) = where.iterdir()
    for garbage in ["{not json", json.dumps({"format": 1, "rules": [["Import", "os"]]}), "[]", '{"format": 1}']:
        entry.write_text(garbage)
        asts = ast_cache.parse_rules_cached(TEXT, "x.rules", where)
        assert [a.name for a in asts] == ["relu_twice", "mul_one"]
        assert ast_cache.from_json(json.loads(entry.read_text()), TEXT) == asts  # written anew


def test_the_key_covers_text_file_and_code():
    assert ast_cache.key(TEXT, "a.rules") != ast_cache.key(TEXT, "b.rules")
    assert ast_cache.key(TEXT, "a.rules") != ast_cache.key(TEXT + " ", "a.rules")
    assert ast_cache.key(TEXT, "a.rules") == ast_cache.key(TEXT, "a.rules")


def test_an_unwritable_cache_is_no_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    asts = ast_cache.parse_rules_cached(TEXT, "x.rules", blocked / "sub")
    assert len(asts) == 2


def test_cached_rules_rewrite_as_parsed_ones(resnet18):
    graph = resnet18[0]
    _, a = gawee.rewrite(graph, gawee.default_rules(), trace=True)
    _, b = gawee.rewrite(graph, load_rules(RULES_DIR), trace=True)  # the second load: from the cache
    assert [str(f) for f in a.trace] == [str(f) for f in b.trace]
