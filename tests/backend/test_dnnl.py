"""oneDNN's primitives as gawee's runtime (gawee.backend.dnnl): every op and epilogue it plans computes torch's
result, in each activation layout, and its buffers are reused without clobbering a live value."""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import itertools
import os
import signal

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gawee
from gawee.backend import dnnl, dnnl_conv, dnnl_plan, kernels, pool_u8, quantize_nhwc, run_steps, winograd
from gawee.backend.dnnl import DnnlModule
from gawee.cpu import no_vnni
from gawee.errors import GaweeError, InputError
from gawee.ir.builder import GraphBuilder
from gawee.ir.symbolic import ShapeOutOfRange
from gawee.rewrite.ruleset import target_rules

pytestmark = pytest.mark.skipif(dnnl.unavailable() is not None, reason=str(dnnl.unavailable()))
EXACT_INT8 = pytest.mark.skipif(no_vnni() is not None, reason=f"{no_vnni()}: no int8 kernel sums codes to 255 exactly")
"""For the graphs built with codes in [0, 255]: without VNNI or AMX, oneDNN has no int8 convolution that sums them
exactly (``dnnl_conv.exact_int8``), so they run as torch steps."""


class Lambda(nn.Module):
    def __init__(self, fn, *modules):
        super().__init__()
        self.fn, self.parts = fn, nn.ModuleList(modules)

    def forward(self, *xs):
        return self.fn(self.parts, *xs)


def _graph(model, *xs, precision: str | None = None):
    """``model`` captured, rewritten by the bundled rules (and the ``precision`` phase, int8's calibrated on
    ``xs``) and by the runtime's target phase, as gawee.compile hands it to the runtime."""
    from gawee.rewrite.calibration import Calibration
    from gawee.rewrite.ruleset import with_precision

    rules = with_precision(gawee.default_rules(), precision) if precision else None
    calibration = Calibration.of([xs], "the inputs") if precision == "int8" else None
    graph, _ = gawee.rewrite(gawee.capture(model.eval(), xs), rules, calibration=calibration)
    return dnnl.RUNTIME.lower(graph)[0]


def assert_runs_like(model, *xs, layouts=dnnl.LAYOUTS, rtol=1e-5):
    """Each layout's module computes what ``model`` computes (twice: the second call reuses every buffer)."""
    graph = _graph(model, *xs)
    assert dnnl.supports(graph) is None, dnnl.supports(graph)
    with torch.no_grad():
        want = model(*xs)
        want = want if isinstance(want, tuple) else (want,)
        for layout in layouts:
            module = DnnlModule(graph, layout=layout)
            for _ in range(2):
                got = module(*xs)
                for g, w in zip(got, want):
                    assert g.shape == w.shape
                    torch.testing.assert_close(g, w, rtol=rtol, atol=rtol * max(1.0, float(w.abs().max())))
    return graph


def convs_on(graph, layout: str, kind: type) -> int:
    """How many of ``graph``'s convolutions the module in ``layout`` runs on the kernel of ``kind``."""
    return list(DnnlModule(graph, layout=layout).conv_kernels.values()).count(kind.name)


def prefer(monkeypatch, kind: type, wins: bool) -> None:
    """Every race decided for (or against) the candidates of ``kind`` (a kernel of gawee's own), whatever the
    clock says."""
    fastest = dnnl_plan._Plan.fastest

    def decided(self, candidates, reads, situation=None):
        kept = [c for c in candidates if isinstance(c, kind) == wins] or candidates
        for c in candidates:
            if c not in kept:
                c.drop()
        return fastest(self, kept, reads, situation) if len(kept) > 1 else kept[0]

    monkeypatch.setattr(dnnl_plan._Plan, "fastest", decided)


def assert_runs_without_compiler(monkeypatch, tmp_path, source, kind: type, model, x) -> None:
    """With a C compiler that fails, ``source`` (the module of a kernel of gawee's own) gives a reason, not an
    error, and each layout's module is built without candidates of ``kind`` and still computes ``model``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built before
    try:
        monkeypatch.setenv("CC", "false")
        source._load.cache_clear()
        assert "could not build" in source.unavailable()
        prefer(monkeypatch, kind, wins=True)
        graph = assert_runs_like(model, x)
        for layout in dnnl.LAYOUTS:
            assert kind.name not in DnnlModule(graph, layout=layout).conv_kernels.values()
    finally:
        monkeypatch.undo()
        source._load.cache_clear()
    assert source.unavailable() is None


def assert_race_decides(monkeypatch, graph, name: str, convs: int) -> None:
    """The race decides whether the ``convs`` convolutions of ``graph`` a kernel of gawee's own (``name``) could
    compute run on it: with the kernel measured slower than oneDNN's (a scripted clock), none do; measured faster,
    all ``convs``, in every layout."""
    raced = []
    fastest = dnnl_plan._Plan.fastest

    def remembering(self, candidates, reads, situation=None):
        raced[:] = [c.name for c in candidates]
        return fastest(self, candidates, reads, situation)

    monkeypatch.setattr(dnnl_plan._Plan, "fastest", remembering)
    for own_time in (1.0, 1e-3):
        monkeypatch.setattr(
            kernels,
            "best_calls",
            lambda runners, *_, t=own_time, **__: {i: t if raced[i] == name else 0.5 for i in runners},
        )
        for layout in dnnl.LAYOUTS:
            chosen = list(DnnlModule(graph, layout=layout).conv_kernels.values()).count(name)
            assert chosen == (convs if own_time < 0.5 else 0), (layout, own_time)


ACTS = {
    "relu": F.relu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 2.0),
    "mish": F.mish,
}


def test_every_activation_the_runtime_maps_is_one_the_tests_check():
    assert set(ACTS) == set(dnnl_plan.ELTWISE)


@pytest.mark.parametrize("name", sorted(ACTS))
def test_each_activation_computes_torchs_as_a_conv_post_op_a_linear_post_op_and_alone(name):
    """The eltwise algorithm numbers and their alpha/beta are oneDNN's enumerations: a wrong one computes
    another function, which these catch. Inputs span [-9, 9], past every activation's knees."""
    torch.manual_seed(0)
    act = ACTS[name]
    conv = Lambda(lambda p, x: act(p[0](x)), nn.Conv2d(8, 16, 3, padding=1))
    linear = Lambda(lambda p, x: act(p[0](x)), nn.Linear(12, 10))
    alone = Lambda(lambda p, x: act(x * 3))
    assert_runs_like(conv, torch.randn(1, 8, 6, 6) * 3)
    assert_runs_like(linear, torch.randn(3, 12) * 3)
    assert_runs_like(alone, torch.randn(2, 16, 5, 5) * 3)


@settings(max_examples=25, deadline=None)
@given(
    groups=st.sampled_from([1, 2, "depthwise"]),
    cin=st.sampled_from([3, 8, 12, 16]),
    kernel=st.integers(1, 5),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    size=st.integers(6, 11),
    batch=st.integers(1, 2),
    residual=st.booleans(),
)
def test_convolution_geometries_compute_torchs(groups, cin, kernel, stride, padding, dilation, size, batch, residual):
    """Any stride, padding, dilation (oneDNN counts it from 0), group count, channel count (blocks of 8 or 16
    padded), with and without a residual post-op."""
    torch.manual_seed(0)
    g = cin if groups == "depthwise" else (groups if cin % groups == 0 else 1)
    cout = cin if groups == "depthwise" else 2 * g * 4
    conv = nn.Conv2d(cin, cout, kernel, stride, padding, dilation, groups=g)
    x = torch.randn(batch, cin, size, size)
    if (size + 2 * padding - dilation * (kernel - 1) - 1) < 0:
        return
    if residual:
        out = conv(x).shape
        model = Lambda(lambda p, x, r: torch.relu(p[0](x) + r), conv)
        assert_runs_like(model, x, torch.randn(out))
    else:
        assert_runs_like(Lambda(lambda p, x: p[0](x), conv), x)


def test_a_convolution_the_blocked_layout_has_only_the_reference_kernel_for_runs_in_one_with_a_kernel():
    """Groups of half a block of channels, three of them: the blocked layout pads the last block, where oneDNN has
    only its reference implementation (on AVX-512, RegNet's convolutions: up to 200 ms for one). The convolution
    runs in channels-last instead, in every layout of the module, and computes torch's."""
    torch.manual_seed(0)
    width = dnnl_plan.block_size() // 2
    model = nn.Sequential(nn.Conv2d(3 * width, 3 * width, 3, padding=1, groups=3), nn.ReLU())
    x = torch.randn(1, 3 * width, 28, 28)
    graph = assert_runs_like(model, x)
    for layout in dnnl.LAYOUTS:
        module = DnnlModule(graph, layout=layout)
        assert not [k for k in module.kernels if dnnl_plan._reference(k)], (layout, module.kernels)
    assert list(DnnlModule(graph, layout="blocked").conv_layouts.values()) == ["channels_last"]


def test_residual_blocks_in_both_layouts():
    torch.manual_seed(0)
    block = Lambda(
        lambda p, x: torch.relu(p[1](torch.relu(p[0](x))) + x),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.Conv2d(16, 16, 3, padding=1),
    )
    assert_runs_like(block, torch.randn(2, 16, 9, 9))


