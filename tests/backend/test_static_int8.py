"""Static int8 convolutions: calibration puts each convolution input's range into the graph, the int8 phase
quantizes those convolutions and removes the annotations, the torch lowering runs oneDNN's int8 convolution and
agrees with the op's reference semantics, and gawee.compile reports what it calibrated on."""

import time

import pytest
import torch

import gawee
from gawee.backend import dnnl, quantized
from gawee.backend.torch_backend import TorchOptions, to_torch
from gawee.errors import GaweeError
from gawee.interp import run
from gawee.ir.builder import GraphBuilder
from gawee.ir.types import DType, Layout, TensorType
from gawee.ops.quantized import conv2d_int8_static, quantize_per_channel_symmetric, static_qparams
from gawee.rewrite.calibration import Calibration, calibrate
from gawee.rewrite.driver import rewrite
from gawee.rewrite.ruleset import with_precision

INT8 = with_precision(None, "int8")
ALWAYS = TorchOptions(precision="always")
"""The precision phase kept without measuring it against float32 (which a test must not depend on)."""


class Block(torch.nn.Module):
    """A residual block with a strided, a grouped and a depthwise convolution, and a downsampling path that
    reads the block's input too (two convolutions share one calibrated input)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1, groups=4, bias=False)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.down = torch.nn.Conv2d(8, 16, 1, stride=2)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.dw(torch.relu(self.conv2(y)))
        return torch.relu(y + self.down(x))


def _model():
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        model.bn1.running_mean.uniform_(-0.5, 0.5)
        model.bn1.running_var.uniform_(0.5, 2)
    return model


def test_static_qparams_cover_the_range_with_zero_exact():
    scale, zero = static_qparams(-1.0, 3.0, 255)
    assert scale == pytest.approx(4 / 255) and zero == 64  # round(1 / (4 / 255)) = round(63.75)
    assert static_qparams(0.0, 0.0, 127) == (pytest.approx(6.1e-5), 0)  # the smallest scale, not 0
    assert static_qparams(2.0, 5.0, 255)[1] == 0  # 0 is always in the range
    with pytest.raises(ValueError, match="finite"):
        static_qparams(float("-inf"), 1.0, 255)


def test_calibrate_annotates_each_convolution_input_once_with_its_range_over_the_batches():
    gb = GraphBuilder("two")
    x = gb.input("x", "f32[1,2,4,4]")
    w = gb.const(torch.randn(3, 2, 1, 1))
    graph = gb.output(gb.add(gb.conv2d(x, w), gb.conv2d(x, w)))
    batches = [torch.full((1, 2, 4, 4), 2.0), torch.linspace(-3, 1, 32).reshape(1, 2, 4, 4)]
    assert calibrate(graph, Calibration.of(batches, "two batches")) == 1
    (mark,) = [n for n in graph if n.op == "calibrated"]
    assert (mark.attrs["low"], mark.attrs["high"]) == (-3.0, 2.0)
    assert [n.inputs[0] for n in graph if n.op == "conv2d"] == [mark.output, mark.output]
    assert calibrate(graph, Calibration.of(batches, "again")) == 0  # already annotated
    (y,) = run(graph, batches[1])
    assert torch.equal(y, 2 * torch.nn.functional.conv2d(batches[1], w.data))  # the annotation is the identity


def test_a_value_that_was_not_finite_on_a_batch_is_not_annotated():
    gb = GraphBuilder("one")
    x = gb.input("x", "f32[1,1,2,2]")
    graph = gb.output(gb.conv2d(x, gb.const(torch.ones(1, 1, 1, 1))))
    assert calibrate(graph, Calibration.of([torch.tensor([[[[1.0, float("inf")], [0.0, 0.0]]]])], "inf")) == 0


def test_calibration_data_must_be_batches_of_tensors():
    with pytest.raises(GaweeError, match="no batches"):
        Calibration.of([], "none")
    with pytest.raises(GaweeError, match="batch 1 is a str"):
        Calibration.of([torch.zeros(1), "x"], "bad")


def test_without_calibration_no_convolution_is_quantized():
    model = _model()
    graph = gawee.capture(model, (torch.randn(2, 8, 12, 12),))
    optimized, report = rewrite(graph, INT8)
    assert report.calibrated == 0 and not any(n.op in ("conv2d_int8_static", "calibrated") for n in optimized)


def test_the_int8_phase_quantizes_every_calibrated_convolution_and_drops_the_annotations():
    model = _model()
    x = torch.randn(2, 8, 12, 12)
    graph = gawee.capture(model, (x,))
    batches = Calibration.of([torch.randn(2, 8, 12, 12) for _ in range(3)], "3 batches")
    optimized, report = rewrite(graph, INT8, calibration=batches)
    # the block input (read twice), conv2's input, the depthwise input, and the residual the fused add reads
    assert report.calibrated == 4
    assert [n.op for n in optimized if n.op.startswith("conv")] == ["conv2d_int8_static"] * 4
    assert not any(n.op == "calibrated" for n in optimized)
    assert report.firings["conv2d_int8_residual"] == 1 and report.firings["conv2d_int8_unbiased"] == 1
    (got,) = run(optimized, x)
    expected = model(x).detach()
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0)
    assert float(cosine) > 0.999 and 1e-5 < float((got - expected).abs().max()) < 0.1  # int8, and close


@pytest.mark.skipif(quantized.conv_unavailable(127) is not None, reason=str(quantized.conv_unavailable(127)))
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize(
    "stride, padding, groups, residual, act",
    [
        (1, 1, 1, False, None),
        (2, 1, 1, True, "relu"),
        (1, 0, 2, False, "relu"),
        (1, 1, 4, True, None),
        (1, 1, 4, False, "hardtanh"),
        (2, 1, 1, True, "hardtanh"),
        (1, 1, 1, False, "hardswish"),
        (1, 1, 2, False, "silu"),
        (1, 1, 1, True, "hardswish"),  # after torch's sum post-op, which takes relu only
    ],
)
def test_the_kernel_computes_the_reference_semantics(stride, padding, groups, residual, act, channels_last):
    levels = 255 if quantized.conv_unavailable(255) is None else 127
    torch.manual_seed(1)
    w = torch.randn(8, 4 // groups, 3, 3)
    q, ws = quantize_per_channel_symmetric(w, axis=0)
    scale, zero = static_qparams(-1.0, 2.0, levels)
    gb = GraphBuilder("q")
    layout = Layout.channels_last if channels_last else Layout.contiguous
    x = gb.input("x", TensorType((2, 4, 9, 9), DType.f32, layout))
    out = (9 + 2 * padding - 3) // stride + 1
    r = gb.input("r", TensorType((2, 8, out, out), DType.f32, layout))
    y = gb.conv2d_int8_static(
        x, gb.const(q), gb.const(ws), gb.const(torch.randn(8)), r if residual else None,
        stride=[stride] * 2, padding=[padding] * 2, groups=groups, act=act,
        act_params=(0.0, 6.0) if act == "hardtanh" else (), scale=scale, zero_point=zero, levels=levels,
    )  # fmt: skip
    graph = gb.output(y)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    xs = [3 * torch.randn(2, 4, 9, 9).contiguous(memory_format=fmt), torch.randn(2, 8, out, out)]
    xs[1] = xs[1].contiguous(memory_format=fmt)
    module = to_torch(graph, TorchOptions(channels_last=channels_last))
    assert "int8_conv" in module.code
    kept = [t.clone() for t in xs]
    (got,) = module(*xs)
    assert all(torch.equal(a, b) for a, b in zip(xs, kept))  # the inputs, the residual too, are not written
    (expected,) = run(graph, *xs)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(quantized.conv_unavailable(127) is not None, reason=str(quantized.conv_unavailable(127)))
def test_a_requantized_result_reaches_the_next_convolution_as_codes():
    """conv → conv: the int8 phase requantizes the first's result to the second's grid (requantize_for_int8_conv),
    the lowering hands it over as u8 codes (the second quantizes nothing), and the module agrees with the
    reference but where oneDNN's requantization rounds a near-tie the other way (one step of the grid)."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3)).eval()
    x = torch.randn(1, 4, 12, 12)
    graph = gawee.capture(model, (x,))
    optimized, report = rewrite(graph, INT8, calibration=Calibration.of([x], "x"))
    assert report.firings["requantize_for_int8_conv"] == 1
    first, second = [n for n in optimized if n.op == "conv2d_int8_static"]
    assert first.attrs["out_scale"] == second.attrs["scale"] > 0
    assert first.attrs["out_zero_point"] == second.attrs["zero_point"]
    module = to_torch(optimized, TorchOptions(channels_last=True))
    assert module.code.count("int8_conv") == 2
    kernels = [n.target for n in module.graph.nodes if isinstance(n.target, quantized.StaticInt8Conv)]
    assert [k.codes for k in kernels] == [True, False]
    (got,) = module(x)
    (expected,) = run(optimized, x)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4) or (got - expected).abs().max() < 0.05
    (exact,) = run(graph, x)
    assert float(torch.nn.functional.cosine_similarity(got.flatten(), exact.flatten(), dim=0)) > 0.999


