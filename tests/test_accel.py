"""gawee.accel: modules compiled with Cython are loaded only when built from their current source, and the compiled
engine rewrites exactly as the interpreted one."""

import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest

from gawee import accel

NEEDS_BUILD_TOOLS = pytest.mark.skipif(
    shutil.which(os.environ.get("CC") or "cc") is None or importlib.util.find_spec("Cython") is None,
    reason="needs a C compiler and Cython (the dev extra installs Cython)",
)

SOURCE = textwrap.dedent(
    '''
    """A module with what the engine's modules use: a class with slots, a closure, a generator, an exception."""

    class Box:
        __slots__ = ("value",)

        def __init__(self, value):
            self.value = value


    def scaled(k):
        return lambda x: x * k


    def count(n):
        yield from range(n)


    def parse(text: int):  # an annotation Cython must not enforce
        try:
            return int(text)
        except ValueError:
            return None


    def fail():
        raise ValueError("from the module")


    HERE = __file__
    FORM = "first"
    '''
)


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``accpkg`` with one module that can be compiled, its own store, and its finder first."""
    root = tmp_path / "src" / "accpkg"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "mod.py").write_text(SOURCE)
    acc = accel.Accelerated("accpkg", root, ("accpkg.mod",), tmp_path / "store")
    finder = accel.Finder(acc)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    yield acc
    for name in ("accpkg.mod", "accpkg"):
        sys.modules.pop(name, None)


def _fresh_import():
    for name in ("accpkg.mod", "accpkg"):
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    import accpkg.mod

    return accpkg.mod


def _compiled(module) -> bool:
    return isinstance(module.__loader__, importlib.machinery.ExtensionFileLoader)


def test_without_a_build_the_module_is_imported_from_its_source(package):
    assert package.current("accpkg.mod") is None
    mod = _fresh_import()
    assert not _compiled(mod) and mod.__file__.endswith("mod.py")
    assert package.current("accpkg.other") is None  # not one of the modules: never looked up


@NEEDS_BUILD_TOOLS
def test_a_compiled_module_is_loaded_only_while_its_source_is_the_one_built(package, monkeypatch):
    assert accel.build(package, echo=lambda line: None) == {}
    mod = _fresh_import()
    assert _compiled(mod), mod.__file__
    source = package.source("accpkg.mod")
    # the module sees its source's path, as interpreted (files beside it are found); the spec names the library
    assert mod.HERE == mod.__file__ == str(source) and mod.__spec__.origin.startswith(str(package.store))
    with pytest.raises(ValueError) as failed:
        mod.fail()
    assert traceback.extract_tb(failed.value.__traceback__)[-1].filename == "accpkg/mod.py"  # the source, by package
    assert (mod.Box(3).value, mod.scaled(4)(2.5), list(mod.count(3))) == (3, 10.0, [0, 1, 2])
    assert (mod.parse("7"), mod.parse(True), mod.parse("x")) == (7, 1, None)  # a bool where `int` is annotated
    with pytest.raises(AttributeError):
        mod.Box(1).other = 2  # slots, as in Python
    assert accel.status(package) == {"accpkg.mod": "compiled"}

    monkeypatch.setenv(accel.OFF, "0")
    assert not _compiled(_fresh_import())  # turned off: interpreted
    monkeypatch.delenv(accel.OFF)

    source.write_text(SOURCE.replace('FORM = "first"', 'FORM = "edited"'))
    mod = _fresh_import()
    assert not _compiled(mod) and mod.FORM == "edited"  # the build of the old source is never loaded

    old = set(package.store.iterdir())
    assert accel.build(package, echo=lambda line: None) == {}
    mod = _fresh_import()
    assert _compiled(mod) and mod.FORM == "edited"
    assert len(list(package.store.iterdir())) == 1 and not old & set(package.store.iterdir())  # the old one removed


def test_a_library_that_cannot_be_loaded_is_reported_and_the_source_runs_instead(package):
    built = package.built("accpkg.mod")
    built.parent.mkdir(parents=True)
    built.write_bytes(b"not a shared library")  # a damaged cache entry under the current source's name
    with pytest.warns(UserWarning, match="cannot be loaded.*accpkg.mod runs interpreted"):
        mod = _fresh_import()
    assert mod.scaled(3)(2) == 6 and mod.FORM == "first" and mod.__file__ == str(package.source("accpkg.mod"))
    assert sys.modules["accpkg.mod"] is mod and accel.status(package) == {"accpkg.mod": "interpreted"}


@NEEDS_BUILD_TOOLS
def test_a_module_that_cannot_be_compiled_says_why_and_runs_interpreted(package, monkeypatch):
    package.source("accpkg.mod").write_text(SOURCE + "\ndef broken(:\n")
    lines = []
    failed = accel.build(package, echo=lines.append)
    assert list(failed) == ["accpkg.mod"] and "cython failed" in failed["accpkg.mod"]
    assert any("not compiled, runs interpreted" in line for line in lines)
    assert list(package.store.glob("accpkg.mod-*")) == []

    package.source("accpkg.mod").write_text(SOURCE)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    failed = accel.build(package, echo=lambda line: None)
    assert "failed" in failed["accpkg.mod"]
    assert not _compiled(_fresh_import())


TYPED = textwrap.dedent(
    """
    class Cell:
        __slots__ = ("items", "next")

        def __init__(self, items):
            self.items = items
            self.next = None
    """
)

USER = textwrap.dedent(
    """
    try:
        import cython
    except ImportError:
        from gawee import cython_shim as cython

    from accpkg.mod import Cell


    @cython.locals(c=Cell)
    def total(c):
        n = 0
        while c is not None:
            n += len(c.items)
            c = c.next
        return n
    """
)


@NEEDS_BUILD_TOOLS
def test_declared_types_are_extension_types_and_who_reads_them_is_built_with_them(package, monkeypatch):
    """A class declared in a ``.pxd`` beside its module compiles to an extension type with typed fields; another
    module that cimports it reads them through a local declared of that type (``@cython.locals``), both enforced.
    That reader is built against the declaring module: when the declaring module's source is edited (so it runs
    interpreted, its class no longer an extension type), the reader runs interpreted too, never reads fields
    where there are none."""
    root = package.package_dir
    (root / "mod.py").write_text(TYPED)
    (root / "mod.pxd").write_text("cdef class Cell:\n    cdef public list items\n    cdef public Cell next\n")
    (root / "user.py").write_text(USER)
    (root / "user.pxd").write_text("from accpkg.mod cimport Cell\n")
    modules = ("accpkg.mod", "accpkg.user")

    def fresh():
        acc = accel.Accelerated("accpkg", root, modules, package.store)  # declarations are read once each
        monkeypatch.setattr(sys, "meta_path", [accel.Finder(acc), *sys.meta_path[1:]])
        for name in (*modules, "accpkg"):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
        import accpkg.mod
        import accpkg.user

        return acc, accpkg.mod, accpkg.user

    acc, _, _ = fresh()
    assert accel.build(acc, echo=lambda line: None) == {}
    acc, mod, user = fresh()
    assert _compiled(mod) and _compiled(user) and not mod.Cell.__flags__ & (1 << 9)  # not a heap type
    a, b = mod.Cell([1, 2]), mod.Cell([3])
    a.next = b
    assert user.total(a) == 3 and user.total(None) == 0
    with pytest.raises(TypeError):
        a.items = (1, 2)  # declared a list
    with pytest.raises(TypeError):
        user.total(7)  # declared a Cell
    with pytest.raises(AttributeError):
        a.other = 1

    (root / "mod.py").write_text(TYPED + "\n# edited\n")
    acc, mod, user = fresh()
    assert acc.current("accpkg.mod") is None and acc.current("accpkg.user") is None
    assert not _compiled(mod) and not _compiled(user)
    a = mod.Cell([1, 2])
    assert user.total(a) == 2
    for name in (*modules, "accpkg"):
        sys.modules.pop(name, None)


def test_the_engine_imports_and_rewrites_without_cython_installed():
    """Interpreted, the typed modules' ``import cython`` falls back to gawee.cython_shim."""
    script = (
        "import sys; sys.modules['cython'] = None\n"  # as if Cython were not installed
        "import gawee, gawee.cython_shim\n"
        "sys.path.insert(0, 'benchmarks'); import engine_speed\n"
        "out, report = gawee.rewrite(engine_speed.gawee_graph(8))\n"
        "print(sum(report.firings.values()), sys.modules['gawee.ir.core'].cython is gawee.cython_shim)\n"
    )
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, accel.OFF: "0"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    fired, shimmed = done.stdout.split()
    assert int(fired) > 10 and shimmed == "True"