@pytest.mark.parametrize(
    "pool",
    [
        lambda x: F.max_pool2d(x, 3, 2, 1),
        lambda x: F.max_pool2d(x, 3, 2, 0, ceil_mode=True),
        lambda x: F.max_pool2d(x, 2, 2, 0, dilation=2),
        lambda x: F.max_pool2d(x, 2),
        lambda x: F.avg_pool2d(x, 3, 2, 1),
        lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
        lambda x: F.avg_pool2d(x, 2, 2, 0, ceil_mode=True),
        lambda x: F.adaptive_avg_pool2d(x, 1),
        lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
    ],
)
def test_pooling_computes_torchs_with_paddings_strides_and_ceil_mode(pool):
    torch.manual_seed(0)
    model = Lambda(lambda p, x: pool(p[0](x)), nn.Conv2d(8, 16, 1))
    assert_runs_like(model, torch.randn(2, 8, 9, 6))


@pytest.mark.parametrize(
    "mean, pooled",
    [
        (lambda x: x.mean([2, 3]), True),
        (lambda x: x.mean([-1, -2], keepdim=True), True),
        (lambda x: x.mean(3), False),
        (lambda x: x.mean([1, 2, 3]), False),
    ],
)
def test_a_mean_over_the_image_is_a_pooling_in_the_inputs_layout(mean, pooled):
    torch.manual_seed(0)
    model = Lambda(lambda p, x: mean(p[0](x)) + 1, nn.Conv2d(8, 20, 1))
    graph = assert_runs_like(model, torch.randn(2, 8, 5, 7))
    for layout in dnnl.LAYOUTS:
        assert ("torch:mean" not in DnnlModule(graph, layout=layout).kernels) == pooled


def test_an_average_pool_counting_padding_past_the_input_runs_on_torch_not_miscomputed():
    """ceil_mode's extra window: torch divides by the window clipped to input + explicit padding, oneDNN's
    include-padding by the whole window — so the pooling is a torch step."""
    model = Lambda(lambda p, x: F.avg_pool2d(p[0](x), 3, 2, 1, ceil_mode=True), nn.Conv2d(8, 8, 1))
    graph = assert_runs_like(model, torch.randn(1, 8, 8, 8))
    assert "torch:avg_pool2d" in DnnlModule(graph).kernels


def test_batch_norm_then_relu_runs_as_one_depthwise_convolution():
    """densenet's pre-activation blocks: the normalization cannot fold into a convolution before it."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(12).eval()
    bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    model = Lambda(lambda p, x: p[1](torch.relu(p[0](x * 2))), bn, nn.Conv2d(12, 8, 1))
    graph = assert_runs_like(model, torch.randn(2, 12, 7, 7))
    # the target phase's onednn_batch_norm_act fused the ReLU into the batch norm (rules/targets/onednn/)
    assert [(n.op, n.attrs.get("act")) for n in graph if n.op in ("relu", "onednn_batch_norm")] == [
        ("onednn_batch_norm", "relu")
    ]
    module = DnnlModule(graph)
    assert sum(k.startswith(("jit", "brg", "gemm")) for k in module.kernels) >= 2  # no eltwise step for the relu


def test_concatenation_of_channel_counts_no_block_divides():
    torch.manual_seed(0)
    model = Lambda(
        lambda p, x: p[2](torch.cat([p[0](x), p[1](x)], 1)),
        nn.Conv2d(4, 12, 3, padding=1),
        nn.Conv2d(4, 20, 1),
        nn.Conv2d(32, 8, 1),
    )
    assert_runs_like(model, torch.randn(1, 4, 6, 6))


def test_squeeze_and_excitation_broadcasts_the_channel_scale():
    torch.manual_seed(0)
    se = Lambda(
        lambda p, x: x * F.hardsigmoid(p[1](F.relu(p[0](F.adaptive_avg_pool2d(x, 1))))),
        nn.Conv2d(16, 8, 1),
        nn.Conv2d(8, 16, 1),
    )
    assert_runs_like(Lambda(lambda p, x: p[1](p[0](x)), nn.Conv2d(8, 16, 3, padding=1), se), torch.randn(2, 8, 7, 7))


def test_binary_ops_with_constant_and_broadcast_operands():
    torch.manual_seed(0)
    c = torch.randn(1, 16, 1, 1)
    model = Lambda(
        lambda p, x: torch.maximum((p[0](x) - 0.5) / 2.0, p[0](x) * c) + torch.minimum(p[0](x), c),
        nn.Conv2d(8, 16, 1),
    )
    assert_runs_like(model, torch.randn(2, 8, 5, 5))


def test_flatten_views_the_plain_layout_and_a_value_can_be_an_output_and_an_operand():
    torch.manual_seed(0)
    model = Lambda(
        lambda p, x: (p[0](x), p[1](torch.flatten(torch.relu(p[0](x)), 1)), torch.flatten(x, 1)),
        nn.Conv2d(3, 16, 3, padding=1),
        nn.Linear(16 * 4 * 4, 10),
    )
    assert_runs_like(model, torch.randn(2, 3, 4, 4))


def test_a_weight_is_never_put_in_a_buffer_an_earlier_activation_reuses():
    """A chain whose 16×12×12 activations are as large as its 16×16×3×3 weights: planned weights once landed in a
    pooled buffer, and the earlier steps that write it overwrote them on every call (mobilenet_v3_large ran 1e4×
    off)."""
    torch.manual_seed(0)
    convs = [nn.Conv2d(16, 16, 3, padding=1) for _ in range(5)]
    model = Lambda(lambda p, x: p[4](p[3](torch.relu(p[2](torch.relu(p[1](torch.relu(p[0](x)))))))), *convs)
    assert convs[0].weight.numel() == 16 * 12 * 12
    assert_runs_like(model, torch.randn(1, 16, 12, 12))


def test_a_resnet_compiles_to_the_runtime_with_its_layout_measured():
    torch.manual_seed(0)
    import torchvision

    model = torchvision.models.resnet18(weights=None, num_classes=10).eval()
    x = torch.randn(1, 3, 64, 64)
    module = gawee.compile(model, (x,), backend="onednn")
    choice = module.gawee_report.backend
    assert isinstance(module, DnnlModule) and choice.chosen == f"onednn:{module.layout}"
    assert set(choice.seconds) == {f"onednn:{k}" for k in dnnl.LAYOUTS}
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x), rtol=1e-4, atol=1e-4)
    fixed = gawee.compile(model, (x,), backend="onednn:channels_last")
    assert fixed.layout == "channels_last" and fixed.gawee_report.backend.seconds == {}
    assert set(fixed.conv_layouts.values()) == {"channels_last"} and len(fixed.conv_layouts) == 20


def test_the_trial_process_builds_without_racing_and_the_build_here_races(monkeypatch):
    # the trial process only learns whether the module could crash this one: each candidate kernel runs once
    # there, untimed; the build here times them
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)).eval()
    x = torch.randn(1, 16, 16, 16)
    graph = _graph(model, x)
    raced, timed = [], []
    fastest, best_calls = dnnl_plan._Plan.fastest, kernels.best_calls

    def counted(self, candidates, reads, situation=None):
        raced.append(len(candidates))
        return fastest(self, candidates, reads, situation)

    def timing(runners, *args, **kwargs):
        timed.append(len(runners))
        return best_calls(runners, *args, **kwargs)

    monkeypatch.setattr(dnnl_plan._Plan, "fastest", counted)
    monkeypatch.setattr(kernels, "best_calls", timing)
    here, trial = dnnl.RUNTIME.builds(graph, [x], variant="per_conv")
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(trial()(x)[0], want, rtol=1e-4, atol=1e-4)
        assert raced and max(raced) > 1 and timed == []
        torch.testing.assert_close(here()(x)[0], want, rtol=1e-4, atol=1e-4)
    assert timed and max(timed) > 1


def test_gawee_compile_measures_the_runtime_against_the_lowering_by_default():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)).eval()
    choice = gawee.compile(model, (torch.randn(1, 3, 16, 16),)).gawee_report.backend
    assert {"torch", *(f"onednn:{k}" for k in dnnl.LAYOUTS)} <= set(choice.seconds)


def test_unknown_layouts_and_backends_are_typed_errors():
    model, x = nn.Conv2d(3, 8, 1).eval(), torch.randn(1, 3, 4, 4)
    with pytest.raises(GaweeError, match="unknown backend 'onednn:nhwc'"):
        gawee.compile(model, (x,), backend="onednn:nhwc")
    with pytest.raises(GaweeError, match="unknown backend 'torch:any'"):
        gawee.compile(model, (x,), backend="torch:any")
    with pytest.raises(GaweeError, match="unknown backend 'torch:channels_last'") as e:  # a name reports show
        gawee.compile(model, (x,), backend="torch:channels_last")
    assert "TorchOptions(channels_last=True" in e.value.hint
    with pytest.raises(GaweeError, match="unknown oneDNN layout"):
        DnnlModule(_graph(model, x), layout="nhwc")


def test_what_it_cannot_run_is_said_not_miscomputed():
    b = GraphBuilder("half")
    assert "float32" in dnnl.supports(b.output(b.relu(b.input("x", "f16[2,3]"))))
    net = nn.Conv2d(3, 8, 1).eval()
    dynamic = gawee.capture(net, (torch.randn(2, 3, 4, 4),), dynamic_shapes=({0: torch.export.Dim("n", max=8)},))
    assert "symbolic shapes" in dnnl.supports(dynamic)
    assert dnnl.torch_flops(dynamic) is None  # symbolic FLOPs: nothing to weigh where the runtime cannot run at all
    with pytest.raises(
        GaweeError, match=r"cannot run on oneDNN.s primitives: .*computes in f16 \(float32 and bfloat16 only\)"
    ):
        gawee.compile(Lambda(lambda p, x: x.half().relu()), (torch.randn(2, 3),), backend="onednn")


def _assert_bf16_as_torch(got: torch.Tensor, x: torch.Tensor) -> None:
    """``got`` (bf16 values) is ``x`` converted to bf16 as torch converts it, bit for bit; but a NaN may be another
    NaN, and a subnormal result zero of its sign (the CPU's conversion instruction flushes them, as oneDNN's bf16
    convolutions do in torch's own lowering)."""
    want = x.bfloat16()
    assert torch.equal(got.isnan(), want.isnan())
    bits, want_bits = got.view(torch.int16), want.view(torch.int16)
    subnormal = (want != 0) & (want.abs() < torch.finfo(torch.bfloat16).tiny)
    flushed = subnormal & (got == 0) & (got.signbit() == want.signbit())
    assert torch.equal((bits == want_bits) | want.isnan() | flushed, torch.ones_like(flushed))


def test_a_cast_to_bf16_rounds_as_torch_does_in_every_layout():
    """f32 -> bf16 (-> f32) through oneDNN's reorders, the value held blocked, channels-last or plain (an identity
    1×1 convolution, exact in float32, puts it there): torch's conversion, ties to even, overflow to infinity, NaN
    and subnormals as :func:`_assert_bf16_as_torch` allows."""
    ulp = 2.0**-7  # bf16's spacing in [1, 2)
    finite = [1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 2**-130, -(2**-133), 3.39e38, -3.4e38]
    x = torch.randn(1, 16, 6, 6)
    x.view(-1)[: len(finite) + 3] = torch.tensor([*finite, -0.0, float("inf"), float("nan")])
    y = torch.randn(1, 16, 6, 6)  # through the convolution: 0 x inf would be NaN there, -0 + 0 x y is +0
    y.view(-1)[: len(finite)] = torch.tensor(finite)
    b = GraphBuilder("round_trip")
    eye = b.const(torch.eye(16).reshape(16, 16, 1, 1))
    v, u = b.input("x", "f32[1,16,6,6]"), b.input("y", "f32[1,16,6,6]")
    held = b.conv2d(u, eye, None, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1)
    graph = b.output(b.cast(v, dtype="bf16"), b.cast(b.cast(held, dtype="bf16"), dtype="f32"))
    for layout in dnnl.LAYOUTS:
        module = DnnlModule(graph, layout=layout)
        plain, round_trip = module(x, y)
        assert plain.dtype == torch.bfloat16 and round_trip.dtype == torch.float32
        _assert_bf16_as_torch(plain, x)
        _assert_bf16_as_torch(round_trip.bfloat16(), y)  # exact: a bf16 value widened
        assert not any(k.startswith("torch:") for k in module.kernels)


class _SmallCnn(nn.Module):
    """The ops a precision phase rewrites on a CNN: convolutions with and without a residual and activation, max
    pooling, a linear; the average pooling between stays float32."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.body = nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 32, 1))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.body(x) + x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def test_a_bf16_graph_runs_on_primitives_in_every_layout_as_the_interpreter_computes_it():
    """The bf16 precision phase's graph in each layout (per_conv races the bf16 kernels; gawee's own kernels take
    float32 only): every op a primitive, no torch step, the outputs within a few bf16 roundings of what the
    interpreter computes for the same graph (oneDNN rounds a convolution with its residual once where torch rounds
    twice, and a rounding that falls the other way carries on)."""
    torch.manual_seed(0)
    model, x = _SmallCnn(), torch.randn(2, 3, 32, 32)
    graph = _graph(model, x, precision="bf16")
    assert {n.output.dtype.value for n in graph if n.op in ("conv2d", "linear", "max_pool2d")} == {"bf16"}
    assert dnnl.supports(graph) is None
    (want,) = gawee.run(graph, x)
    scale = float(want.abs().max())
    for layout in dnnl.LAYOUTS:
        module = DnnlModule(graph, layout=layout)
        assert not any(k.startswith("torch:") for k in module.kernels), (layout, module.kernels)
        assert not any(k.startswith("gawee:") for k in module.conv_kernels.values())
        for _ in range(2):  # the second call reuses every buffer
            (got,) = module(x)
            assert got.dtype == torch.float32
            assert float((got - want).abs().max()) <= 8 * 2.0**-8 * scale, layout


def test_bf16_and_float32_convolutions_of_one_shape_are_raced_apart(monkeypatch):
    """A race's times are kept by the convolution's situation: a bf16 convolution of the same shapes as a float32
    one is raced on its own, not given the float32 one's winner."""
    torch.manual_seed(0)
    races = _counting_races(monkeypatch)
    b = GraphBuilder("both")
    v = b.input("x", "f32[1,16,8,8]")
    w = torch.randn(16, 16, 3, 3)
    conv = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1)
    y = b.conv2d(v, b.const(w), None, **conv)
    z = b.conv2d(b.cast(v, dtype="bf16"), b.const(w.bfloat16()), None, **conv)
    DnnlModule(b.output(y, b.cast(z, dtype="f32")), layout="per_conv")
    assert len(races) == 2