def test_the_reference_clamps_what_lies_beyond_the_range():
    w = torch.ones(1, 1, 1, 1, dtype=torch.int8)
    x = torch.tensor([[[[-5.0, 0.5, 50.0]]]])
    y = conv2d_int8_static(
        x, w, torch.ones(1), stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, scale=0.25, zero_point=4,
        levels=127,
    )  # fmt: skip
    assert y.flatten().tolist() == [-1.0, 0.5, 30.75]  # [-4 * 0.25, 0.5, (127 - 4) * 0.25]


def test_compile_calibrates_on_the_given_batches_and_reports_it():
    model = _model()
    x = torch.randn(1, 8, 16, 16)
    batches = [torch.randn(1, 8, 16, 16) for _ in range(3)]
    module = gawee.compile(model, (x,), precision="int8", calibration=batches, options=ALWAYS)
    report = module.gawee_report
    assert report.calibration == "calibrated 4 values on 3 calibration batches"
    assert report.calibration_accuracy is not None and report.calibration_accuracy.cosine > 0.999
    assert "on the calibration data" in str(report)
    assert report.rewrite.firings["conv2d_int8_residual"] == 1
    got = module(batches[0])
    assert (
        float(torch.nn.functional.cosine_similarity(got.flatten(), model(batches[0]).detach().flatten(), dim=0)) > 0.999
    )
    default = gawee.compile(model, (x,), precision="int8", options=ALWAYS).gawee_report
    assert default.calibration == "calibrated 4 values on the example inputs (no calibration data given)"
    assert default.calibration_accuracy is None


