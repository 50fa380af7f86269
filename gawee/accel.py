"""The rewrite engine's hot modules compiled to C with Cython: the same source, run without the interpreter.

A rewrite spends its time in many small Python steps — a worklist visit, a use list edited, a guard's closure, a
constant's check — spread over the IR, the driver and the rule closures, with little of it in torch. Cython
translates a module of plain Python into C that makes the same calls on the same objects: classes, closures,
generators and exceptions keep their Python semantics (annotations are not read as C types), so the compiled
module computes exactly what its source does, without the bytecode dispatch. The source stays the one reference:
nothing in it is written for Cython, and a module runs interpreted wherever it has not been compiled.

:data:`MODULES` are compiled. ``gawee-rewrite accel build`` (``make`` runs it after installing) translates each
and compiles it with the system's C compiler into gawee's cache directory (``$GAWEE_ACCEL_DIR`` where set), under
a name that digests the module's source (and the C declarations it is built against: :meth:`Accelerated.declarations`),
the interpreter's ABI and the build's flags; :func:`install`, called by
``gawee/__init__`` before anything else is imported, puts a finder first on ``sys.meta_path`` that loads a
module's compiled form where one built from its current source exists, and otherwise leaves the module to the
normal import. So a module edited since its build runs interpreted until it is built again: a stale build is
never loaded. ``GAWEE_ACCEL=0`` turns the finder off (every module interpreted); ``gawee-rewrite accel status``
says which form each module has.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gawee.resources import PACKAGE_DIR, cache_dir

MODULES = (
    "gawee.ir.registry",
    "gawee.ir.core",
    "gawee.ir.types",
    "gawee.ops.base",
    "gawee.analysis.tensor_facts",
    "gawee.dsl.matcher",
    "gawee.dsl.library",
    "gawee.dsl.expressions",
    "gawee.dsl.const_fold",
    "gawee.dsl.compiler",
    "gawee.dsl.codegen",
    "gawee.dsl.check_cache",
    "gawee.rewrite.context",
    "gawee.rewrite.ruleset",
    "gawee.rewrite.driver",
)
"""The modules compiled: those a rewrite spends its time in (the IR and its op table, type inference and the op
registry's caches, the rule closures and their constant folding, the lookups of a rule's generated matchers and
kept facts, the worklist driver)."""

CYTHON_FLAGS = ("-3", "-X", "annotation_typing=False,binding=True,nonecheck=True")
"""Python 3 semantics; annotations are documentation, never C types (an ``int`` annotation would otherwise make
Cython reject a bool or overflow where Python does not); functions keep their Python introspection. The C types
are declared apart: a module's ``.pxd`` (its classes' fields) and ``@cython.locals`` (locals of an extension type);
a field read through a local that holds None raises, as in Python, instead of reading nothing."""

CFLAGS = ("-O2", "-fPIC", "-shared", "-fno-strict-aliasing", "-DNDEBUG", "-w")
"""The C compiler's: a shared library of position-independent code, as CPython's own extensions are built."""

BUILD_FLAGS = (*CYTHON_FLAGS, *CFLAGS)
"""Both, digested into every library's name: a build with other flags is another library."""

OFF = "GAWEE_ACCEL"
"""Environment variable: ``0`` runs every module interpreted."""


def enabled() -> bool:
    """Whether compiled modules are loaded (``GAWEE_ACCEL`` is not ``0``)."""
    return os.environ.get(OFF, "1") != "0"