def _int8_pair(b: GraphBuilder):
    """x → an int8 convolution adding the residual r, with its ReLU, requantized to the grid of the next int8
    convolution (scale 0.05, zero point 3) → that one; both results are outputs. And the second one's weights and
    scales (how far one code's step moves its result)."""
    torch.manual_seed(0)
    x, r = b.input("x", "f32[2,16,9,9]"), b.input("r", "f32[2,32,9,9]")
    w1, w2 = torch.randint(-127, 128, (32, 16, 3, 3), dtype=torch.int8), torch.randint(-127, 128, (8, 32, 1, 1))
    s1, s2 = torch.rand(32) * 0.01 + 0.001, torch.rand(8) * 0.01
    quant = dict(levels=255, dilation=[1, 1], groups=1, stride=[1, 1])
    y = b.conv2d_int8_static(
        x, b.const(w1), b.const(s1), b.const(torch.randn(32)), r, act="relu", scale=0.02, zero_point=100,
        out_scale=0.05, out_zero_point=3, out_levels=255, padding=[1, 1], **quant,
    )  # fmt: skip
    z = b.conv2d_int8_static(
        y, b.const(w2.to(torch.int8)), b.const(s2), None, scale=0.05, zero_point=3, padding=[0, 0], **quant
    )
    return b.output(y, z), w2, s2


@EXACT_INT8
def test_int8_convolutions_compute_the_ops_codes_and_hand_them_over_as_u8():
    """conv2d_int8_static on oneDNN's int8 convolution: the first one's result requantized to the second's grid is
    handed over as its u8 codes (no reorder between the two convolutions), read as float32 values where an output
    needs them; both within one code of the op's semantics (oneDNN divides by the grid's scale where the op
    multiplies by its inverse: a tie may round the other way)."""
    graph, w2, s2 = _int8_pair(GraphBuilder("int8"))
    assert dnnl.supports(graph) is None
    xs = (torch.randn(2, 16, 9, 9) * 2, torch.randn(2, 32, 9, 9))
    want_y, want_z = gawee.run(graph, *xs)
    one_code = (w2.abs().sum((1, 2, 3)) * s2 * 0.05).reshape(1, -1, 1, 1)  # z moved by one of y's codes, at most
    for layout in dnnl.LAYOUTS:
        module = DnnlModule(graph, layout=layout)
        y, z = module(*xs)
        assert float((y - want_y).abs().max()) <= 1.01 * 0.05 and bool(((z - want_z).abs() <= one_code).all())
        assert float((y - want_y).abs().mean()) < 1e-3 * 0.05  # a tie is rare: the codes are the op's
        convs = [i for i, k in enumerate(module.kernels) if k in module.conv_kernels.values()]
        assert len(convs) == 2 and convs[1] == convs[0] + 1, module.kernels  # the codes go straight to the next
        assert not any(k.startswith("torch:") for k in module.kernels)


@EXACT_INT8
def test_an_int8_convolutions_zero_points_of_zero_are_not_passed_to_onednn():
    """A grid whose zero point is 0 (a ReLU's result quantized) is given to oneDNN without a zero point: with one, even
    of 0, its kernels take the slower path that subtracts it from every sum (the compensation of the padded border
    included). A nonzero zero point is passed; both compute the op within one code of its result."""
    torch.manual_seed(0)
    for zero_point, out_zero_point in ((0, 0), (100, 3)):
        b = GraphBuilder("zero_points")
        x = b.input("x", "f32[1,16,9,9]")
        w = b.const(torch.randint(-127, 128, (16, 16, 3, 3), dtype=torch.int8))
        y = b.conv2d_int8_static(
            x, w, b.const(torch.rand(16) * 0.002 + 0.0005), b.const(torch.randn(16)), act="relu", scale=0.02,
            zero_point=zero_point, out_scale=0.05, out_zero_point=out_zero_point, out_levels=255, levels=255,
            dilation=[1, 1], groups=1, stride=[1, 1], padding=[1, 1],
        )  # fmt: skip
        graph = b.output(y)
        module = DnnlModule(graph, layout="channels_last")
        (conv,) = [i for i, k in enumerate(module.kernels) if k in module.conv_kernels.values()]
        _, (_, _, n, args) = module.steps[conv]
        passed = {args[j].arg for j in range(n)}
        zero_points = {arg & ~dnnl_plan.ATTR_ZERO_POINTS for arg in passed if arg & dnnl_plan.ATTR_ZERO_POINTS}
        assert zero_points == ({dnnl_plan.SRC, dnnl_plan.DST} if zero_point else set()), passed
        x = torch.rand(1, 16, 9, 9) * 4 - 2 * bool(zero_point)
        (want,), (got,) = gawee.run(graph, x), module(x)
        assert float((got - want).abs().max()) <= 1.01 * 0.05


