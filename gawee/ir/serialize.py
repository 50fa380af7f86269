"""Save and load graphs: JSON for structure (versioned schema), .npz beside it for tensor data.

Loading never executes code: the JSON is plain data and the .npz is read with
``allow_pickle=False``. Both files are written atomically and byte-for-byte
deterministically: the same graph gives the same files on any host (the .npz zip
entries carry a fixed timestamp and host system, arrays are little-endian; the JSON
holds no timings — capture reports them in CaptureStats — and floats are printed as
Python's shortest round-tripping repr).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import sympy
import torch

from gawee.errors import GaweeError, SerializationError, first_line, read_text_file
from gawee.ir import symbolic
from gawee.ir.core import Graph, Value
from gawee.ir.types import NUMPY_STORAGE, DType, Layout, TensorType

FORMAT = "gawee.graph"
VERSION = 2
"""2: symbolic dimensions — a top-level ``symbols`` table (name -> min, max, example), a shape
dimension may be a string (``"s0"``, ``"2*s0"``), an attribute size an object ``{"dim": "s0"}``.
Version 1 files (static shapes only) still load."""
READS = (1, 2)

MAX_JSON_DEPTH = 32
"""The deepest nesting a saved graph may have (it has about 8: nodes, a node, its attributes, a list of lists)."""

MAX_DIM = 2**62
"""The largest size a saved shape may give a dimension (torch counts elements in 64-bit integers)."""


# -- saving ----------------------------------------------------------------------------
def _type_json(t: TensorType) -> dict:
    d = {"shape": [s if isinstance(s, int) else symbolic.text(s) for s in t.shape], "dtype": t.dtype.value}
    if t.layout is not Layout.contiguous:
        d["layout"] = t.layout.value
    return d


def _attr_json(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_attr_json(x) for x in v]
    if isinstance(v, sympy.Basic):
        return {"dim": symbolic.text(v)}
    return v


def _symbols_json(graph: Graph) -> dict:
    syms = symbolic.symbols_of([v.type for v in graph.inputs])
    for node in graph:
        syms |= symbolic.symbols_of([v.type for v in node.outputs]) | symbolic.symbols_of(dict(node.attrs))
    return {s.name: {"min": s.lo, "max": s.hi, "example": s.example} for s in sorted(syms, key=lambda s: s.name)}


def to_json_dict(graph: Graph) -> tuple[dict, dict[str, torch.Tensor]]:
    """The JSON document for ``graph`` and the tensors that go into the .npz (by value name)."""
    arrays: dict[str, torch.Tensor] = {}
    constants = []
    for v in graph.constants():
        entry = {"name": v.name, "type": _type_json(v.type)}
        if v.has_known_data:
            arrays[v.name] = v.data
        else:
            entry["meta"] = True  # captured on the meta device: no values exist
        constants.append(entry)
    nodes = []
    for node in graph:
        entry = {
            "name": node.name,
            "op": node.op,
            "inputs": [None if v is None else v.name for v in node.inputs],
            "outputs": [{"name": v.name, "type": _type_json(v.type)} for v in node.outputs],
        }
        if node.attrs:
            entry["attrs"] = {k: _attr_json(v) for k, v in node.attrs.items()}
        if node.source:
            entry["source"] = node.source
        nodes.append(entry)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "name": graph.name,
        "meta": graph.meta,
        **({"symbols": syms} if (syms := _symbols_json(graph)) else {}),
        "inputs": [{"name": v.name, "type": _type_json(v.type)} for v in graph.inputs],
        "constants": constants,
        "nodes": nodes,
        "outputs": [v.name for v in graph.outputs],
    }
    return doc, arrays


def save(graph: Graph, path: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``path`` (.json) and its .npz sibling atomically; returns both paths."""
    path = Path(path)
    if path.suffix != ".json":
        raise SerializationError(f"{path}: a saved graph is a .json file", hint="use a path ending in .json")
    doc, arrays = to_json_dict(graph)
    npz_path = path.with_suffix(".npz")
    doc["data"] = npz_path.name
    text = json.dumps(doc, indent=1, allow_nan=True) + "\n"
    write_output(npz_path, _npz_bytes(arrays))
    write_output(path, text.encode())
    return path, npz_path


