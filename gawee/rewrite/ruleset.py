"""RuleSet: compiled rules from `.rules` files, one phase per file, and the bundled default pipeline."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gawee.dsl import check_cache
from gawee.dsl.ast_cache import parse_rules_cached
from gawee.dsl.code_cache import attach_cached
from gawee.dsl.compiler import Rule, compile_rule
from gawee.dsl.library import BUILTINS, Helper, helper_builtin
from gawee.errors import GaweeError, RuleError, RuleSyntaxError, read_text_file
from gawee.resources import bundled_dir, missing_hint

RULES_DIR = bundled_dir("rules")
"""The bundled rules: `1-simplify`, `2-fold`, `3-fuse` ... run in file-name order."""

PRECISIONS = {"bf16": RULES_DIR / "precision" / "bf16.rules", "int8": RULES_DIR / "precision" / "int8.rules"}
"""The bundled precision phases, by name: approximate rules (each with its declared error bound) that compute
in a lower precision. Opt-in only (`optimize --precision NAME`, :func:`precision_rules`): the default pipeline
never reads rules/precision/."""

TARGETS_DIR = RULES_DIR / "targets"
"""The bundled target phases, one directory per runtime (``targets/onednn/``): the fusions that runtime executes as
one step, written as rules that produce its target ops (:mod:`gawee.ops.targets`). ``gawee.compile`` runs a
runtime's phase on the graph it builds that runtime from (:attr:`gawee.backend.runtime.Runtime.rules`);
``optimize --target NAME`` runs it last, to show it."""

log = logging.getLogger("gawee.rules")


@dataclass
class Phase:
    """Rules applied together to a fixpoint; the rewriter runs phases in order."""

    name: str
    rules: list[Rule]
    _by_op: dict[str | None, list[Rule]] = field(default_factory=dict, repr=False)
    _enclosing: dict[tuple[str, int], list[Rule]] = field(default_factory=dict, repr=False)
    _lowest: dict[str, int] = field(default_factory=dict, repr=False)
    _above: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)
    _idle: dict[str, bool] = field(default_factory=dict, repr=False)

    def candidates(self, op: str) -> list[Rule]:
        """Rules whose root can be ``op`` (including `_(...)` roots), by priority then file order."""
        got = self._by_op.get(op)
        if got is None:
            got = sorted((r for r in self.rules if r.root_op in (op, None)), key=lambda r: (-r.priority, r.index))
            self._by_op[op] = got
        return got

    def lowest(self, op: str) -> int:
        """The lowest priority among ``op``'s candidates (0 when it has none)."""
        got = self._lowest.get(op)
        if got is None:
            got = self._lowest[op] = min((r.priority for r in self.candidates(op)), default=0)
        return got

    def idle(self, op: str) -> bool:
        """No rule is ever tried at a node of ``op``: none is rooted there, and none of a higher priority is
        rooted at any op a user could have (:meth:`enclosing_ops`). The worklist does not visit such nodes
        unless they are dead (it erases them)."""
        got = self._idle.get(op)
        if got is None:
            got = self._idle[op] = not self.candidates(op) and not self.enclosing_ops(op)
        return got

    def enclosing_ops(self, op: str) -> frozenset[str]:
        """The ops with rules that :meth:`enclosing` gives above ``op``'s lowest priority: a visited node's users
        of other ops have no rule to try first, and the worklist skips them without asking."""
        got = self._above.get(op)
        if got is None:
            low = self.lowest(op)
            ops = (r.root_op for r in self.rules if r.root_op is not None and r.priority > low)
            got = self._above[op] = frozenset(ops)
        return got

    def enclosing(self, op: str, above: int) -> list[Rule]:
        """Rules rooted at exactly ``op`` with a priority above ``above`` (tried at a visited node's users)."""
        key = (op, above)
        got = self._enclosing.get(key)
        if got is None:
            got = self._enclosing[key] = [r for r in self.candidates(op) if r.root_op == op and r.priority > above]
        return got


@dataclass
class RuleSet:
    phases: list[Phase]

    @property
    def rules(self) -> list[Rule]:
        return [r for p in self.phases for r in p.rules]

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)

    def __len__(self) -> int:
        return sum(len(p.rules) for p in self.phases)

    def __repr__(self) -> str:
        return f"<RuleSet {', '.join(f'{p.name}({len(p.rules)})' for p in self.phases)}>"


