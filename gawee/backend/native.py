"""gawee's own C kernels: a source beside this file compiled once per machine and loaded with ctypes.

Each is compiled with the system's C compiler (``$CC``, else ``cc``) for the host CPU (``-march=native``, OpenMP:
libgomp, the runtime torch and oneDNN share), and kept in gawee's cache directory (:mod:`gawee.cache`) under a name
that digests the source, the compiler and the machine (:func:`gawee.cache.path`; a temporary directory, for this
process only, where that cannot be written). A source includes the headers beside it it shares with the others
(``#include "vec.h"``: the vector type, loads and stores); their text is digested with it, so changing a header
rebuilds every source that includes it. Without a C compiler :func:`load` says why, and the runtime offers no
kernel of that source; nothing else changes.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


def load(source: Path, argtypes: dict[str, list], flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str | None]:
    """The compiled ``source`` with its functions' ``argtypes`` set (they return an int status), or why it cannot
    be had; ``flags`` are the compiler's beyond :data:`FLAGS`. Callers cache the answer (a build runs once per
    process at most)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, f"no C compiler (set CC) to build {source.name}"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"the C compiler {cc} does not run: {e}"
    from gawee import cache

    question = "\n".join([*_texts(source), cc, version, *FLAGS, *flags])
    path = cache.path(source.stem, question, ".so")
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:  # a read-only home: built for this process only, again by the next
            path = Path(tempfile.mkdtemp(prefix=f"gawee-{source.stem}-")) / path.name
        why = _build(cc, [*FLAGS, *flags], source, path)
        if why is not None:
            return None, why
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"{path} cannot be loaded: {e}"
    for name, types in argtypes.items():
        getattr(lib, name).argtypes = types
    return lib, None


def _texts(source: Path) -> list[str]:
    """The text of ``source`` and of each header beside it that it includes (``#include "name.h"``, once each, and
    theirs): what the build reads besides the system's headers."""
    texts, seen, todo = [], set(), [source]
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        text = path.read_text(encoding="utf-8")
        texts.append(text)
        todo += [source.parent / name for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.MULTILINE)]
    return texts


def library(loaded: tuple[ctypes.CDLL | None, str | None]) -> ctypes.CDLL:
    """The library of a :func:`load` answer; RuntimeError with the reason where there is none."""
    lib, why = loaded
    if lib is None:
        raise RuntimeError(why)
    return lib


def _build(cc: str, flags: list[str], source: Path, path: Path) -> str | None:
    """Compiles ``source`` to ``path`` (atomically: a concurrent process's build is never seen half-written); why
    not, if it fails."""
    try:
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    except OSError as e:
        return f"no file to build {source.name} into in {path.parent}: {e}"
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, "-o", tmp, str(source)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            return f"{cc} could not build {source.name}: {done.stderr.strip()[:500]}"
        os.replace(tmp, path)
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cc} could not build {source.name}: {e}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