def _summed_block(keep_first: bool):
    """A residual block in int8, its results requantized to u8 codes: x → y (grid (0.05, 3)) → t (grid (0.04, 0)) →
    z = the third convolution of t adding y as its residual (grid (0.08, 5)), an output; and (``keep_first``) y an
    output too, so the third convolution is not y's last reader."""
    torch.manual_seed(0)
    b = GraphBuilder("summed")
    x = b.input("x", "f32[2,16,9,9]")
    quant = dict(levels=255, dilation=[1, 1], groups=1, stride=[1, 1], padding=[1, 1], act="relu")

    def conv(v, residual, scale, zero_point, out_scale, out_zero_point):
        w = b.const(torch.randint(-127, 128, (16, 16, 3, 3), dtype=torch.int8))
        s = b.const(torch.rand(16) * 0.002 + 0.0005)
        return b.conv2d_int8_static(
            v, w, s, b.const(torch.randn(16)), residual, scale=scale, zero_point=zero_point, out_scale=out_scale,
            out_zero_point=out_zero_point, out_levels=255, **quant,
        )  # fmt: skip

    y = conv(x, None, 0.02, 100, 0.05, 3)
    z = conv(conv(y, None, 0.05, 3, 0.04, 0), y, 0.04, 0, 0.08, 5)
    return b.output(z, y) if keep_first else b.output(z)


@EXACT_INT8
@pytest.mark.parametrize("keep_first", [False, True], ids=["last-reader", "read-after"])
def test_a_residual_held_as_codes_is_summed_from_the_destination(keep_first):
    """An int8 convolution requantized to u8 codes adds a residual held as codes with oneDNN's sum post-op: in its
    own destination, which holds the residual's codes first — the residual's buffer itself where this is its last
    reader (no step between the two convolutions), a copy of the codes where it is read after (one step) — never
    dequantized to float32 first. Within one code of the op's semantics (a tie may round the other way)."""
    graph = _summed_block(keep_first)
    xs = (torch.randn(2, 16, 9, 9) * 2,)
    want = gawee.run(graph, *xs)
    for layout in ("blocked", "channels_last"):
        module = DnnlModule(graph, layout=layout)
        for _ in range(2):  # the second call reuses every buffer: the residual's codes are written again first
            got = module(*xs)
            assert float((got[0] - want[0]).abs().max()) <= 1.01 * 0.08, layout
            assert float((got[0] - want[0]).abs().mean()) < 1e-2 * 0.08, layout
            if keep_first:
                assert float((got[1] - want[1]).abs().max()) <= 1.01 * 0.05, layout
        convs = [i for i, k in enumerate(module.kernels) if k in module.conv_kernels.values()]
        assert len(convs) == 3 and convs[2] - convs[1] == 1 + keep_first, (layout, module.kernels)


def _excited(levels: int = 255):
    """mobilenet_v3's squeeze-excitation multiply before an int8 projection: y * hardsigmoid(g) (y a convolution's
    result, g per channel), read only by an int8 1x1 convolution (grid (0.05, 3)), as the core ops the onednn target
    phase lowers; and how far one code's step moves the result."""
    torch.manual_seed(0)
    b = GraphBuilder("excited")
    x, g = b.input("x", "f32[2,16,9,9]"), b.input("g", "f32[2,16,1,1]")
    y = b.conv2d(x, b.const(torch.randn(16, 16, 1, 1) * 0.5), None, stride=[1, 1], padding=[0, 0])  # no Winograd
    w, s = torch.randint(-127, 128, (8, 16, 1, 1), dtype=torch.int8), torch.rand(8) * 0.01
    z = b.conv2d_int8_static(
        b.mul(y, b.hardsigmoid(g)), b.const(w), b.const(s), None, scale=0.05, zero_point=3, levels=levels,
        dilation=[1, 1], groups=1, stride=[1, 1], padding=[0, 0],
    )  # fmt: skip
    return b.output(z), (w.abs().sum((1, 2, 3)) * s * 0.05).reshape(1, -1, 1, 1)


@EXACT_INT8
def test_a_binary_op_read_by_an_int8_convolution_writes_its_codes():
    """The onednn target phase (rules/targets/onednn/4-int8.rules) makes the multiply an ``onednn_binary_int8`` on the
    convolution's grid: its primitive writes the u8 codes the convolution reads (no quantizing reorder between the
    two), within one code of the op's semantics (a tie may round the other way)."""
    graph, one_code = _excited()
    lowered, report = dnnl.RUNTIME.lower(graph)
    assert report.firings["onednn_binary_int8_codes"] == 1
    assert [n.op for n in lowered.nodes if n.op.startswith("onednn_binary")] == ["onednn_binary_int8"]
    unfused, _ = gawee.rewrite(graph, target_rules("onednn", skip=("4-int8",)))
    (binary,) = [n for n in lowered.nodes if n.op == "onednn_binary_int8"]
    xs = (torch.randn(2, 16, 9, 9) * 2, torch.randn(2, 16, 1, 1) * 3)
    (want,) = gawee.run(graph, *xs)
    written = 0
    for layout in ("blocked", "channels_last"):
        module = DnnlModule(lowered, layout=layout)
        (got,) = module(*xs)
        assert bool(((got - want).abs() <= one_code).all()), layout
        assert float((got - want).abs().mean()) < 1e-2 * float(one_code.mean()), layout
        assert not any(k.startswith("torch:") for k in module.kernels)
        # the steps of a float32 multiply but its quantizing reorder; or, where oneDNN has only its reference kernel
        # for u8 codes in that layout (blocked on AVX-512), the float32 multiply, which the convolution's input
        # reorder quantizes
        fewer = int(module.codes_written == [binary.name])
        assert len(module.kernels) == len(DnnlModule(unfused, layout=layout).kernels) - fewer, (layout, module.kernels)
        written += fewer
    assert written  # in channels-last at least: oneDNN's binary kernels write u8 in NHWC


def test_a_binary_op_requantized_for_other_readers_holds_the_codes():
    """An ``onednn_binary_int8`` that is also an output is the value on its grid in every layout, whichever kernel
    writes its codes (in the blocked layout, a reorder quantizes the float32 result, whose buffer the module keeps:
    built from a buffer nothing kept, a call wrote freed memory and crashed the process)."""
    torch.manual_seed(0)
    b = GraphBuilder("codes")
    x, g = b.input("x", "f32[2,16,9,9]"), b.input("g", "f32[2,16,1,1]")
    y = b.conv2d(x, b.const(torch.randn(16, 16, 3, 3) * 0.2), None, stride=[1, 1], padding=[1, 1])
    graph = b.output(b.onednn_binary_int8(y, g, alg="mul", out_scale=0.05, out_zero_point=3, out_levels=255))
    xs = (torch.randn(2, 16, 9, 9), torch.randn(2, 16, 1, 1))
    (want,) = gawee.run(graph, *xs)
    for layout in ("blocked", "channels_last"):
        module = DnnlModule(graph, layout=layout)
        gc.collect()  # what the module does not keep is freed now
        for _ in range(3):
            (got,) = module(*xs)
            assert float((got - want).abs().max()) <= 1.01 * 0.05 and float((got - want).abs().mean()) < 1e-3, layout