def _npz_bytes(arrays: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, t in arrays.items():
            t = t.detach().cpu().contiguous()
            arr = t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
            arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)  # the same bytes on any host
            member = io.BytesIO()
            np.lib.format.write_array(member, arr, allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.create_system = 3  # ZipInfo says 0 on Windows, 3 elsewhere: fixed, so is every header byte
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file beside it and a rename: a reader never sees half a file, and a
    failure leaves nothing behind. Missing directories are created. Raises OSError (caches that may fail
    silently catch it); :func:`write_output` is the form for files a user asked for."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written model is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_output(path: Path, data: bytes) -> None:
    """:func:`_atomic_write` for a file the user asked for: a directory that cannot be created or written, or a
    full disk, is a GaweeError naming the path (and nothing is left behind)."""
    try:
        _atomic_write(path, data)
    except OSError as e:
        raise GaweeError(
            f"cannot write {path}: {e.strerror or e}",
            hint="check that the directory can be created and written, and that the disk has space",
        ) from None


def check_writable(path: str | os.PathLike, flag: str = "") -> None:
    """Raise GaweeError now if :func:`_atomic_write` could not write ``path`` later: ``path`` is a directory, or
    no file can be made in its nearest existing ancestor directory (a temporary one is made and removed there —
    permission bits alone do not tell, e.g. under ``/proc``). For commands that check their outputs before any
    work; ``flag`` (``-o``) names the option in the message."""
    path = Path(path)
    name = f"{flag} {path}" if flag else str(path)
    if path.is_dir():
        raise GaweeError(f"{name} is a directory", hint="give a file name")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise GaweeError(f"{name}: {ancestor} is not a directory", hint="give a path in a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".gawee-probe.", dir=ancestor)
    except OSError as e:
        raise GaweeError(
            f"{name}: cannot create files in {ancestor} ({e.strerror or e})",
            hint="write to a directory you can create files in",
        ) from None
    os.close(fd)
    os.unlink(probe)


# -- loading ---------------------------------------------------------------------------
class _Doc:
    """Typed access into the JSON document; every failure names the file and JSON path."""

    def __init__(self, path: Path):
        self.path = path
        self.symbols: dict[str, symbolic.Sym] = {}

    def fail(self, where: str, msg: str, hint: str | None = None):
        raise SerializationError(msg, where=f"{self.path}: {where}" if where else str(self.path), hint=hint)

    def get(self, obj: Any, key: str | int, kind: type | tuple, where: str) -> Any:
        if not isinstance(obj, dict):
            self.fail(where, f"expected an object, got {type(obj).__name__} {str(obj)[:40]}")
        try:
            v = obj[key]
        except KeyError:
            self.fail(where, f"missing {key!r}")
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.fail(
                f"{where}.{key}" if where else str(key), f"expected {names}, got {type(v).__name__} {str(v)[:40]}"
            )
        return v

    def optional(self, obj: dict, key: str, kind: type | tuple, where: str, default: Any) -> Any:
        """``obj[key]`` checked like :meth:`get`, or ``default`` where the key is absent."""
        return self.get(obj, key, kind, where) if key in obj else default

    def type(self, obj: Any, where: str) -> TensorType:
        t = self.get(obj, "type", dict, where)
        shape = self.get(t, "shape", list, f"{where}.type")
        if not all(
            (isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_DIM) or isinstance(s, str) for s in shape
        ):
            self.fail(f"{where}.type.shape", f"shape must be ints in 0..2**62 or symbolic sizes, got {str(shape)[:60]}")
        shape = [self.dim(s, f"{where}.type.shape") if isinstance(s, str) else s for s in shape]
        dtype_text = self.get(t, "dtype", str, f"{where}.type")
        layout_text = self.optional(t, "layout", str, f"{where}.type", "contiguous")
        try:
            dtype = DType.parse(dtype_text)
            layout = Layout(layout_text)
        except (GaweeError, ValueError) as e:
            self.fail(f"{where}.type", str(e.args[0] if e.args else e))
        return TensorType(tuple(shape), dtype, layout)

    def dim(self, text: str, where: str):
        try:
            return symbolic.parse(text, self.symbols)
        except GaweeError as e:
            self.fail(where, e.message, hint=e.hint or 'declare every symbol in "symbols"')

    def read_symbols(self, doc: dict) -> None:
        for name, e in self.optional(doc, "symbols", dict, "", {}).items():
            w = f"symbols.{name}"
            if not name.isidentifier():
                self.fail(w, f"symbol name {name!r} is not an identifier")
            lo, ex = self.get(e, "min", int, w), self.get(e, "example", int, w)
            hi = e.get("max")
            bad_hi = hi is not None and (not isinstance(hi, int) or hi < lo or ex > hi)
            if bad_hi or lo < 0 or ex < lo:
                self.fail(w, f"symbol {name}: need 0 <= min <= example <= max, got {e}")
            self.symbols[name] = symbolic.Sym(name, lo, hi, ex)

    def check_depth(self, doc: Any) -> None:
        """Refuse JSON nested deeper than MAX_JSON_DEPTH, at its path. A saved graph nests a few levels (an
        attribute's list of lists is the deepest); reading deeper would only end in a RecursionError."""
        stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
        while stack:
            v, where, depth = stack.pop()
            if depth > MAX_JSON_DEPTH:
                self.fail(where, f"nested deeper than {MAX_JSON_DEPTH} levels", hint="a saved graph nests a few")
            if isinstance(v, dict):
                stack.extend((x, f"{where}.{k}" if where else str(k), depth + 1) for k, x in v.items())
            elif isinstance(v, list):
                stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))

    def attr(self, v: Any, where: str) -> Any:
        if isinstance(v, list):
            return tuple(self.attr(x, where) for x in v)
        if isinstance(v, dict) and set(v) == {"dim"} and isinstance(v["dim"], str):
            return self.dim(v["dim"], where)
        return v


