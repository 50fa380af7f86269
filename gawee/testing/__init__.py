"""Property testing for rules: example generation from rule text and the soundness harness (public)."""

from gawee.testing.generate import Example, generate
from gawee.testing.harness import Counterexample, RuleCheck, check_rule, check_rules

__all__ = ["Counterexample", "Example", "RuleCheck", "check_rule", "check_rules", "generate"]