def _stem():
    """A ResNet's stem in int8: a convolution requantized to the grid its max pool's two int8 readers read."""
    torch.manual_seed(0)
    b = GraphBuilder("stem")
    x = b.input("x", "f32[2,8,12,12]")
    grid = {"out_scale": 0.05, "out_zero_point": 0, "out_levels": 255}
    geometry = {"dilation": [1, 1], "groups": 1, "padding": [1, 1]}

    def int8(x, cout, cin, k, stride, **out):
        w = torch.randint(-127, 128, (cout, cin, k, k), dtype=torch.int8)
        s, bias = torch.rand(cout) * 0.003, b.const(torch.randn(cout) * 0.1)
        attrs = {**geometry, "padding": [k // 2] * 2}
        scale, zero = (0.05, 0) if out.get("read") else (0.03, 100)
        return b.conv2d_int8_static(
            x, b.const(w), b.const(s), bias, act="relu", scale=scale, zero_point=zero, levels=255, stride=[stride] * 2,
            **attrs, **out.get("grid", {}),
        )  # fmt: skip

    pooled = b.max_pool2d(int8(x, 16, 8, 3, 1, grid=grid), kernel_size=[3, 3], stride=[2, 2], padding=[1, 1])
    return b.output(b.add(int8(pooled, 16, 16, 1, 1, read=True), int8(pooled, 16, 16, 3, 1, read=True)))


@EXACT_INT8
def test_a_max_pool_of_codes_pools_the_codes():
    """A ResNet's stem in int8 (rules/precision/int8.rules' ``requantize_through_max_pool`` made it): a convolution
    requantized to the grid its pool's two int8 readers read, the pool between them. The pool takes the codes the
    convolution writes and hands its own on (in channels-last, where oneDNN has an int8 pooling kernel: no float32
    result, no quantizing reorder); in every layout the module computes the graph's semantics, within one code of
    the convolution's result (its primitive may round a tie the other way)."""
    graph = _stem()
    (pool,) = [n for n in graph.nodes if n.op == "max_pool2d"]
    xs = (torch.randn(2, 8, 12, 12) * 3,)
    (want,) = gawee.run(graph, *xs)
    one_code = 2 * 0.05 * 127 * 0.003  # a code of the pool moves the two readers' sums by at most this together
    for layout in ("blocked", "channels_last"):
        module = DnnlModule(graph, layout=layout)
        (got,) = module(*xs)
        assert float((got - want).abs().max()) <= one_code + 1e-5, layout
        assert float((got - want).abs().mean()) < 0.01 * one_code, layout
        if layout == "channels_last":
            assert module.codes_written == [pool.name], module.kernels


@EXACT_INT8
@pytest.mark.skipif(pool_u8.unavailable() is not None, reason=str(pool_u8.unavailable()))
def test_the_codes_pool_races_gawees_kernel_and_both_pool_alike(monkeypatch):
    """Held channels-last, the stem's pool of codes races oneDNN's pooling kernel against gawee's
    (gawee/backend/pool_u8.py); whichever wins, the module computes the same codes (a max pool is exact)."""
    graph = _stem()
    xs = (torch.randn(2, 8, 12, 12) * 3,)
    outputs = {}
    for favoured in ("gawee", "onednn"):
        _races_won_by(monkeypatch, pool_u8.KERNEL, favoured == "gawee")
        module = DnnlModule(graph, layout="channels_last")
        assert (pool_u8.KERNEL in module.kernels) == (favoured == "gawee"), module.kernels
        (outputs[favoured],) = module(*xs)
    assert torch.equal(outputs["gawee"], outputs["onednn"])


def _races_won_by(monkeypatch, kernel: str, wins: bool) -> None:
    """Every race of :func:`gawee.backend.kernels.best_calls` decided for ``kernel`` (or, not ``wins``, against
    it), whatever the clock says."""
    from gawee.backend import kernels

    def race(runners, args, **_):
        return {k: (0.0 if (k == kernel) == wins else 1.0) for k in runners}

    monkeypatch.setattr(kernels, "best_calls", race)


def test_a_binary_op_requantized_to_seven_bits_runs_as_a_torch_step():
    """oneDNN saturates a u8 destination at 255, not 127: that binary op's codes are computed by its semantics."""
    graph, one_code = _excited(levels=127)
    lowered, _ = dnnl.RUNTIME.lower(graph)
    module = DnnlModule(lowered, layout="blocked")
    assert "torch:onednn_binary_int8" in module.kernels
    xs = (torch.randn(2, 16, 9, 9) * 2, torch.randn(2, 16, 1, 1) * 3)
    assert bool(((module(*xs)[0] - gawee.run(graph, *xs)[0]).abs() <= one_code).all())


@EXACT_INT8
@pytest.mark.parametrize("cin, kernel, stride", [(256, 1, 1), (64, 3, 1), (256, 1, 2), (512, 3, 1)])
def test_every_int8_kernel_a_race_may_keep_sums_codes_of_255_exactly(monkeypatch, cin, kernel, stride):
    """Codes of 255 times weights of ±127 (where a kernel summing pairs of products in int16 saturates): every
    int8 implementation the convolution may be given (each forced in turn) computes the op's result exactly."""
    names, forced = set(), [None]

    def choose(self, candidates, reads, situation=None):
        names.update(c.name for c in candidates)
        keep = next((c for c in candidates if c.name == forced[0]), candidates[0])
        for c in candidates:
            if c is not keep:
                c.drop()
        return keep

    monkeypatch.setattr(dnnl_plan._Plan, "fastest", choose)
    b = GraphBuilder("saturating")
    x = b.input("x", f"f32[1,{cin},14,14]")
    w = torch.full((64, cin, kernel, kernel), 127, dtype=torch.int8)
    w[::2] = -127
    geometry = dict(stride=[stride] * 2, padding=[kernel // 2] * 2, dilation=[1, 1], groups=1)
    y = b.conv2d_int8_static(x, b.const(w), b.const(torch.full((64,), 1e-4)), scale=1.0, zero_point=0, **geometry)
    graph, xs = b.output(y), (torch.full((1, cin, 14, 14), 255.0),)
    (want,) = gawee.run(graph, *xs)
    DnnlModule(graph, layout="per_conv")
    assert names and all(dnnl_conv.exact_int8(name) for name in names)
    for name in sorted(names):
        forced[0] = name
        module = DnnlModule(graph, layout="per_conv")
        assert list(module.conv_kernels.values()) == [name]
        assert torch.equal(module(*xs)[0], want), name


def test_an_int8_graph_runs_its_convolutions_and_linear_on_int8_kernels_in_every_layout():
    """The int8 precision phase's graphs: a CNN's (static int8 convolutions calibrated on the input, its classifier
    a static int8 1x1 convolution too) with every convolution on oneDNN's int8 kernel; an MLP's (dynamic int8
    linear layers) on torch's dynamic quantized kernel where it runs here; the outputs as the interpreter computes
    them up to a few codes."""
    from gawee.backend import quantized

    torch.manual_seed(0)
    model, x = _SmallCnn(), torch.randn(2, 3, 16, 16)
    graph = _graph(model, x, precision="int8")
    if any(n.op == "conv2d_int8_static" and n.attrs["levels"] != 255 for n in graph):
        pytest.skip("codes in [0, 127] here (no VNNI): the int8 convolutions run as torch steps")
    int8 = sum(n.op == "conv2d_int8_static" for n in graph)
    assert int8 >= 4 and dnnl.supports(graph) is None and not any(n.op == "linear_int8_dynamic" for n in graph)
    (want,) = gawee.run(graph, x)
    for layout in dnnl.LAYOUTS:
        module = DnnlModule(graph, layout=layout)
        assert len(module.conv_kernels) == int8 and "torch:conv2d_int8_static" not in module.kernels
        (got,) = module(x)
        assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max()), layout
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
    h = torch.randn(4, 32)
    graph = _graph(mlp, h, precision="int8")
    assert [n.op for n in graph] == ["linear_int8_dynamic"] * 2
    (want,) = gawee.run(graph, h)
    module = DnnlModule(graph, layout="blocked")
    if quantized.unavailable(255) is None:
        assert sum(module.kernels.count(k) for k in quantized.LINEAR_KERNELS) == 2
    (got,) = module(h)
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


class _Shuffle(nn.Module):
    """ShuffleNet's channel shuffle and split between convolutions, then ops with no primitive or whose lowering
    refuses them: a convolution and a batch norm (with the ReLU planned as its post-op) of rank 3, a linear of
    rank 3 with its GELU, softmaxes, one of a graph input."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.c, self.bn, self.linear = nn.Conv1d(16, 16, 3, padding=1), nn.BatchNorm1d(36), nn.Linear(16, 16)
        self.bn.running_mean.uniform_(-1, 1), self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = torch.relu(self.a(x))
        n, c, h, w = y.shape
        y = y.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
        p, q = y.chunk(2, dim=1)
        y = torch.cat([p, torch.relu(self.b(q))], 1)
        z = self.c(y.flatten(2)).transpose(1, 2)
        z = F.gelu(self.linear(torch.relu(self.bn(z))))
        return torch.softmax(z, -1), torch.softmax(x, 1)


def test_ops_without_a_primitive_run_as_torch_steps_between_the_primitives():
    torch.manual_seed(0)
    graph = assert_runs_like(_Shuffle(), torch.randn(2, 3, 6, 6))
    assert dnnl.supports(graph) is None
    for layout in dnnl.LAYOUTS:
        kernels = DnnlModule(graph, layout=layout).kernels
        torch_steps = sorted(k for k in kernels if k.startswith("torch:"))
        ops = ("conv1d", "linear", "onednn_batch_norm", "softmax", "softmax")
        assert torch_steps == [f"torch:{op}" for op in ops]  # the batch norm with its ReLU (the target phase's)


def test_a_whole_graph_choice_leaves_a_graph_torch_steps_would_mostly_compute_to_the_lowering():
    torch.manual_seed(0)
    attention = Lambda(
        lambda p, x: torch.softmax(p[0](x) @ p[1](x).transpose(1, 2), -1), nn.Linear(16, 16), nn.Linear(16, 16)
    )
    x = torch.randn(2, 8, 16)
    graph = _graph(attention, x)
    assert dnnl.torch_flops(graph) == "100% of its FLOPs would run as torch steps (linear, matmul, softmax)"
    module = gawee.compile(attention, (x,))
    assert module.gawee_report.backend.not_candidates["onednn"] == dnnl.torch_flops(graph)
    assert not any(name.startswith("onednn:") for name in module.gawee_report.backend.seconds)
    shuffle = Lambda(
        lambda p, x: p[1](p[0](x).view(1, 2, 8, 6, 6).transpose(1, 2).reshape(1, 16, 6, 6)),
        nn.Conv2d(3, 16, 3, padding=1),
        nn.Conv2d(16, 16, 1),
    )
    assert dnnl.torch_flops(_graph(shuffle, torch.randn(1, 3, 6, 6))) is None  # a permutation computes nothing


@pytest.mark.parametrize(
    "channels, sizes, dim",
    [
        (32, [16, 16], 1),
        (32, [8, 24], 1),
        (116, [58, 58], 1),
        (16, [3, 13], 1),
        (40, [16, 16, 8], 1),
        (16, [2, 3], 2),
        (16, [4, 3], 3),
    ],
)
def test_a_split_copies_regions_of_its_input_in_its_layout_or_the_plain_one(channels, sizes, dim):
    """Blocked parts where the offsets along channels are whole blocks, else the plain input's regions."""
    torch.manual_seed(0)
    model = Lambda(
        lambda p, x: tuple(part.relu() * (i + 1) for i, part in enumerate(p[0](x).split(sizes, dim))),
        nn.Conv2d(3, channels, 1),
    )
    graph = assert_runs_like(model, torch.randn(2, 3, 5, 7))
    assert all("torch:split" not in DnnlModule(graph, layout=layout).kernels for layout in dnnl.LAYOUTS)


@pytest.mark.parametrize(
    "permute",
    [
        lambda y: y.view(2, 2, 8, 5, 7).transpose(1, 2).reshape(2, 16, 5, 7) * 2,  # ShuffleNet's channel shuffle
        lambda y: y.permute(0, 2, 3, 1).flatten(1) + 1,
        lambda y: y.flatten(2).transpose(1, 2) - 1,
    ],
)
def test_a_permutation_is_one_reorder_of_the_plain_input_read_through_permuted_strides(permute):
    torch.manual_seed(0)
    graph = assert_runs_like(Lambda(lambda p, x: permute(p[0](x)), nn.Conv2d(3, 16, 1)), torch.randn(2, 3, 5, 7))
    assert all("torch:permute" not in DnnlModule(graph, layout=layout).kernels for layout in dnnl.LAYOUTS)


def test_a_concatenation_reads_its_parts_in_the_first_ones_layout_even_the_plain_one():
    """ShuffleNet's: a split part (plain: the offset is no whole block) beside a convolution's output (blocked);
    mixed layouts would be oneDNN's reference concatenation."""
    torch.manual_seed(0)

    def shuffle_unit(p, x):
        a, b = p[0](x).split([8, 8], 1)
        return torch.cat([a, p[1](b)], 1)

    graph = assert_runs_like(
        Lambda(shuffle_unit, nn.Conv2d(3, 16, 1), nn.Conv2d(8, 8, 3, padding=1)), torch.randn(2, 3, 6, 6)
    )
    assert not any(k.startswith("ref") for k in DnnlModule(graph, layout="blocked").kernels)


def test_a_torch_step_on_a_constant_without_data_is_refused_with_its_name():
    """A model captured on the meta device has constants of known type only."""

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.rand(2, 6) > 0.5)

        def forward(self, x):
            return torch.softmax(x, 1).masked_fill(self.mask, 0.0)

    graph = gawee.capture(Masked().to("meta"), (torch.randn(2, 6, device="meta"),))
    with pytest.raises(GaweeError, match=r"constant .* has no data"):
        DnnlModule(graph)


def test_a_part_of_a_split_nobody_reads_is_not_kept():
    model = Lambda(lambda p, x: p[0](x).split([8, 8], 1)[1].relu(), nn.Conv2d(3, 16, 1))
    assert_runs_like(model, torch.randn(1, 3, 5, 5))


def test_a_lowering_refused_midway_leaves_no_step_behind(monkeypatch):
    """A lowering that planned a reorder before oneDNN refused its primitive: the reorder's step is undone with
    it (a later consumer would take the copy as made), the buffer it took is free again (an earlier step's, freed
    under it this crashed the process), and the node runs as a torch step — with the activation the target phase
    fused into it (the ReLU after the batch norm)."""
    bn = nn.BatchNorm2d(16).eval()
    bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2)
    model = Lambda(lambda p, x: F.relu(p[1](F.max_pool2d(p[0](x), 2))) - 1, nn.Conv2d(3, 16, 1), bn)
    x = torch.randn(1, 3, 6, 6)
    graph = _graph(model, x)
    plain = len(DnnlModule(graph).kernels)

    def refusing(plan, node):
        plan.operand(node.inputs[0], plan.activation_md(node.inputs[0].shape, "channels_last"))
        raise dnnl_plan._Unsupported("oneDNN refused the batch norm (status 3)")

    monkeypatch.setitem(dnnl.LOWERINGS, "onednn_batch_norm", refusing)
    module = DnnlModule(graph)
    assert "torch:onednn_batch_norm" in module.kernels  # the ReLU is not planned apart: the step applies it
    assert len(module.kernels) == plain + 1  # the batch norm's reorder to plain, and its step: no NHWC reorder
    with torch.no_grad():
        for _ in range(2):  # the buffer the NHWC copy took from the free ones is an earlier step's: still alive
            torch.testing.assert_close(module(x)[0], model(x), rtol=1e-5, atol=1e-5)


def test_inputs_of_another_type_are_refused():
    model, x = nn.Conv2d(3, 8, 1).eval(), torch.randn(1, 3, 4, 4)
    module = DnnlModule(_graph(model, x))
    with pytest.raises(ShapeOutOfRange, match=r"input input dimension 2 is 5, the graph needs 4 \(static\)"):
        module(torch.randn(1, 3, 5, 5))
    with pytest.raises(InputError, match=r"input input is f64\[1,3,4,4\], the graph takes f32\[1,3,4,4\]"):
        module(x.double())


def test_a_missing_library_is_a_reason_not_a_crash(monkeypatch, tmp_path):
    monkeypatch.setenv(dnnl_plan.LIBRARY_ENV, str(tmp_path / "libdnnl.so.3"))
    dnnl_plan._load.cache_clear()
    try:
        assert "not installed" in dnnl.unavailable()
        b = GraphBuilder("g")
        assert "not installed" in dnnl.supports(b.output(b.relu(b.input("x", "f32[2,3]"))))
    finally:
        monkeypatch.undo()
        dnnl_plan._load.cache_clear()
    assert dnnl.unavailable() is None


class _MixedNet(nn.Module):
    """Every way two convolutions' layouts meet: a residual post-op, a same-shape add, an SE block's broadcast
    mul, a concatenation, pooling and a flatten into a linear layer."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.a, self.b = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 1)
        self.se1, self.se2 = nn.Conv2d(16, 16, 1), nn.Conv2d(16, 16, 1)  # no fewer channels than a block
        self.dw, self.c = nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.Conv2d(16, 8, 1)
        self.bn = nn.BatchNorm2d(24)
        self.fc = nn.Linear(24 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = torch.relu(self.a(x) + x)  # the residual, a post-op
        z = self.b(y) + self.dw(y)  # an add of two convolutions' outputs
        z = z * torch.sigmoid(self.se2(torch.relu(self.se1(F.adaptive_avg_pool2d(z, 1)))))
        z = torch.relu(self.bn(torch.cat([z, self.c(z)], 1)))  # concatenation; batch norm as a depthwise conv
        return self.fc(torch.flatten(F.max_pool2d(z, 2), 1))


def _forced(monkeypatch, layout_of_call):
    """``per_conv``'s choice among the candidates of the layout ``layout_of_call(n)`` only, ``n`` counting the
    plan's convolutions (None: among all)."""
    fastest = dnnl_plan._Plan.fastest

    def forced(self, candidates, reads, situation=None):
        self.calls = getattr(self, "calls", -1) + 1
        layout = layout_of_call(self.calls)
        return fastest(self, [c for c in candidates if layout in (None, c.layout)], reads, situation)

    monkeypatch.setattr(dnnl_plan._Plan, "fastest", forced)


def _executions_as_time(monkeypatch) -> None:
    """A candidate's time is the number of primitives its call executes: the convolution and each reorder its
    layout needs (ties go to the first candidate: blocked)."""
    lib, count = dnnl_plan._lib(), [0]
    execute = lib.dnnl_primitive_execute

    def counting(*args):
        count[0] += 1
        return execute(*args)

    def by_count(runners, args, min_rounds, max_rounds, budget_s):
        times = {}
        for key, run in runners.items():
            before = count[0]
            run()
            times[key] = count[0] - before
        return times

    monkeypatch.setattr(lib, "dnnl_primitive_execute", counting)
    monkeypatch.setattr(kernels, "best_calls", by_count)


def test_per_conv_layouts_that_alternate_still_compute_the_model(monkeypatch):
    """The choice forced to alternate between the layouts: each op between convolutions reads operands in both,
    and the module still computes the model."""
    torch.manual_seed(0)
    _forced(monkeypatch, lambda n: dnnl_plan.MEASURED[n % 2])
    model, x = _MixedNet().eval(), torch.randn(2, 3, 8, 8)
    graph = assert_runs_like(model, x, layouts=["per_conv"])
    module = DnnlModule(graph, layout="per_conv")
    assert len(module.conv_layouts) == 8 and set(module.conv_layouts.values()) == set(dnnl_plan.MEASURED)


def test_per_conv_counts_the_reorders_a_layout_would_need(monkeypatch):
    """Every primitive (convolution or reorder) costing alike and the first convolution forced into channels-last:
    the rest stay in channels-last, since the blocked layout would cost each a reorder more."""
    torch.manual_seed(0)
    _executions_as_time(monkeypatch)
    _forced(monkeypatch, lambda n: "channels_last" if n == 0 else None)
    graph = assert_runs_like(_MixedNet().eval(), torch.randn(2, 3, 8, 8), layouts=["per_conv"])
    layouts = DnnlModule(graph, layout="per_conv").conv_layouts
    assert set(layouts.values()) == {"channels_last"}, layouts


def test_per_conv_keeps_the_fastest_of_every_kernel_onednn_has(monkeypatch):
    """Every implementation oneDNN has of a convolution is compiled and raced, not only its first choice: with the
    GEMM-based one (never its first choice here) made to measure fastest, that is the one kept."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1)).eval()
    x = torch.randn(1, 16, 14, 14)
    graph = _graph(model, x)
    for layout in dnnl_plan.MEASURED:
        assert not any("gemm:jit" in k for k in DnnlModule(graph, layout=layout).conv_kernels.values())
    fastest, raced = dnnl_plan._Plan.fastest, []

    def remembering(self, candidates, reads, situation=None):
        raced[:] = [c.name for c in candidates]
        return fastest(self, candidates, reads, situation)

    monkeypatch.setattr(dnnl_plan._Plan, "fastest", remembering)
    monkeypatch.setattr(
        kernels, "best_calls", lambda runners, *_, **__: {i: 1e-3 if "gemm:jit" in raced[i] else 1.0 for i in runners}
    )
    assert_runs_like(model, x, layouts=["per_conv"])
    assert sum("gemm:jit" in k for k in DnnlModule(graph, layout="per_conv").conv_kernels.values()) == 2


def test_a_convolution_like_one_raced_before_takes_its_winner_without_timing_again(monkeypatch):
    """Three equal convolutions in a row: the first reads the plain input, the other two the same layout, so the
    third is the second's situation again and is not timed (its kernel is the second's); the plan's memo is its
    own, so another module races again."""
    torch.manual_seed(0)
    races = []
    best_calls = kernels.best_calls

    def counted(runners, *args, **kwargs):
        races.append(len(runners))
        return best_calls(runners, *args, **kwargs)

    monkeypatch.setattr(kernels, "best_calls", counted)
    model = nn.Sequential(*(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()) for _ in range(3)))
    graph = _graph(model, torch.randn(1, 16, 12, 12))
    for layout in dnnl.LAYOUTS:
        races.clear()
        module = DnnlModule(graph, layout=layout)
        kernels_ = list(module.conv_kernels.values())
        if layout != "per_conv":  # the second and third read the first's layout, whichever kernel won
            assert len(races) == (2 if winograd.unavailable() is None else 0), (layout, races)  # else one candidate
            assert kernels_[1] == kernels_[2]
        assert len(races) <= 3


def _counting_races(monkeypatch) -> list[int]:
    """How many candidates each race of a plan runs (fresh ones, and the kept leader they are timed against)."""
    ran, race = [], dnnl_plan._Plan._race

    def counted(self, candidates, plans, which):
        ran.append(len(which))
        return race(self, candidates, plans, which)

    monkeypatch.setattr(dnnl_plan._Plan, "_race", counted)
    return ran


def test_modules_built_with_one_shared_dict_time_each_kernel_once(monkeypatch):
    """The modules of one selection share their races' times (``shared``): a second module of the same layout
    times nothing and takes the same kernels; ``per_conv`` after the fixed layouts times fewer candidates than
    alone (those a fixed layout timed in the same situation are kept), and computes the model."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()) for _ in range(3))).eval()
    x = torch.randn(1, 16, 12, 12)
    graph = _graph(model, x)
    ran = _counting_races(monkeypatch)
    alone = DnnlModule(graph, layout="per_conv")
    ran_alone = sum(ran)
    shared: dict = {}
    first = DnnlModule(graph, layout="blocked", shared=shared)
    ran.clear()
    again = DnnlModule(graph, layout="blocked", shared=shared)
    assert ran == [] and again.conv_kernels == first.conv_kernels
    DnnlModule(graph, layout="channels_last", shared=shared)
    ran.clear()
    module = DnnlModule(graph, layout="per_conv", shared=shared)
    assert 0 < sum(ran) < ran_alone, (ran, ran_alone)
    with torch.no_grad():
        torch.testing.assert_close(module(x)[0], model(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(alone(x)[0], model(x), rtol=1e-4, atol=1e-4)


def test_a_trial_build_runs_only_the_kernels_not_run_here_already(monkeypatch):
    """A trial build (as a trial process makes it) given the dict the builds here filled runs none of the
    candidates they raced: they ran in this process already. It still builds and runs the module."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()) for _ in range(2))).eval()
    x = torch.randn(1, 16, 12, 12)
    graph = _graph(model, x)
    ran = _counting_races(monkeypatch)
    shared: dict = {}
    DnnlModule(graph, layout="per_conv", shared=shared)
    times = dict(shared["times"])
    ran.clear()
    trial = DnnlModule(graph, layout="per_conv", trial=True, shared=shared)
    assert sum(ran) == 0 and shared["times"] == times  # the trial's own notes stay its own
    ran.clear()
    DnnlModule(graph, layout="per_conv", trial=True)
    assert sum(ran) > 0
    with torch.no_grad():
        torch.testing.assert_close(trial(x)[0], model(x), rtol=1e-4, atol=1e-4)


def test_each_candidate_of_a_race_runs_on_zero_buffers_of_its_own(monkeypatch):
    """A race's candidates run on scratch buffers of their own, carved from the plan's arena, which every race
    reuses from its start; the buffers read are zero (kernels that read garbage may run at another speed), and
    those written (a sigmoid writes 1/2) are zeroed again when the race ends; the arena is let go of when the build
    is done (the module may keep its plan). A trial's candidates share one set: each starts at the arena's start."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.Sigmoid(), nn.Conv2d(32, 32, 1), nn.Sigmoid()).eval()
    graph = _graph(model, torch.randn(1, 16, 12, 12))
    races, scratches, trial = [[]], set(), False
    zeros, close, following = dnnl_plan._Scratch.zeros, dnnl_plan._Scratch.close, dnnl_plan._Scratch.next_candidate

    def next_candidate(self, first=False):
        races[-1].append([])  # the candidate's buffers, (written, buffer) each
        following(self, first)

    def carving(self, md, written=False):
        buffer = zeros(self, md, written)
        races[-1][-1].append((written, buffer))
        return buffer

    def closing(self):
        scratches.add(self)
        read = [b for candidate in races[-1] for written, b in candidate if not written]
        assert trial or (read and all(not b.any() for b in read))  # a trial's may read what another wrote
        close(self)
        assert all(not block.any() for block in self.arena.blocks)  # all zeros between races
        assert self.cursor == (0, 0)
        races.append([])

    monkeypatch.setattr(dnnl_plan._Scratch, "next_candidate", next_candidate)
    monkeypatch.setattr(dnnl_plan._Scratch, "zeros", carving)
    monkeypatch.setattr(dnnl_plan._Scratch, "close", closing)
    DnnlModule(graph, layout="per_conv")
    races = [race for race in races if race]
    assert len(races) > 1
    for race in races:
        assert len(race) > 1  # candidates of their own
        spans = sorted((b.data_ptr(), b.data_ptr() + 4 * b.numel()) for candidate in race for _, b in candidate)
        assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))  # disjoint
    first = races[0][0][0][1].data_ptr()
    assert races[1][0][0][1].data_ptr() == first  # the arena reused from its start
    assert len(scratches) == 1 and scratches.pop().arena is None  # let go of when the build is done
    races.clear()
    races.append([])
    trial = True
    DnnlModule(graph, layout="per_conv", trial=True)
    starts = {candidate[0][1].data_ptr() for race in races for candidate in race if candidate}
    assert len([c for race in races for c in race]) > 1 and len(starts) == 1  # one set, kept from race to race


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc")
def test_scratch_buffers_are_backed_by_pages_of_their_own():
    """A buffer carved from a fresh block of the arena is written before it is handed out: a page only read would
    map the OS's one zero page, and a kernel reading it would find it in the cache (its time too short)."""
    graph = _graph(nn.Sequential(nn.Conv2d(4, 4, 1)).eval(), torch.randn(1, 4, 4, 4))
    plan = dnnl_plan._Plan(graph, "per_conv")
    scratch = dnnl_plan._Scratch(plan, dnnl_plan._Arena())

    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = resident()
    buffer = scratch.zeros(plan.md((8 << 20,)))  # 32 MiB, read
    assert resident() - before >= 30 << 20 and not buffer.any()
    scratch.free()


