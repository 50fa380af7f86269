"""JSON + .npz round trip is exact and deterministic; bad files give a typed error with a path."""

import json

import numpy as np
import pytest
import torch

import gawee
from gawee.errors import SerializationError
from gawee.ir.builder import GraphBuilder
from tests.conftest import captured


def test_round_trip_resnet18_is_exact(tmp_path):
    g, _, x = captured("resnet18")
    json_path, npz_path = g.save(tmp_path / "r.json")
    assert npz_path.exists()
    back = gawee.load(json_path)
    assert str(back) == str(g)
    assert [v.name for v in back.constants()] == [v.name for v in g.constants()]
    for a, b in zip(g.constants(), back.constants()):
        assert a.type == b.type and torch.equal(a.data, b.data)
    torch.testing.assert_close(gawee.run(back, x)[0], gawee.run(g, x)[0], rtol=0, atol=0)


def test_save_is_byte_deterministic(tmp_path):
    g, _, _ = captured("resnet18")
    g.save(tmp_path / "a.json")
    g.save(tmp_path / "b.json")
    a, b = (tmp_path / "a.json").read_text(), (tmp_path / "b.json").read_text()
    assert a.replace("a.npz", "b.npz") == b
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_bf16_f16_and_int_constants_round_trip(tmp_path):
    b = GraphBuilder("d")
    x = b.input("x", "bf16[3]")
    y = b.add(x, b.const(torch.tensor([1.5, -2.0, 3.0], dtype=torch.bfloat16), "c_bf16"))
    z = b.cast(y, dtype="f16")
    i = b.add(b.const(torch.arange(3), "c_i64"), b.const(torch.tensor([True, False, True]), "c_bool"))
    b.output(z, i)
    b.graph.save(tmp_path / "d.json")
    back = gawee.load(tmp_path / "d.json")
    for a, c in zip(b.graph.constants(), back.constants()):
        assert a.dtype == c.dtype and torch.equal(a.data, c.data)


def _saved(tmp_path):
    g, _, _ = captured("squeezenet1_1")  # small (5 MB of weights): these tests corrupt the files
    path, npz = g.save(tmp_path / "r.json")
    return path, npz, json.loads(path.read_text())


def _expect(path, match):
    with pytest.raises(SerializationError, match=match) as info:
        gawee.load(path)
    assert str(path) in str(info.value)
    return info.value


def test_truncated_json(tmp_path):
    path, _, _ = _saved(tmp_path)
    path.write_text(path.read_text()[:5000])
    _expect(path, "not valid JSON")


def test_unknown_op(tmp_path):
    path, _, doc = _saved(tmp_path)
    doc["nodes"][3]["op"] = "relux"
    path.write_text(json.dumps(doc))
    err = _expect(path, "no op named 'relux'")
    assert "nodes[3]" in str(err) and "relu" in err.hint


def test_hand_edited_reference_and_type(tmp_path):
    path, _, doc = _saved(tmp_path)
    doc["nodes"][2]["inputs"][0] = "nonexistent"
    path.write_text(json.dumps(doc))
    _expect(path, r"nodes\[2\].inputs\[0\].*not defined")
    path, _, doc = _saved(tmp_path)
    doc["nodes"][0]["outputs"][0]["type"]["shape"] = [1, 2]
    path.write_text(json.dumps(doc))
    _expect(path, "inconsistent.*typed")
    path, _, doc = _saved(tmp_path)
    del doc["nodes"][1]["op"]
    path.write_text(json.dumps(doc))
    _expect(path, r"nodes\[1\].*missing 'op'")


def test_npz_missing_or_misshaped_array(tmp_path):
    path, npz, doc = _saved(tmp_path)
    arrays = dict(np.load(npz))
    name = doc["constants"][0]["name"]
    del arrays[name]
    np.savez(npz, **arrays)
    _expect(path, f"constant '{name}' has no array")
    arrays[name] = np.zeros((2, 2), dtype=np.float32)
    np.savez(npz, **arrays)
    _expect(path, f"array '{name}' is float32\\[2, 2\\]")
    npz.unlink()
    _expect(path, "tensor data file .* is missing")


def test_not_a_gawee_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"hello": 1}))
    _expect(p, "not a gawee graph")
    with pytest.raises(SerializationError, match="cannot read"):
        gawee.load(tmp_path / "missing.json")


def test_meta_capture_saves_without_data(tmp_path):
    import torchvision

    with torch.device("meta"):
        model = torchvision.models.resnet18()
    g = gawee.capture(model, (torch.randn(1, 3, 224, 224, device="meta"),))
    g.save(tmp_path / "m.json")
    back = gawee.load(tmp_path / "m.json")
    assert str(back) == str(g)
    assert all(v.data.device.type == "meta" for v in back.constants() if v.type.rank > 0)


def test_saved_files_are_ordinary_files(tmp_path):
    import os
    import stat

    g, _, _ = captured("squeezenet1_1")
    path, npz = g.save(tmp_path / "m.json")
    umask = os.umask(0)
    os.umask(umask)
    for p in (path, npz):
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