@pytest.mark.skipif(dnnl.unavailable() is not None, reason=str(dnnl.unavailable()))
@pytest.mark.parametrize("backend", ["onednn", "onednn:channels_last", "auto"])
def test_a_runtime_asked_for_by_name_runs_the_int8_phase(backend):
    """The outputs the int8 rules made are not judged against the float tolerance in the runtime's candidates
    either: oneDNN's variants (measured, or one asked for) are built with the precision phase, and ``auto`` holds
    them to the torch lowering's error (each was refused before as computing other outputs)."""
    model, x = _model(), torch.randn(1, 8, 16, 16)
    batches = [torch.randn(1, 8, 16, 16) for _ in range(2)]
    module = gawee.compile(model, (x,), precision="int8", calibration=batches, backend=backend, options=ALWAYS)
    choice = module.gawee_report.backend
    assert not any("differ" in why for why in choice.not_candidates.values()), choice.not_candidates
    if backend != "auto":
        assert choice.chosen.startswith(backend)
    assert module.gawee_report.accuracy.cosine > 0.999
    assert module.gawee_report.rewrite.firings["conv2d_int8_residual"] == 1


def test_calibration_without_int8_is_refused():
    with pytest.raises(GaweeError, match="precision int8 only"):
        gawee.compile(_model(), (torch.randn(1, 8, 8, 8),), calibration=[torch.randn(1, 8, 8, 8)])


def test_compile_keeps_float32_where_it_measures_faster(monkeypatch, caplog):
    """With ``TorchOptions.precision="measure"`` (the default) the float32 module is compiled too and kept where the
    int8 one measures slower: planted here by making the int8 module's calls slow."""
    from gawee.backend import compiler

    real = compiler._precision_or_float

    def slowed(module, build_float, xs):
        class Slow:
            gawee_report = module.gawee_report

            def __call__(self, *args):
                time.sleep(0.01)
                return module(*args)

        return real(Slow(), build_float, xs)

    monkeypatch.setattr(compiler, "_precision_or_float", slowed)
    model = _model()
    with caplog.at_level("WARNING", logger="gawee.backend.compiler"):
        module = gawee.compile(model, (torch.randn(1, 8, 16, 16),), precision="int8")
    report = module.gawee_report
    assert report.precision is None and report.precision_skipped.startswith("int8 not applied: float32 measured")
    assert "float32" in report.precision_skipped and "precision choice" in report.seconds
    assert report.precision_skipped in caplog.text
    assert not any(n.op == "conv2d_int8_static" for n in report.optimized)


