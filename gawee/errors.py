"""The GaweeError family: every user-facing failure, with a location and a fix."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CARET_WIDTH = 120
"""The most characters of a source line a diagnostic quotes."""


@dataclass(frozen=True)
class SourceSpan:
    """A region of a text file (1-based line and column), for caret diagnostics."""

    file: str
    line: int
    col: int
    end_line: int | None = None
    end_col: int | None = None
    text: str | None = None
    """The full source text the span points into (used to quote the line)."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def source_line(self) -> str | None:
        if self.text is None:
            return None
        lines = self.text.splitlines()
        if 1 <= self.line <= len(lines):
            return lines[self.line - 1]
        return None

    def render_caret(self) -> str:
        """The quoted source line with ``^^^`` under the span, or "" if unavailable. A line longer than
        CARET_WIDTH is quoted as the window of it that starts at the span (``...`` marks what is cut), so that
        a diagnostic stays one screen on a generated file."""
        line = self.source_line()
        if line is None:
            return ""
        line = line.expandtabs(1)
        start = max(self.col - 1, 0)
        if self.end_line == self.line and self.end_col is not None and self.end_col > self.col:
            width = self.end_col - self.col
        else:
            width = 1
        width = max(1, min(width, max(len(line) - start, 1)))
        if len(line) > CARET_WIDTH:
            lead = min(start, 20)  # some context before the span
            first = start - lead
            shown = line[first : first + CARET_WIDTH]
            before = "..." if first > 0 else ""
            after = "..." if first + CARET_WIDTH < len(line) else ""
            line, start = before + shown + after, len(before) + lead
            width = min(width, CARET_WIDTH - lead)
        return f"    {line}\n    {' ' * start}{'^' * width}"


class GaweeError(Exception):
    """Base of every error gawee raises on bad input.

    ``message`` says what is wrong, ``span`` (optional) where, ``hint`` (optional)
    how to fix it. ``str(err)`` renders all three, compiler-style.
    """

    kind = "error"
    finding = False
    """True where the error is a finding about the rules or the model (a rule that builds a replacement of the
    wrong type, rules that never reach a fixpoint), not bad usage or input: the CLI exits 1 for it, else 2."""

    def __init__(
        self, message: str, *, span: SourceSpan | None = None, hint: str | None = None, where: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint
        self.where = where
        """A non-source location, e.g. a JSON path or a node name."""

    def __str__(self) -> str:
        head = f"{self.span}: " if self.span else (f"{self.where}: " if self.where else "")
        parts = [f"{head}{self.kind}: {self.message}"]
        if self.span:
            caret = self.span.render_caret()
            if caret:
                parts.append(caret)
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


class RuleSyntaxError(GaweeError):
    """A ``.rules`` file that does not parse."""

    kind = "syntax error"


class RuleError(GaweeError):
    """A ``.rules`` file that parses but does not check (unknown op, arity, unbound name...)."""

    kind = "rule error"


class RuleWarning(GaweeError):
    """Something in a ``.rules`` file that is legal but probably not meant (a variable bound and never
    used). Never raised: compiled rules carry their warnings and loading logs them."""

    kind = "warning"


class RewriteError(GaweeError):
    """A rule misbehaved while rewriting (wrong replacement type, non-termination...)."""

    kind = "rewrite error"
    finding = True


class IRError(GaweeError):
    """A graph that breaks an IR invariant, or a misuse of the mutation API."""

    kind = "IR error"


class UnknownOpError(IRError):
    """An op name that is not in the registry."""

    kind = "unknown op"


class InferenceError(IRError):
    """Shape/dtype inference failed or disagreed with what was recorded."""

    kind = "inference error"


class SerializationError(GaweeError):
    """A saved graph (JSON + .npz) that cannot be loaded."""

    kind = "load error"


class CaptureError(GaweeError):
    """A model that torch.export cannot capture."""

    kind = "capture error"


class ModelSpecError(GaweeError):
    """A MODEL argument that does not resolve to a model."""

    kind = "model error"


class EvaluationError(GaweeError):
    """Executing a node failed (reference interpreter or backend)."""

    kind = "evaluation error"


class InputError(GaweeError, TypeError):
    """A call of a compiled module with inputs it does not take: their number, a name, a kind or a dtype (a shape
    it does not take is a :class:`gawee.ir.symbolic.ShapeOutOfRange`)."""

    kind = "input error"


class EquivalenceError(GaweeError):
    """Two graphs that should be equivalent are not."""

    kind = "not equivalent"


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): a foreign library's
    error, quoted in one of gawee's own."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def read_text_file(path: str | os.PathLike, shown: str, error: type[GaweeError] = GaweeError) -> str:
    """The text of the UTF-8 file at ``path`` (a leading byte-order mark dropped), named ``shown`` in errors.

    Raises ``error`` instead of OSError (a file that cannot be read) or UnicodeDecodeError (bytes that are not
    UTF-8: located at their line and column, so the offending spot is found)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise error(f"cannot read {shown}: {e.strerror or first_line(e)}", hint="check the path") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise error(
            f"not a UTF-8 text file (byte 0x{data[e.start]:02x} at line {line}, column {col})",
            where=shown,
            hint="save the file as UTF-8 text",
        ) from None