def test_the_race_arena_keeps_at_most_its_limit_between_builds(monkeypatch):
    """A build's end trims the arena the next build races on to its first blocks up to KEPT elements: the blocks
    past it are given back, not held through the builds."""
    monkeypatch.setattr(dnnl_plan._Arena, "BLOCK", 4096)
    monkeypatch.setattr(dnnl_plan._Arena, "KEPT", 3 * 4096)
    arena, cursor = dnnl_plan._Arena(), (0, 0)
    for _ in range(5):
        _, cursor = arena.carve(cursor, 4096)
    assert len(arena.blocks) == 5
    graph = _graph(nn.Sequential(nn.Conv2d(4, 4, 1)).eval(), torch.randn(1, 4, 4, 4))
    scratch = dnnl_plan._Scratch(dnnl_plan._Plan(graph, "per_conv"), arena)
    scratch.free()
    assert len(arena.blocks) == len(arena.touched) == 3 and scratch.arena is None
    again, _ = arena.carve((0, 0), 4096)
    assert again.data_ptr() == arena.blocks[0].data_ptr()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_the_race_arena_is_left_out_of_forked_processes():
    """A trial process forked between builds gets none of the arena (it races on buffers of its own): its pages
    stay writable here, with no fault to take again on the next race's writes."""
    graph = _graph(nn.Sequential(nn.Conv2d(4, 4, 1)).eval(), torch.randn(1, 4, 4, 4))
    plan = dnnl_plan._Plan(graph, "per_conv")
    buffer = plan.scratch.zeros(plan.md((1 << 20,)))
    pid = os.fork()
    if pid == 0:  # the child: reading the arena ends it with SIGSEGV (read without torch: no OpenMP after a fork)
        try:
            faulthandler.disable()  # pytest's: its dump of the crash would reach the test's output
            os._exit(int(ctypes.c_float.from_address(buffer.data_ptr()).value))
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV
    assert not buffer.any()
    plan.scratch.free()