REWRITE = textwrap.dedent(
    """
    import json, sys
    from gawee import accel
    sys.path.insert(0, "benchmarks")
    import engine_speed, trace_identity
    graph = engine_speed.gawee_graph(40)
    got = trace_identity.digests(graph)
    print(json.dumps({"digests": got, "engine": accel.summary()}))
    """
)


@NEEDS_BUILD_TOOLS
def test_the_compiled_engine_rewrites_exactly_as_the_interpreted_one():
    """The same firings, graph and folded constants from both forms of the engine, in processes of their own."""
    repo = Path(__file__).resolve().parents[1]
    assert accel.build(echo=lambda line: None) == {}  # nothing to do after `make test`'s own build
    runs = {}
    for label, off in (("compiled", "1"), ("interpreted", "0")):
        env = {**os.environ, accel.OFF: off}
        done = subprocess.run(
            [sys.executable, "-c", REWRITE], cwd=repo, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs[label] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs["compiled"]["engine"].startswith(f"engine compiled with Cython ({len(accel.MODULES)} of")
    assert runs["interpreted"]["engine"] == f"engine interpreted ({accel.OFF}=0)"
    assert runs["compiled"]["digests"]["firings"] > 50
    assert runs["compiled"]["digests"] == runs["interpreted"]["digests"]
