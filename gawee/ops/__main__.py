"""`python -m gawee.ops` prints the op reference (docs/ops.md is this output)."""

from gawee.ops import OPAQUE, REQUIRED, all_ops


def reference() -> str:
    """The registry as Markdown: one row per op."""
    lines = [
        "# gawee ops",
        "",
        "Generated from the op registry by `python -m gawee.ops > docs/ops.md` (a test keeps it current).",
        "Operands marked `?` are optional, `*` variadic; attributes show their kind and default.",
        "",
        "| op | operands | attributes | traits | captured from | notes |",
        "|---|---|---|---|---|---|",
    ]
    for name, op in all_ops().items():
        operands = ", ".join(o.name + ("*" if o.variadic else "?" if o.optional else "") for o in op.operands)
        attrs = ", ".join(
            a.name + ": " + a.kind + ("" if a.default is REQUIRED else f" = {a.default!r}") for a in op.attrs
        )
        traits = ", ".join(sorted(op.traits))
        aten = ", ".join(f"`{b.target}`" for b in op.aten) if name != OPAQUE else "any ATen op without an OpDef"
        lines.append(f"| `{name}` | {operands} | {attrs} | {traits} | {aten} | {op.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
