"""gawee's C kernels' build step: a source and the headers it includes compiled once, rebuilt when either
changes, a failing compiler a reason and not an error."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from gawee.backend import native

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")

SOURCE = '#include "answer.h"\nint gawee_answer(int *out) { *out = ANSWER; return 0; }\n'


def _answer(source) -> tuple[int, str]:
    lib = native.library(native.load(source, {"gawee_answer": [ctypes.POINTER(ctypes.c_int)]}))
    out = ctypes.c_int()
    assert lib.gawee_answer(ctypes.byref(out)) == 0
    return out.value, lib._name


def test_a_changed_header_rebuilds_the_source_that_includes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "answer.c"
    source.write_text(SOURCE)
    (tmp_path / "answer.h").write_text('#include "deeper.h"\n#define ANSWER (DEEPER + 1)\n')
    (tmp_path / "deeper.h").write_text("#define DEEPER 41\n")
    value, first = _answer(source)
    assert value == 42
    assert _answer(source) == (42, first)  # the same library, not built again
    (tmp_path / "deeper.h").write_text("#define DEEPER 6\n")  # a header the header includes
    value, second = _answer(source)
    assert value == 7 and second != first


def test_the_bundled_sources_share_one_vector_header():
    from pathlib import Path

    here = Path(native.__file__).parent
    for name in ("depthwise.c", "grouped.c", "winograd.c"):
        texts = native._texts(here / name)
        assert len(texts) == 2 and "typedef float vf" in texts[1], name
        assert "static inline vf load" not in texts[0], name  # defined once, in vec.h


def test_a_compiler_that_fails_is_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "broken.c"
    source.write_text("int gawee_broken(void) { return undefined_name; }\n")
    lib, why = native.load(source, {})
    assert lib is None and "could not build broken.c" in why and "undefined_name" in why
