"""`python -m gawee.backend.ops_reference` prints the op reference (docs/ops.md is this output): each op's record
in the registry and the targets that lower it, asked of the targets' own lowering tables (the registry knows no
target, so the reference is written from here)."""

from gawee.backend.lower_mlir import MLIR
from gawee.backend.lower_onnx import ONNX
from gawee.backend.lower_torch import TORCH
from gawee.ops import OPAQUE, REQUIRED, all_ops


def lowers_to(name: str) -> str:
    """The targets that lower op ``name``: ``torch*`` where the torch table has an entry of its own, ``torch``
    where the op runs its reference semantics there; ``ONNX`` and ``MLIR`` where their tables have one."""
    targets = ["torch*" if name in TORCH else "torch"]
    targets += [label for label, table in (("ONNX", ONNX), ("MLIR", MLIR)) if name in table]
    return ", ".join(targets)


def reference() -> str:
    """The registry as Markdown: one row per op."""
    lines = [
        "# gawee ops",
        "",
        "Generated from the op registry and the targets' lowering tables by",
        "`python -m gawee.backend.ops_reference > docs/ops.md` (a test keeps it current).",
        "Operands marked `?` are optional, `*` variadic; attributes show their kind and default.",
        "*lowers to*: the targets with a lowering of the op. torch runs every op: `torch*` has an entry of its own in",
        "the torch table (a fused or measured kernel, an in-place update), plain `torch` runs the op's reference",
        "semantics.",
        "",
        "| op | operands | attributes | traits | captured from | lowers to | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, op in all_ops().items():
        operands = ", ".join(o.name + ("*" if o.variadic else "?" if o.optional else "") for o in op.operands)
        attrs = ", ".join(
            a.name + ": " + a.kind + ("" if a.default is REQUIRED else f" = {a.default!r}") for a in op.attrs
        )
        traits = ", ".join(sorted(op.traits))
        aten = ", ".join(f"`{b.target}`" for b in op.aten) if name != OPAQUE else "any ATen op without an OpDef"
        lines.append(f"| `{name}` | {operands} | {attrs} | {traits} | {aten} | {lowers_to(name)} | {op.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
