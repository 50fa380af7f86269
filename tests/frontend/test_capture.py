"""Capture: torchvision models reproduce eager PyTorch; unknown ops stay opaque; failures are typed."""

import os
from pathlib import Path

import pytest
import torch

import gawee
from gawee.errors import CaptureError
from gawee.ops import OPAQUE
from tests.conftest import captured

MODELS = [
    "resnet18",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "convnext_tiny",
    "vit_b_16",
    "swin_t",
    "densenet121",
    "shufflenet_v2_x0_5",
    "squeezenet1_0",
    "inception_v3",
]


@pytest.mark.parametrize("name", MODELS)
def test_model_captures_and_reproduces_eager(name):
    g, model, x = captured(name)
    gawee.verify(g)
    assert gawee.infer_types(g) == []
    assert not [n for n in g if n.op == OPAQUE], "every op of the torchvision zoo has an OpDef"
    with torch.no_grad():
        ref = model(x)
    (out,) = gawee.run(g, x)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    err = (out - ref).abs().max().item()
    assert err <= 1e-4 * max(1.0, ref.abs().max().item())


class Unknown(torch.nn.Module):
    """cosh and cummax have no OpDef (deliberately) and torch no decomposition of them: they must be captured
    opaque and still run."""

    def forward(self, x):
        values, indices = torch.cummax(torch.cosh(x), dim=1)
        return torch.relu(values - indices) * 2


def test_unknown_ops_become_opaque_and_execute():
    x = torch.randn(3, 5)
    stats = gawee.CaptureStats()
    g = gawee.capture(Unknown(), (x,), stats=stats)
    assert stats.opaque_ops == {"aten.cosh.default": 1, "aten.cummax.default": 1}
    opaque = [n for n in g if n.op == OPAQUE]
    assert [n.attrs["target"] for n in opaque] == ["aten.cosh.default", "aten.cummax.default"]
    assert len(opaque[1].outputs) == 2
    torch.testing.assert_close(gawee.run(g, x)[0], Unknown()(x))
    assert gawee.cost(g).uncounted == {"aten.cummax.default": 1, "aten.cosh.default": 1}


class Composites(torch.nn.Module):
    """Ops the registry lacks that torch decomposes (``type_as``, ``multiply``, ``repeat_interleave`` are composites
    ``run_decompositions({})`` keeps; ``aminmax`` has a core decomposition), and ``torch.cat`` onto a legacy empty
    1-D tensor (Hugging Face's attention cache)."""

    def forward(self, x, y):
        lo, hi = torch.aminmax(torch.multiply(x.type_as(y), 2.0), dim=-1, keepdim=True)
        z = torch.cat([torch.empty(0), (hi - lo).repeat_interleave(2, dim=1)], dim=-1)
        return torch.cat([x, torch.empty(0), z.expand(-1, -1, 4)], dim=1)


def test_ops_the_registry_lacks_are_decomposed_into_ops_it_has():
    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 4, dtype=torch.float64)
    stats = gawee.CaptureStats()
    g = gawee.capture(Composites(), (x, y), stats=stats)
    assert not stats.opaque_ops
    assert stats.decompose_s > 0.0
    assert all(len({v.type.rank for v in n.inputs}) == 1 for n in g if n.op == "cat")  # the empty operands dropped
    torch.testing.assert_close(gawee.run(g, x, y)[0], Composites()(x, y))


class SoftmaxTo(torch.nn.Module):
    """``softmax`` with a ``dtype``: bound (``softmax.int``) but refused as called, the OpDef takes no dtype."""

    def forward(self, x):
        return torch.softmax(x, -1, dtype=torch.float32) + torch.softmax(x.float(), -1)


def test_an_op_its_binding_refuses_as_called_is_decomposed_and_converted_again():
    x = torch.randn(2, 5, dtype=torch.float16)
    stats = gawee.CaptureStats()
    g = gawee.capture(SoftmaxTo(), (x,), stats=stats)
    assert not stats.opaque_ops and stats.decompose_s > 0.0
    assert [n.op for n in g].count("softmax") == 2
    torch.testing.assert_close(gawee.run(g, x)[0], SoftmaxTo()(x))


def test_opaque_nodes_survive_save_and_load(tmp_path):
    x = torch.randn(3, 5)
    g = gawee.capture(Unknown(), (x,))
    g.save(tmp_path / "u.json")
    torch.testing.assert_close(gawee.run(gawee.load(tmp_path / "u.json"), x)[0], Unknown()(x))


class InPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = torch.nn.ReLU(inplace=True)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        y = x.clone()
        y.add_(1.0)
        y[:, 0] = 0.0
        y.mul_(self.scale)
        return self.act(y)


def test_no_in_place_op_reaches_the_ir():
    x = torch.randn(2, 4)
    g = gawee.capture(InPlace(), (x,))
    assert not [n for n in g if n.op == OPAQUE]
    assert not [n for n in g if n.source.split(".")[1].endswith("_")]
    torch.testing.assert_close(gawee.run(g, x)[0], InPlace()(x))


class FreshInPlace(torch.nn.Module):
    """In-place ops that write only fresh results nothing else reads (ResNet's ``relu_``, ``add_``) or write
    nothing (eval ``dropout_`` on a view), and composite ops of the training IR (``unflatten``, ``to``, eval
    ``dropout``)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.nn.functional.relu(self.conv(x), inplace=True)
        y = (y + 1.0).add_(x.mean(1, keepdim=True))
        z = torch.nn.functional.dropout(y.flatten(2), 0.5, training=False).unflatten(2, (4, -1))
        z = torch.nn.functional.dropout(z.flatten(1), 0.5, training=False, inplace=True)  # a view: writes nothing
        return z.to(torch.float64).sum(-1)


class ObservedInPlace(torch.nn.Module):
    """``relu_`` writes ``a`` after a view of it was taken: the view sees the write, and only
    functionalization keeps that right."""

    def forward(self, x):
        a = x * 2
        v = a.view(-1)
        a.relu_()
        return v + 1


class AliasedByComposite(torch.nn.Module):
    """Eval ``dropout`` returns its input itself: ``add_`` on its result writes ``x * 2``, which the view
    ``v`` shows."""

    def forward(self, x):
        a = x * 2
        v = a.view(-1)
        torch.nn.functional.dropout(a, 0.5, training=False).add_(1.0)
        return v + 0


def test_a_program_without_observable_mutation_is_not_functionalized_again():
    x, model = torch.randn(2, 3, 8, 8), FreshInPlace()
    stats = gawee.CaptureStats()
    g = gawee.capture(model, (x,), stats=stats)
    assert stats.decompose_s == 0.0, "run_decompositions is skipped"
    assert not stats.opaque_ops
    assert not [n for n in g if n.source.split(".")[1].endswith("_")]
    with torch.no_grad():
        torch.testing.assert_close(gawee.run(g, x)[0], model(x))


def test_a_mutation_someone_can_observe_is_functionalized():
    x = torch.randn(3, 4)
    # a view taken before the write; a write into a view (y[:, 0] = 0); a write through a composite's alias
    for model in (ObservedInPlace(), InPlace(), AliasedByComposite()):
        stats = gawee.CaptureStats()
        g = gawee.capture(model, (x,), stats=stats)
        assert stats.decompose_s > 0.0
        torch.testing.assert_close(gawee.run(g, x)[0], model(x.clone()))


class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot capture it
            return x * 2
        return x / 2


def test_export_failure_is_a_capture_error_saying_where():
    with pytest.raises(CaptureError) as info:
        gawee.capture(Branchy(), (torch.randn(3),))
    msg = str(info.value)
    assert "torch.export could not capture the model" in msg
    assert "test_capture.py" in msg  # where: the user's line
    assert info.value.hint
    log = msg.split("torch's output and full error: ")[1].split()[0]  # kept for the user to read
    assert "GuardOnDataDependentSymNode" in Path(log).read_text()
    os.unlink(log)


def test_parameters_become_named_constants(resnet18):
    g, model, _ = resnet18
    consts = {v.name: v for v in g.constants()}
    assert torch.equal(consts["conv1.weight"].data, model.conv1.weight.detach())
    assert torch.equal(consts["bn1.running_var"].data, model.bn1.running_var)


def test_meta_capture_matches_real_structure_and_cost(resnet18):
    import torchvision

    g, _, _ = resnet18
    with torch.device("meta"):
        model = torchvision.models.resnet18()
    m = gawee.capture(model, (torch.randn(1, 3, 224, 224, device="meta"),), name="resnet18")
    assert str(m) == str(g)
    assert gawee.cost(m).as_dict() == gawee.cost(g).as_dict()