def load(path: str | os.PathLike) -> Graph:
    """Load a graph saved by :func:`save`. Raises SerializationError saying where and what is wrong."""
    path = Path(path)
    d = _Doc(path)
    text = read_text_file(path, str(path), SerializationError)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SerializationError(
            f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
            where=str(path),
            hint="the file may be truncated or hand-edited",
        ) from None
    except RecursionError:  # json's reader recurses per level of nesting
        d.fail("", f"nested deeper than {MAX_JSON_DEPTH} levels", hint="a saved graph nests a few")
    d.check_depth(doc)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        d.fail(
            "format",
            f"not a gawee graph (format is {doc.get('format') if isinstance(doc, dict) else None!r})",
            hint=f'expected "format": "{FORMAT}"',
        )
    version = d.get(doc, "version", int, "")
    if version not in READS:
        d.fail("version", f"schema version {version} is not supported (this gawee reads {', '.join(map(str, READS))})")
    d.read_symbols(doc)
    arrays = _load_npz(path, doc, d)

    graph = Graph(d.get(doc, "name", str, ""))
    graph.meta = d.optional(doc, "meta", dict, "", {})
    values: dict[str, Value] = {}

    def define(v: Value, where: str) -> None:
        if v.name in values:
            d.fail(where, f"name {v.name!r} is defined twice")
        values[v.name] = v

    for i, e in enumerate(d.get(doc, "inputs", list, "")):
        w = f"inputs[{i}]"
        define(graph.add_input(d.type(e, w), d.get(e, "name", str, w)), w)
    for i, e in enumerate(d.get(doc, "constants", list, "")):
        w = f"constants[{i}]"
        name, t = d.get(e, "name", str, w), d.type(e, w)
        if d.optional(e, "meta", bool, w, False):
            try:
                data = torch.empty(t.shape, dtype=t.dtype.torch, device="meta")
            except RuntimeError as err:  # more elements than torch can count
                d.fail(w, f"constant {name!r} of type {t}: {first_line(err)}")
        else:
            data = _array_for(name, t, arrays, d, w)
        v = Value(t, name, data=data)
        graph._names.add(name)
        define(v, w)
    for i, e in enumerate(d.get(doc, "nodes", list, "")):
        w = f"nodes[{i}]"
        name = d.get(e, "name", str, w)
        op = d.get(e, "op", str, w)
        inputs = []
        for k, ref in enumerate(d.get(e, "inputs", list, w)):
            if ref is None:
                inputs.append(None)
            elif not isinstance(ref, str) or ref not in values:
                d.fail(
                    f"{w}.inputs[{k}]",
                    f"{ref!r} is not defined before node {name!r}",
                    hint="values must be defined (input, constant or earlier node) before use",
                )
            else:
                inputs.append(values[ref])
        outs = d.get(e, "outputs", list, w)
        types = [d.type(o, f"{w}.outputs[{k}]") for k, o in enumerate(outs)]
        attrs = {k: d.attr(v, f"{w}.attrs.{k}") for k, v in d.optional(e, "attrs", dict, w, {}).items()}
        source = d.optional(e, "source", str, w, "")
        try:
            node = graph.create_node(op, inputs, attrs, types=types, name=name, source=source)
        except GaweeError as err:
            d.fail(w, f"node {name!r}: {err.message}", hint=err.hint)
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError, OverflowError, ZeroDivisionError) as err:
            # the op's own inference (torch on meta tensors) refused what the file says: quoted, with its node
            d.fail(w, f"node {name!r} ({op}) cannot be built from what the file says: {first_line(err)}")
        if node.name != name:
            d.fail(w, f"name {name!r} is defined twice")
        for k, (o, v) in enumerate(zip(outs, node.outputs)):
            v.name = d.get(o, "name", str, f"{w}.outputs[{k}]")
            graph._names.add(v.name)
            define(v, f"{w}.outputs[{k}]")
    outs = []
    for i, ref in enumerate(d.get(doc, "outputs", list, "")):
        if not isinstance(ref, str) or ref not in values:
            d.fail(f"outputs[{i}]", f"output {ref!r} is not defined")
        outs.append(values[ref])
    graph.set_outputs(outs)

    from gawee.ir.verify import verify

    try:
        verify(graph)
    except GaweeError as e:
        d.fail("", f"the graph is inconsistent: {e.message}", hint="the file was probably hand-edited")
    return graph