class Accelerated:
    """Compiled forms of some modules of one package: where each is kept, whether the kept one is current."""

    def __init__(self, package: str, package_dir: Path, modules: tuple[str, ...], store: Path):
        self.package = package
        self.package_dir = package_dir
        self.modules = frozenset(modules)
        self.store = store
        self._declarations: dict[str, bytes] = {}

    def source(self, module: str) -> Path:
        """The module's source file (``gawee.ir.core`` -> ``<package_dir>/ir/core.py``)."""
        parts = module.split(".")
        if parts[0] != self.package:
            raise ValueError(f"{module} is not in {self.package}")
        return self.package_dir.joinpath(*parts[1:]).with_suffix(".py")

    def built(self, module: str, text: bytes | None = None) -> Path:
        """Where the module's compiled form built from its current source (``text``, else read) is kept: the name
        digests that source, its :meth:`declarations`, the interpreter's ABI (its extension suffix names the
        version and platform) and the build's flags."""
        if text is None:
            text = self.source(module).read_bytes()
        key = b"\0".join([text, self.declarations(module), _abi().encode(), *(f.encode() for f in BUILD_FLAGS)])
        digest = hashlib.sha256(key).hexdigest()[:20]
        return self.store / f"{module}-{digest}{_abi()}"

    def declarations(self, module: str) -> bytes:
        """What ``module`` is compiled against besides its source: its ``.pxd``, and the source and ``.pxd`` of
        every module of the package that it cimports (transitively). A compiled module reads a declared type's
        fields where the declaration puts them; a type whose module was edited since its build runs interpreted
        and has no such fields, so every module compiled against it must run interpreted too until all are built
        again — which this makes so: the edit changes their names as well. Read once per process."""
        got = self._declarations.get(module)
        if got is None:
            parts, todo, seen = [], [module], {module}
            while todo:
                name = todo.pop()
                pxd = self.source(name).with_suffix(".pxd")
                if not pxd.is_file():
                    continue
                text = pxd.read_bytes()
                parts += [name.encode(), text]
                if name != module:
                    parts.append(self.source(name).read_bytes())
                for used in sorted({a or b for a, b in _CIMPORT.findall(text.decode())}):
                    if used.split(".")[0] == self.package and used not in seen:
                        seen.add(used)
                        todo.append(used)
            got = self._declarations[module] = b"\0".join(parts)
        return got

    def current(self, module: str) -> Path | None:
        """The compiled form to load for ``module``, or None: not one of these, not built from its current
        source, or turned off."""
        if module not in self.modules or not enabled():
            return None
        try:
            path = self.built(module)
        except OSError:
            return None
        return path if path.is_file() else None


_CIMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+cimport\b|cimport\s+([\w.]+))", re.MULTILINE)


class Finder(importlib.abc.MetaPathFinder):
    """Loads a module's compiled form where :meth:`Accelerated.current` has one; else the normal import does."""

    def __init__(self, accelerated: Accelerated):
        self.accelerated = accelerated

    def find_spec(self, fullname, path=None, target=None):
        built = self.accelerated.current(fullname)
        if built is None:
            return None
        loader = Loader(fullname, str(built), self.accelerated.source(fullname))
        return importlib.util.spec_from_file_location(fullname, built, loader=loader)


class Loader(importlib.machinery.ExtensionFileLoader):
    """Loads a compiled module whose ``__file__`` is its source's path, as the interpreted module's is (the module
    was compiled from exactly that text): code that finds files beside its module keeps finding them. The spec's
    ``origin`` and the loader still name the library. A library this interpreter cannot load (damaged, or built
    for another one) is reported once and the module is run from its source instead: a bad cache never stops
    gawee from importing."""

    def __init__(self, name: str, path: str, source: Path):
        super().__init__(name, path)
        self.source = source
        self.interpreted: importlib.machinery.SourceFileLoader | None = None

    def create_module(self, spec):
        try:
            module = super().create_module(spec)
        except ImportError as e:
            why = f"gawee.accel: {self.path} cannot be loaded ({e}); {self.name} runs interpreted"
            warnings.warn(why, stacklevel=2)
            self.interpreted = importlib.machinery.SourceFileLoader(self.name, str(self.source))
            return None  # the default module object, which exec_module fills from the source
        module.__file__ = str(self.source)  # before the module's code runs (it may read __file__ at import)
        return module

    def exec_module(self, module):
        if self.interpreted is None:
            super().exec_module(module)
        else:
            module.__file__ = str(self.source)
            self.interpreted.exec_module(module)


def _abi() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


STORE = "GAWEE_ACCEL_DIR"
"""Environment variable: the directory of the compiled modules (default: ``accel/`` in gawee's cache directory)."""

GAWEE = Accelerated("gawee", PACKAGE_DIR, MODULES, Path(os.environ.get(STORE) or cache_dir() / "accel"))