def test_winograd_filters_are_transformed_once_for_the_modules_that_share_them(monkeypatch):
    torch.manual_seed(0)
    if winograd.unavailable() is not None:
        pytest.skip(f"gawee's Winograd kernel is not built here: {winograd.unavailable()}")
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()).eval()
    graph = _graph(model, torch.randn(1, 16, 12, 12))
    transformed, weights = [], winograd.weights
    monkeypatch.setattr(winograd, "weights", lambda w: transformed.append(w) or weights(w))
    monkeypatch.setattr(dnnl_plan._Plan, "fastest", _prefer_winograd)
    shared: dict = {}
    for layout in dnnl.LAYOUTS:
        module = DnnlModule(graph, layout=layout, shared=shared)
        assert list(module.conv_kernels.values()) == [dnnl_conv._Winograd.name]
    assert len(transformed) == 1


def test_weights_are_reordered_once_for_the_modules_that_share_them(monkeypatch):
    """A weight a module of the selection reordered to a layout is read from that copy by the next one that asks
    for the same layout (a second build of the same layout reorders none), and the copy outlives the module that
    made it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 1)).eval()
    x = torch.randn(1, 16, 12, 12)
    graph = _graph(model, x)
    reorders, reorder = [], dnnl_plan._Plan.reorder
    monkeypatch.setattr(
        dnnl_plan._Plan,
        "reorder",
        lambda self, *a, now=False, **k: (now and reorders.append(1)) or reorder(self, *a, now=now, **k),
    )
    shared: dict = {}
    first = DnnlModule(graph, layout="blocked", shared=shared)
    assert reorders  # blocked weights
    reorders.clear()
    again = DnnlModule(graph, layout="blocked", shared=shared)
    assert reorders == [] and again.conv_kernels == first.conv_kernels
    del first
    gc.collect()
    with torch.no_grad():
        torch.testing.assert_close(again(x)[0], model(x), rtol=1e-4, atol=1e-4)


def _prefer_winograd(self, candidates, reads, situation=None):
    """A race won by the first Winograd candidate."""
    chosen = next(c for c in candidates if isinstance(c, dnnl_conv._Winograd))
    for c in candidates:
        if c is not chosen:
            c.drop()
    return chosen


def test_winograd_filters_are_g_w_g_transposed():
    """The transform of the filters, each G w Gᵀ as (36, C, K) in float32: within float32's rounding of nine
    products (and of G's entries) of the exact transform, measured against the taps' magnitudes."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 2, 3, 3, generator=g) * 100
    u = winograd.weights(w)
    assert u.shape == (36, 2, 3) and u.dtype == torch.float32
    eps = torch.finfo(torch.float32).eps
    G = winograd._G
    for k in range(3):
        for c in range(2):
            want = (G @ w[k, c].double() @ G.T).reshape(36)
            magnitude = (G.abs() @ w[k, c].double().abs() @ G.abs().T).reshape(36)
            assert ((u[:, c, k].double() - want).abs() <= 12 * eps * magnitude).all()


def test_each_implementation_of_a_convolution_is_a_candidate_once(monkeypatch):
    """oneDNN 3.2's iteration over a convolution's implementations visits them once more for each earlier
    convolution of the same shape; the race takes each implementation once."""
    torch.manual_seed(0)
    fastest, raced = dnnl_plan._Plan.fastest, []

    def remembering(self, candidates, reads, situation=None):
        raced.append([c.key for c in candidates])
        return fastest(self, candidates, reads, situation)

    monkeypatch.setattr(dnnl_plan._Plan, "fastest", remembering)
    model = nn.Sequential(*(nn.Sequential(nn.Conv2d(16, 16, 1), nn.ReLU()) for _ in range(4)))
    DnnlModule(_graph(model, torch.randn(1, 16, 6, 6)), layout="per_conv")
    assert len(raced) == 4
    for keys in raced:
        assert len(set(keys)) == len(keys), keys


def test_implementations_a_quarter_as_wide_are_no_candidates(monkeypatch):
    """A kernel on vectors a quarter as wide as another implementation's (oneDNN's ``jit:sse41`` on an AVX-512
    CPU) is neither raced nor tried: it cannot win. On a CPU whose widest is AVX2, SSE4.1 kernels stay."""
    assert [
        dnnl_plan._vector_bits(n) for n in ("jit:avx512_core_amx", "brgconv:avx2", "jit:sse41", "x64:gemm:jit")
    ] == [
        512,
        256,
        128,
        0,
    ]
    torch.manual_seed(0)
    fastest, raced = dnnl_plan._Plan.fastest, []

    def remembering(self, candidates, reads, situation=None):
        raced.append([c.key[1] for c in candidates])
        return fastest(self, candidates, reads, situation)

    monkeypatch.setattr(dnnl_plan._Plan, "fastest", remembering)
    model = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 1))
    DnnlModule(_graph(model, torch.randn(1, 16, 12, 12)), layout="per_conv")
    assert raced
    for names in raced:
        bits = [dnnl_plan._vector_bits(n) for n in names]
        assert all(b == 0 or b * dnnl_plan.NARROW > max(bits) for b in bits), names