def rule_files(paths: tuple[str | os.PathLike, ...]) -> list[Path]:
    """Expand directories into their `.rules` files (name order); refuse what is not a rules file."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.rules"))
            if not found:
                raise GaweeError(f"{p}: no .rules files in this directory")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise GaweeError(f"{p}: no such rules file or directory", hint="pass .rules files or directories")
    return out


def load_rules(*paths: str | os.PathLike, helpers: Mapping[str, Helper | Callable] | None = None) -> RuleSet:
    """Compile rule files into a RuleSet: one phase per file, in the order given.

    ``helpers`` makes Python functions callable from these rules (nothing else
    executes Python: loading a file only parses it). Raises RuleSyntaxError /
    RuleError with file:line:col for anything wrong, checked at load time.
    """
    compiled_helpers = {}
    for name, h in (helpers or {}).items():
        if name in BUILTINS:
            raise GaweeError(f"helper {name!r} would shadow the builtin of that name")
        compiled_helpers[name] = helper_builtin(name, h)
    phases = []
    for f in rule_files(paths):
        shown = display_path(f)
        text = read_text_file(f, shown, RuleSyntaxError)
        phases.append(load_phase(text, shown, f.stem, compiled_helpers, keep=True))
    return _number(phases)


def display_path(path: Path) -> str:
    """How a rules file is named in diagnostics and provenance: `rules/x.rules` for bundled ones (in subfolders
    too: `rules/precision/bf16.rules`), else relative to the working directory when inside it."""
    path = path.resolve()
    if path.is_relative_to(RULES_DIR):
        return f"rules/{path.relative_to(RULES_DIR).as_posix()}"
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def load_rules_text(
    text: str, name: str = "<rules>", helpers: Mapping[str, Helper | Callable] | None = None
) -> RuleSet:
    """A RuleSet of one phase from rule text (for tests and notebooks)."""
    compiled = {n: helper_builtin(n, h) for n, h in (helpers or {}).items()}
    return _number([load_phase(text, name, Path(name).stem, compiled)])


def load_phase(text: str, file: str, name: str, helpers, keep: bool = False) -> Phase:
    """One phase from rule text; ``keep``: the text is a file's, whose parsed form, checked rules and generated
    matchers are kept on disk between processes (gawee.dsl.ast_cache, gawee.dsl.check_cache,
    gawee.dsl.code_cache) — not done for texts given directly, which are rarely loaded twice (their matchers
    are generated on first use). A file kept as checked (loaded before with the same text, code and ops, and
    no helpers) is not checked again: its rules are compiled on first use, its warnings logged as when it was
    checked."""
    rules = check_cache.load(text, file) if keep and not helpers else None
    if rules is not None:
        for rule in rules:
            rule.phase = name
            for w in rule.warnings:
                log.warning("%s", w)
        attach_cached(rules, text, file)
        return Phase(name, rules)
    if keep:
        asts = parse_rules_cached(text, file)
    else:
        from gawee.dsl.parser import parse_rules  # imported only to parse (it imports lark)

        asts = parse_rules(text, file)
    lines = text.splitlines()
    rules = []
    groups = []
    for ast in asts:
        comment = _comment_above(lines, ast.span.line)
        variants = compile_rule(ast, helpers, comment=comment)
        groups.append((ast, comment, variants))
        for rule in variants:
            rule.phase = name
            rules.append(rule)
            for w in rule.warnings:
                log.warning("%s", w)
    if keep:
        attach_cached(rules, text, file)
        if not helpers:
            check_cache.store(groups, text, file)
    return Phase(name, rules)


def _number(phases: list[Phase]) -> RuleSet:
    seen: dict[str, Rule] = {}
    i = 0
    for phase in phases:
        for r in phase.rules:
            if r.name in seen and seen[r.name].span is not r.span:  # alternatives share a name and a span
                raise RuleError(
                    f"rule {r.name!r} is defined twice (first at {seen[r.name].location})",
                    span=r.span,
                    hint="rule names must be unique in a rule set",
                )
            seen[r.name] = r
            r.index = i
            i += 1
    return RuleSet(phases)


def _comment_above(lines: list[str], line: int) -> str:
    """The comment block right above line ``line`` (1-based), its lines joined by spaces."""
    i = line - 2
    block: list[str] = []
    while 0 <= i < len(lines) and lines[i].strip().startswith("#"):
        block.append(lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(reversed(block))


def precision_rules(name: str) -> Path:
    """The bundled rule file of precision phase ``name`` (a key of PRECISIONS); GaweeError for another name."""
    path = PRECISIONS.get(name)
    if path is None:
        raise GaweeError(f"no precision phase {name!r}", hint="precision phases: " + ", ".join(PRECISIONS))
    if not path.is_file():
        raise GaweeError(f"the bundled precision rules are missing: {path}", hint=missing_hint())
    return path


def with_precision(rules: RuleSet | None, name: str) -> RuleSet:
    """``rules`` (None: the bundled pipeline) followed by the bundled precision phase ``name``, run last;
    GaweeError for an unknown name."""
    base = default_rules() if rules is None else rules
    return _number([*base.phases, *load_rules(precision_rules(name)).phases])


def targets() -> list[str]:
    """The runtimes with a bundled target phase (the directories of :data:`TARGETS_DIR`), in name order."""
    return sorted(p.name for p in TARGETS_DIR.iterdir() if p.is_dir()) if TARGETS_DIR.is_dir() else []


def target_dir(name: str) -> Path:
    """The bundled target phase of the runtime ``name`` (a directory of TARGETS_DIR); GaweeError for another
    name."""
    path = TARGETS_DIR / name
    if not path.is_dir():
        known = ", ".join(targets()) or "none"
        raise GaweeError(f"no target phase {name!r}", hint=f"target phases: {known}")
    return path


def target_rules(name: str, skip: tuple[str, ...] = ()) -> RuleSet:
    """The bundled target phase of the runtime ``name`` (its files in name order, each a phase), but for the
    phases named in ``skip`` (a file's stem: those of a kernel the runtime cannot build here), compiled once per
    process (again only if a file changed); GaweeError for a runtime without one."""
    files = tuple(p for p in sorted(target_dir(name).glob("*.rules")) if p.stem not in skip)
    return _target(files, tuple(p.stat().st_mtime_ns for p in files))


def variants(name: str) -> list[str]:
    """The variants of the runtime ``name`` with a bundled phase of their own (``rules/targets/<name>/variants/``)."""
    return sorted(p.stem for p in (target_dir(name) / "variants").glob("*.rules"))


def variant_dir(name: str, variant: str) -> Path:
    """The bundled phase of the runtime ``name``'s variant ``variant``; GaweeError where it has none."""
    path = target_dir(name) / "variants" / f"{variant}.rules"
    if not path.is_file():
        known = ", ".join(f"{name}:{v}" for v in variants(name)) or "none"
        raise GaweeError(f"no phase for the variant {name}:{variant}", hint=f"variants with a phase: {known}")
    return path


def variant_rules(name: str, variant: str) -> RuleSet | None:
    """The bundled phase that makes the runtime ``name``'s variant ``variant`` from the graph after its target phase
    (``rules/targets/<name>/variants/<variant>.rules``: oneDNN's activation layouts), compiled once per process
    (again only if it changed); None where it has none."""
    path = target_dir(name) / "variants" / f"{variant}.rules"
    return _target((path,), (path.stat().st_mtime_ns,)) if path.is_file() else None


@functools.lru_cache(maxsize=8)
def _target(files: tuple[Path, ...], stamp: tuple) -> RuleSet:
    return load_rules(*files)


def default_rules() -> RuleSet:
    """The bundled pipeline (every file of rules/, in name order), compiled once per process
    (again only if a file changed)."""
    if not RULES_DIR.is_dir():
        raise GaweeError(f"the bundled rules are missing: {RULES_DIR}", hint=missing_hint())
    stamp = tuple((p.name, p.stat().st_mtime_ns) for p in sorted(RULES_DIR.glob("*.rules")))
    return _bundled(stamp)


@functools.lru_cache(maxsize=1)
def _bundled(stamp: tuple) -> RuleSet:
    return load_rules(RULES_DIR)