def install() -> None:
    """Put gawee's finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, Finder) and f.accelerated is GAWEE for f in sys.meta_path):
        sys.meta_path.insert(0, Finder(GAWEE))


# ---------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------


def compile_module(accelerated: Accelerated, module: str) -> str | None:
    """Translate ``module`` with Cython and compile it into its :meth:`Accelerated.built` path (atomically: a
    concurrent import never sees half a library). None when done (or already built), else why not."""
    source = accelerated.source(module)  # translated where it is: tracebacks name it (gawee/ir/core.py)
    text = source.read_bytes()
    dest = accelerated.built(module, text)
    if dest.is_file():
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "no C compiler (set CC)"
    if importlib.util.find_spec("Cython") is None:
        return "Cython is not installed (pip install 'gawee[accel]')"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create {dest.parent}: {e.strerror or e}"
    include = "-I" + sysconfig.get_paths()["include"]
    with tempfile.TemporaryDirectory(prefix="gawee-accel-") as tmp:
        c_file, library = str(Path(tmp) / "module.c"), str(Path(tmp) / "module.so")
        root = f"-I{accelerated.package_dir.parent}"  # where `cimport gawee.ir.core` finds gawee/ir/core.pxd
        translate = [sys.executable, "-m", "cython", *CYTHON_FLAGS, root, "--module-name", module, "-o", c_file]
        steps = {"cython": [*translate, str(source)], Path(cc).name: [cc, *CFLAGS, include, "-o", library, c_file]}
        for step, cmd in steps.items():
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.SubprocessError) as e:
                return f"{step} failed: {e}"
            if done.returncode != 0:
                return f"{step} failed: {(done.stderr or done.stdout).strip()[-800:]}"
        if source.read_bytes() != text:  # edited while it was translated: what was built is of neither text
            return "its source changed while it was compiled"
        fd, part = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
        os.close(fd)
        try:
            shutil.copyfile(library, part)
            os.chmod(part, 0o755)  # as a library the linker writes (mkstemp makes 0600)
            os.replace(part, dest)
        finally:
            if os.path.exists(part):
                os.unlink(part)
    for old in dest.parent.glob(f"{module}-*{_abi()}"):  # builds from earlier sources are never loaded again
        if old != dest:
            old.unlink(missing_ok=True)
    return None


def build(accelerated: Accelerated = GAWEE, jobs: int | None = None, echo=print) -> dict[str, str]:
    """Compile every module not built from its current source, ``jobs`` at a time (default: the CPUs); each
    printed as it ends. The modules that could not be compiled, with why (they run interpreted)."""
    todo = [m for m in sorted(accelerated.modules) if not accelerated.built(m).is_file()]
    failed: dict[str, str] = {}
    if not todo:
        return failed
    echo(f"gawee.accel: compiling {len(todo)} module(s) with Cython (once per source change)")

    def one(module: str) -> tuple[str, str | None, float]:
        t0 = time.perf_counter()
        return module, compile_module(accelerated, module), time.perf_counter() - t0

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for module, why, seconds in pool.map(one, todo):
            if why is None:
                echo(f"  {module}: compiled ({seconds:.1f} s)")
            else:
                failed[module] = why
                echo(f"  {module}: not compiled, runs interpreted: {why}")
    return failed


def status(accelerated: Accelerated = GAWEE) -> dict[str, str]:
    """For each module: ``compiled`` (its compiled form is loaded, or would be at import), ``interpreted``."""
    out = {}
    for m in sorted(accelerated.modules):
        loaded = sys.modules.get(m)
        if loaded is not None:
            loader = getattr(loaded, "__loader__", None)
            compiled = isinstance(loader, importlib.machinery.ExtensionFileLoader) and not getattr(
                loader, "interpreted", None
            )
        else:
            compiled = accelerated.current(m) is not None
        out[m] = "compiled" if compiled else "interpreted"
    return out


def summary(accelerated: Accelerated = GAWEE) -> str:
    """One line: how many of the modules run compiled (for reports and benchmark notes)."""
    got = status(accelerated)
    n = sum(v == "compiled" for v in got.values())
    if not enabled():
        return f"engine interpreted ({OFF}=0)"
    return f"engine compiled with Cython ({n} of {len(got)} modules)" if n else "engine interpreted (not built)"