@pytest.mark.skipif(run_steps.unavailable() is not None, reason=str(run_steps.unavailable()))
def test_a_modules_runs_of_primitives_are_one_call_each_and_compute_what_its_steps_do():
    """gawee/backend/run_steps.py: the module's consecutive primitive executions are handed to C in one call; the
    outputs are those of calling each step from Python."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3), nn.Flatten(), nn.Linear(576, 5)
    )
    x = torch.randn(2, 3, 8, 8)
    module = DnnlModule(_graph(model, x))
    execute = module.lib.dnnl_primitive_execute
    assert sum(f is execute for f, _ in module.steps) >= 3
    assert len(module.program.items) < len(module.steps)
    got = module(x)[0]
    one_by_one = torch.empty_like(got)  # the same steps called one by one from Python, on the same addresses
    module.lib.dnnl_memory_set_data_handle(module.inputs[0][0], x.data_ptr())
    module.lib.dnnl_memory_set_data_handle(module.outputs[0][0], one_by_one.data_ptr())
    for function, args in module.steps:
        assert function(*args) == 0
    module.lib.dnnl_stream_wait(module.stream)
    assert torch.equal(got, one_by_one)
    torch.testing.assert_close(got, model(x).detach(), rtol=1e-4, atol=1e-4)


@EXACT_INT8
@pytest.mark.skipif(quantize_nhwc.unavailable() is not None, reason=str(quantize_nhwc.unavailable()))
def test_an_input_images_codes_race_gawees_quantizer_which_reads_each_calls_address(monkeypatch):
    """An int8 convolution reading the graph's input image: its quantizing reorder (float32 NCHW to u8 codes held
    channels-last) races oneDNN's reorder against gawee's kernel (gawee/backend/quantize_nhwc.py); whichever wins,
    the module computes the same result, and gawee's reads the input each call hands it (new tensors each time)."""
    torch.manual_seed(0)
    b = GraphBuilder("image")
    x = b.input("x", "f32[2,3,12,12]")
    w = b.const(torch.randint(-127, 128, (8, 3, 3, 3), dtype=torch.int8))
    y = b.conv2d_int8_static(
        x, w, b.const(torch.rand(8) * 0.003), b.const(torch.randn(8) * 0.1), act="relu", scale=0.02, zero_point=128,
        levels=255, stride=[2, 2], padding=[1, 1], dilation=[1, 1], groups=1,
    )  # fmt: skip
    graph = b.output(y)
    inputs = [torch.randn(2, 3, 12, 12) for _ in range(3)]
    outputs = {}
    for favoured in ("gawee", "onednn"):
        _races_won_by(monkeypatch, quantize_nhwc.KERNEL, favoured == "gawee")
        module = DnnlModule(graph, layout="channels_last")
        assert (quantize_nhwc.KERNEL in module.kernels) == (favoured == "gawee"), module.kernels
        outputs[favoured] = [module(x.clone())[0] for x in inputs]
    for got, want, x in zip(outputs["gawee"], outputs["onednn"], inputs):
        assert torch.equal(got, want)
        torch.testing.assert_close(got, gawee.run(graph, x)[0], atol=2 * 0.02 * 127 * 0.003 * 27, rtol=0)


def test_a_kernel_without_huge_pages_still_gives_buffers(monkeypatch):
    """Where ``madvise(MADV_HUGEPAGE)`` fails (a kernel built without transparent huge pages says EINVAL), the maps
    are plain memory: buffers are still carved, and a module still builds and computes."""
    import mmap

    class Refusing(mmap.mmap):
        def madvise(self, *args):
            raise OSError(22, "Invalid argument")

    monkeypatch.setattr(dnnl_plan.mmap, "mmap", Refusing)
    piece = dnnl_plan._Storage().take(1000)
    piece.fill_(2.0)
    assert float(piece.sum()) == 2000.0
    assert_runs_like(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).eval(), torch.randn(1, 3, 8, 8), layouts=["blocked"])


def test_a_modules_buffers_are_carved_disjoint_and_aligned_from_maps_advised_for_huge_pages():
    """dnnl_plan._Storage: each buffer on a cache line, none overlapping; a map's carving starts on a 2 MiB boundary;
    a request past the current map gets a new one; the maps are private and advised for transparent huge pages
    (the kernel's ``hg`` flag of the map in /proc/self/smaps: shared anonymous maps get no huge pages)."""
    import mmap

    storage = dnnl_plan._Storage()
    pieces = [storage.take(words) for words in (1, 1000, 3, 5 << 20, 17)]
    spans = sorted((p.data_ptr(), p.data_ptr() + 4 * p.numel()) for p in pieces)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert all(p.data_ptr() % storage.ALIGN == 0 for p in pieces)
    assert pieces[0].data_ptr() % storage.HUGE == 0 and pieces[3].data_ptr() % storage.HUGE == 0  # a new map
    assert [p.numel() for p in pieces] == [1, 1000, 3, 5 << 20, 17]
    pieces[3].fill_(1.0)
    assert float(pieces[3].sum()) == 5 << 20
    if not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"):
        return
    address, flags = pieces[1].data_ptr(), None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and all(c in "0123456789abcdef-" for c in head[0]):
                lo, hi = (int(a, 16) for a in head[0].split("-"))
                inside, private = lo <= address < hi, len(head) > 1 and head[1].endswith("p")
            elif line.startswith("VmFlags:") and inside:
                flags = (private, line.split()[1:])
    assert flags is not None and flags[0] and "hg" in flags[1], flags
