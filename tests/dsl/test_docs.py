"""docs/rules.md documents every builtin of the rule language."""

from pathlib import Path

from gawee.dsl.library import BUILTINS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text()


def test_every_builtin_is_documented():
    missing = [name for name in BUILTINS if f"`{name}(" not in DOC]
    assert not missing, f"docs/rules.md does not document: {missing}"