def _load_npz(path: Path, doc: dict, d: _Doc) -> dict[str, np.ndarray]:
    constants = d.get(doc, "constants", list, "")
    needs_data = any(not c.get("meta") for c in constants if isinstance(c, dict))
    if not needs_data:
        return {}
    npz = path.parent / d.get(doc, "data", str, "")
    try:
        with np.load(npz, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise SerializationError(
            f"tensor data file {npz} is missing",
            where=str(path),
            hint="keep the .npz written by save() next to the .json",
        ) from None
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise SerializationError(f"cannot read tensor data {npz}: {first_line(e)}", where=str(path)) from None
    except (RuntimeError, NotImplementedError) as e:  # zipfile: an entry that is encrypted, or compressed unknown
        raise SerializationError(f"cannot read tensor data {npz}: {first_line(e)}", where=str(path)) from None


def _array_for(name: str, t: TensorType, arrays: dict[str, np.ndarray], d: _Doc, where: str) -> torch.Tensor:
    if name not in arrays:
        d.fail(where, f"constant {name!r} has no array in the .npz", hint="the .npz does not belong to this .json")
    arr = arrays[name]
    arr = arr.astype(arr.dtype.newbyteorder("="), copy=False)  # saved little-endian; no copy on such a host
    want = np.dtype(NUMPY_STORAGE[t.dtype])
    if tuple(arr.shape) != t.shape or arr.dtype != want:
        d.fail(
            where,
            f"array {name!r} is {arr.dtype}{list(arr.shape)} but the graph says {t}",
            hint="the .npz does not match the .json",
        )
    data = torch.from_numpy(arr.copy())
    return data.view(torch.bfloat16) if t.dtype is DType.bf16 else data
