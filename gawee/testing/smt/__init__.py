"""The solver tier of the soundness harness: instances of a rule proven or refuted for every input.

``terms`` (hash-consed element terms), ``execute`` (graphs executed into terms), ``encode`` (the z3
encoding of each op with exact IEEE semantics, and the axioms of the others), ``solve`` (one instance
decided), ``verdict`` (instances aggregated into a rule's proof).
"""

from gawee.testing.smt.solve import RLIMIT, InstanceProof, prove_instance

__all__ = ["RLIMIT", "InstanceProof", "prove_instance"]