def test_compile_keeps_the_precision_that_measures_faster(monkeypatch):
    from gawee.backend import compiler

    real = compiler._precision_or_float

    def slow_float(module, build_float, xs):
        def build():
            plain = build_float()

            class Slow:
                gawee_report = plain.gawee_report

                def __call__(self, *args):
                    time.sleep(0.01)
                    return plain(*args)

            return Slow()

        return real(module, build, xs)

    monkeypatch.setattr(compiler, "_precision_or_float", slow_float)
    report = gawee.compile(_model(), (torch.randn(1, 8, 16, 16),), precision="int8").gawee_report
    assert report.precision == "int8" and report.precision_timing.endswith("int8 kept")
    assert "measured against float32 (int8 " in str(report)


def test_an_unknown_precision_option_is_refused():
    with pytest.raises(GaweeError, match=r"TorchOptions\.precision"):
        gawee.compile(_model(), (torch.randn(1, 8, 8, 8),), precision="int8", options=TorchOptions(precision="x"))


def test_a_window_wholly_in_the_padding_is_told():
    from gawee.backend import onednn

    assert not onednn.window_in_padding((1, 8, 56, 56), (3, 3), (1, 1), (1, 1), (1, 1))  # resnet's 3x3
    assert not onednn.window_in_padding((1, 3, 224, 224), (7, 7), (2, 2), (3, 3), (1, 1))  # its stem
    assert onednn.window_in_padding((1, 8, 9, 9), (1, 1), (1, 1), (1, 1), (1, 1))  # a 1x1 over a padded border
    assert onednn.window_in_padding((1, 8, 5, 5), (3, 1), (1, 1), (3, 0), (1, 1))  # padding past a 3-tap window
    assert not onednn.window_in_padding((1, 8, 5, 5), (3, 1), (1, 1), (2, 0), (1, 1))  # its last tap reads row 0
    assert not onednn.window_in_padding((1, 8, 4, 4), (2, 1), (1, 1), (1, 0), (3, 1))  # one dilated tap reads
    assert onednn.window_in_padding((1, 8, 1, 4), (2, 1), (1, 1), (2, 0), (2, 1))  # both taps straddle row 0


@pytest.mark.skipif(quantized.conv_unavailable(127) is not None, reason=str(quantized.conv_unavailable(127)))
def test_a_geometry_oneDNN_gets_wrong_runs_the_reference():
    """A 1x1 depthwise convolution over a border of 2 (every wrong case of the int8 fuzzer has a window wholly in
    the padding): the lowering keeps it from oneDNN, and the module computes the reference."""
    q = torch.randint(-127, 128, (16, 1, 1, 1), dtype=torch.int8)
    gb = GraphBuilder("pad")
    x = gb.input("x", "f32[1,16,10,9]")
    y = gb.conv2d_int8_static(
        x, gb.const(q), gb.const(torch.full((16,), 0.01)), gb.const(torch.randn(16)),
        stride=[3, 2], padding=[2, 0], groups=16, act="relu", scale=0.05, zero_point=60, levels=127,
    )  # fmt: skip
    graph = gb.output(y)
    module = to_torch(graph, TorchOptions())
    assert "int8_conv" not in module.code
    xs = torch.randn(1, 16, 10, 9)
    torch.testing.assert_close(module(xs)[0], run(graph, xs)[0], rtol=0, atol=0)


def test_a_calibration_batch_of_another_shape_is_a_typed_error_naming_it():
    from gawee.errors import EvaluationError

    batches = [torch.randn(1, 8, 16, 16), torch.randn(1, 8, 20, 20)]
    with pytest.raises(EvaluationError, match=r"calibration \(2 calibration batches\), batch 1: input") as e:
        gawee.compile(_model(), (torch.randn(1, 8, 16, 16),), precision="int8", calibration=batches, options=ALWAYS)
    assert "same dtypes and shapes" in str(e.value)


def test_an_annotation_no_int8_rule_takes_is_dropped():
    """A calibrated convolution input the int8 rules leave in float32 (a fused tanh: no rule bounds it there) loses
    its annotation: ``calibrated`` would otherwise stay in the graph as a copy on every call."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Tanh(), torch.nn.Conv2d(8, 8, 3)).eval()
    x = torch.randn(1, 3, 12, 12)
    graph = gawee.capture(model, (x,))
    optimized, report = rewrite(
        graph, with_precision(gawee.default_rules(), "int8"), calibration=Calibration.of([x], "x")
    )
    assert report.calibrated == 2 and report.firings["drop_calibration"] == 1
    assert [n.op for n in optimized] == ["conv2d", "conv2d_int8_static"]
