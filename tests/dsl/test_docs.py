"""docs/rules.md documents every builtin of the rule language."""

from pathlib import Path

from gawee.dsl.library import BUILTINS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text()


def test_every_builtin_is_documented():
    missing = [name for name in BUILTINS if f"`{name}(" not in DOC]
    assert not missing, f"docs/rules.md does not document: {missing}"


def test_every_rule_in_the_docs_loads():
    import re

    from gawee import load_rules_text

    blocks = [b for b in re.findall(r"```\n(.*?)```", DOC, re.S) if re.search(r"^\s*rule \w", b, re.M)]
    assert len(blocks) >= 2
    for block in blocks:
        assert load_rules_text(block).rules
