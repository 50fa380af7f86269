"""The rewriter: pattern matching with failure reasons, the worklist driver, rule sets, explain."""
