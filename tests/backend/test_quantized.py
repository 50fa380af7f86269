"""The int8 dynamic linear kernel: the torch lowering runs torch's quantized::linear_dynamic on a prepacked weight
and agrees with the op's reference semantics; gawee.compile(precision=...) runs the precision phase, reports it,
and does not hold its outputs to the exact tolerance."""

import pytest
import torch

import gawee
from gawee.backend import compiler, quantized
from gawee.backend.torch_backend import TorchOptions, to_torch
from gawee.errors import GaweeError
from gawee.interp import run
from gawee.ir.builder import GraphBuilder
from gawee.ops.quantized import activation_qparams, quantize_per_channel_symmetric
from tests.int8_mlp import assert_within_mlp_bound, int8_bound, make

pytestmark = pytest.mark.skipif(quantized.unavailable() is not None, reason=str(quantized.unavailable()))
ALWAYS = TorchOptions(precision="always")
"""The precision phase kept without measuring it against float32 (which a test must not depend on)."""


def _graph(shape, out, bias, act, seed, levels=127):
    """A graph of one linear_int8_dynamic of a random weight (its input quantized to [0, levels]), and the float32
    linear it quantizes."""
    torch.manual_seed(seed)
    w = torch.randn(out, shape[-1])
    q, s = quantize_per_channel_symmetric(w, axis=0)
    graphs = []
    for quantize in (True, False):
        b = GraphBuilder("int8")
        x = b.input("x", f"f32[{','.join(map(str, shape))}]")
        bias_value = None
        if bias == "const":
            bias_value = b.const(torch.arange(out, dtype=torch.float32) / out)
        elif bias == "input":
            bias_value = b.input("b", f"f32[{out}]")
        if quantize:
            y = b.linear_int8_dynamic(x, b.const(q), b.const(s), bias_value, act=act, levels=levels)
        else:
            y = b.linear(x, b.const(w), bias_value, act=act)
        graphs.append(b.output(y))
    return graphs


@pytest.mark.parametrize(
    "shape, out, bias, act",
    [
        ((4, 32), 16, "const", None),
        ((2, 3, 48), 8, None, "relu"),
        ((5, 7), 3, "input", "gelu"),
        ((3, 40), 24, "const", "gelu"),
        ((3, 40), 24, "const", "gelu_tanh"),
        ((64,), 5, "const", None),
    ],
)
@pytest.mark.parametrize("levels", [127, 255], ids=["7-bit", "8-bit"])
@pytest.mark.parametrize("kernel", quantized.LINEAR_KERNELS)
def test_the_lowering_runs_the_kernel_and_agrees_with_the_reference(shape, out, bias, act, levels, kernel):
    if kernel not in quantized.linear_kernels(levels):
        pytest.skip(quantized.onednn_unavailable(levels) or str(quantized.unavailable(levels)))
    graph, float_graph = _graph(shape, out, bias, act, seed=len(shape) + out, levels=levels)
    module = to_torch(graph, TorchOptions(int8_linear_kernel=kernel))
    assert [k.kernel for k in module.gawee_kernels] == [kernel]
    assert "int8_linear" in module.code
    xs = [torch.randn(shape) * 3] + ([torch.randn(out)] if bias == "input" else [])
    with torch.no_grad():
        (got,) = module(*xs)
    (want,) = run(graph, *xs)
    # the same quantized input and integer product: only the float32 dequantization may round differently
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6 * float(want.abs().max()))
    (unquantized,) = run(float_graph, *xs)
    assert float((got - unquantized).abs().max()) > 1e-4  # int8 really computed: far from the float32 linear


def _reference_codes(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, float, int]:
    """The codes, scale and zero point linear_int8_dynamic's reference semantics quantize ``x`` with."""
    scale, zero = activation_qparams(x, levels)
    return torch.clamp(torch.round(x * (1 / scale)) + zero.float(), 0, 255), float(scale), int(zero)


def _awkward_inputs():
    """Inputs whose quantization takes each path of the quantizer: lengths around its vector width and past the
    size it splits between threads, one-signed ranges, codes exactly half-way between two levels, and the ranges
    the reference treats apart (all zeros; a range below the smallest scale)."""
    g = torch.Generator().manual_seed(7)
    yield "normal", torch.randn(3, 17, generator=g) * 3
    for n in (1, 15, 16, 33, (1 << 17) + 5):
        yield f"n={n}", torch.randn(n, generator=g)
    yield "positive", torch.rand(64, generator=g) + 2
    yield "negative", -torch.rand(64, generator=g) - 0.5
    yield "ties", torch.cat([torch.tensor([0.0, 255 * 0.25]), (torch.arange(40) + 0.5) * 0.25])
    yield "zeros", torch.zeros(20)
    yield "tiny", torch.randn(20, generator=g) * 1e-9


@pytest.mark.skipif(quantized.onednn_unavailable() is not None, reason=str(quantized.onednn_unavailable()))
@pytest.mark.parametrize("levels", [127, 255])
def test_the_quantizer_makes_the_reference_codes(levels):
    kernel = quantized.OnednnInt8Linear("q", torch.ones(2, 1, dtype=torch.int8), torch.ones(2), None, None, (), levels)
    for name, x in _awkward_inputs():
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        codes, scale, zero = kernel.codes(flat)
        want, want_scale, want_zero = _reference_codes(flat, levels)
        assert (scale, zero) == (want_scale, want_zero), name
        assert torch.equal(codes.float(), want), name
    ties = dict(_awkward_inputs())["ties"]
    assert (_reference_codes(ties, 255)[0][2:] % 2 == 0).all()  # ties there, rounded to even: the case is reached
    bad = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]])
    assert kernel.codes(bad[:1]) is None and kernel.codes(bad[1:]) is None


@pytest.mark.skipif(quantized.onednn_unavailable() is not None, reason=str(quantized.onednn_unavailable()))
def test_the_onednn_kernel_of_a_non_finite_input_is_the_reference():
    graph, _ = _graph((2, 8), 4, "const", "relu", seed=1, levels=255)
    module = to_torch(graph, TorchOptions(int8_linear_kernel=quantized.ONEDNN_KERNEL))
    x = torch.randn(2, 8)
    x[1, 3] = float("inf")
    torch.testing.assert_close(module(x)[0], run(graph, x)[0], rtol=0, atol=0, equal_nan=True)


@pytest.mark.skipif(quantized.onednn_unavailable() is not None, reason=str(quantized.onednn_unavailable()))
def test_a_post_op_is_fused_only_where_it_computes_torchs_activation(monkeypatch):
    assert quantized.post_op("relu") == ("relu", "") and quantized.post_op("silu") is None
    assert quantized.post_op("gelu") in (None, ("gelu", "none"))
    # a oneDNN gelu that computes something else than torch's (planted: torch's gelu shifted by 1e-3) is refused
    monkeypatch.setattr(quantized, "apply_act", lambda x, act, params: torch.nn.functional.gelu(x) + 1e-3)
    assert quantized.post_op.__wrapped__("gelu") is None


def test_an_int8_linear_kernel_is_chosen_once_per_shape():
    """Measured: one of the kernels that run here, the same choice for the same shape (cached), its timings
    listed; forced: the kernel asked for; an unknown name is refused with the choices."""
    if quantized.unavailable(127) is not None:
        pytest.skip(quantized.unavailable(127))
    choice = quantized.choose_linear(8, 48, 16, True, "relu", (), 127)
    assert choice.kernel in quantized.linear_kernels(127)
    assert quantized.choose_linear(8, 48, 16, True, "relu", (), 127) is choice
    assert len(choice.ms) == len(quantized.linear_kernels(127)) or choice.unmeasured == "the only int8 kernel here"
    forced = quantized.choose_linear(8, 48, 16, True, "relu", (), 127, forced=quantized.KERNEL)
    assert forced.kernel == quantized.KERNEL and forced.unmeasured == "forced"
    with pytest.raises(GaweeError, match="unknown int8 linear kernel") as e:
        quantized.choose_linear(8, 48, 16, True, None, (), 127, forced="mkl")
    assert "onednn::qlinear_pointwise" in e.value.hint


def test_the_race_drops_a_kernel_that_computes_something_else(monkeypatch):
    """Each candidate is checked against the reference (on its first rows) before it is timed: a planted kernel
    that is off by one in its first output column never wins, and the same shape still races both real ones."""
    if len(quantized.linear_kernels(127)) < 2:
        pytest.skip("one int8 linear kernel here: nothing to race")
    real = quantized.make_linear
    rows = 3 * quantized.CHECK_ROWS  # more rows than are checked: the timed input is the full one
    assert "onednn::qlinear_pointwise" in quantized.choose_linear(rows, 40, 24, False, None, (), 127).ms

    def planted(kernel, *args):
        fn = real(kernel, *args)
        if kernel != quantized.ONEDNN_KERNEL:
            return fn
        return lambda x, bias=None: fn(x, bias) + torch.nn.functional.one_hot(torch.tensor(0), 24)

    monkeypatch.setattr(quantized, "make_linear", planted)
    choice = quantized.choose_linear(rows, 40, 24, True, None, (), 127)
    assert choice.kernel == quantized.KERNEL and quantized.ONEDNN_KERNEL not in choice.ms


def test_8_bit_inputs_on_a_cpu_without_vnni_run_the_reference(monkeypatch):
    """Without VNNI the kernel's u8 x s8 pairs saturate in 16 bits: an input quantized to 8 bits runs the op's
    reference semantics there (exact), a 7-bit one the kernel."""
    monkeypatch.setattr(quantized, "no_vnni", lambda: "this CPU has no VNNI (planted)")
    assert "this CPU has no VNNI (planted)" in quantized.unavailable(255) and quantized.unavailable(127) is None
    assert quantized.linear_kernels(127) == [quantized.KERNEL]  # oneDNN's may halve weights there: not a candidate
    graph, _ = _graph((4, 32), 16, "const", None, seed=0, levels=255)
    module = to_torch(graph)
    assert not module.gawee_kernels and "int8_linear" not in module.code
    x = torch.randn(4, 32)
    torch.testing.assert_close(module(x)[0], run(graph, x)[0], rtol=0, atol=0)
    assert [k.kernel for k in to_torch(_graph((4, 32), 16, "const", None, 0)[0]).gawee_kernels] != []


def test_8_bit_inputs_halve_the_quantization_error():
    """The same linear quantized to 8-bit and to 7-bit inputs (the reference semantics): the 8-bit error against
    the float32 linear is well below the 7-bit one."""
    graph7, float_graph = _graph((16, 64), 32, "const", None, seed=3)
    graph8, _ = _graph((16, 64), 32, "const", None, seed=3, levels=255)
    x = torch.randn(16, 64) * 3
    (exact,) = run(float_graph, x)
    e7, e8 = ((run(g, x)[0] - exact).abs().mean() for g in (graph7, graph8))
    assert e8 < 0.75 * e7


def test_without_the_cpu_kernels_the_reference_runs():
    graph, _ = _graph((4, 32), 16, "const", None, seed=0)
    module = to_torch(graph, TorchOptions(fused_kernels=False))
    assert not module.gawee_kernels and "int8_linear" not in module.code
    x = torch.randn(4, 32)
    torch.testing.assert_close(module(x)[0], run(graph, x)[0], rtol=0, atol=0)


def test_compile_int8_runs_the_quantized_kernel_within_the_bound():
    model, x = make()
    # the torch lowering's kernels (the whole-graph choice may return gawee's oneDNN runtime, a step of the same
    # kernel there, whichever measures faster)
    lowering = TorchOptions(precision="always", whole_graph=False)
    module = gawee.compile(model, (x,), precision="int8", options=lowering)
    report = module.gawee_report
    assert report.precision == "int8" and report.rewrite.firings["linear_int8"] == 2
    assert {k.kernel for k in report.kernels} <= set(quantized.LINEAR_KERNELS)
    assert sum(k.nodes for k in report.kernels) == 2
    assert sorted(n.op for n in report.optimized) == ["linear_int8_dynamic"] * 2
    with torch.no_grad():
        got = module(x)
    error = assert_within_mlp_bound(model, x, got)
    assert error > 1e-4  # int8 really ran: the float32 model is within 1e-6 of itself
    # the check saw the error past float32's tolerance and accepted it as the approximate rules'
    assert report.equivalence.ok and report.equivalence.outputs[0].approximate
    assert "1 outputs of approximate rules past the tolerance" in str(report.equivalence)
    accuracy = report.accuracy
    assert accuracy.max_abs_error == pytest.approx(error, rel=1e-3)
    assert 0 < accuracy.mean_abs_error <= accuracy.max_abs_error and 0.999 < accuracy.cosine <= 1
    assert accuracy.top1 is not None and accuracy.top1[1] == 4
    assert "precision int8: max abs error" in str(report) and "cosine" in str(report)
    assert f"linear_int8_dynamic {report.kernels[0].shape} x1: {report.kernels[0].kernel}" in str(report)


def test_compile_int8_says_which_rewrites_the_error_comes_from():
    """The report lists each value the int8 rewrites made against the float model's value it stands for, worst
    relative error first: the first layer (exact input) within its declared bound, the output at the output's
    error."""
    model, x = make()
    report = gawee.compile(model, (x,), precision="int8", options=ALWAYS).gawee_report
    errors = report.firing_errors
    assert [e.rule for e in errors] == ["linear_int8", "linear_int8"] and all(e.bound for e in errors)
    assert [e.relative for e in errors] == sorted((e.relative for e in errors), reverse=True)
    first, last = sorted(errors, key=lambda e: e.firing)
    l1 = model[0]
    h = torch.relu(x.double() @ l1.weight.detach().double().T + l1.bias.detach().double())
    assert 0 < first.max_error <= float(int8_bound(x, l1.weight.detach(), l1.bias.detach()).max())
    assert first.scale == pytest.approx(max(1.0, float(h.abs().max())))
    assert last.original == report.graph.outputs[0].name and last.value == report.optimized.outputs[0].name
    assert last.max_error == pytest.approx(report.accuracy.max_abs_error, rel=1e-6)
    assert "largest errors at approximate rewrites (2 values): linear_int8 at" in str(report)


def test_compile_without_precision_is_float32():
    model, x = make()
    report = gawee.compile(model, (x,)).gawee_report
    assert report.precision is None and report.accuracy is None and report.firing_errors == []
    assert "linear_int8_dynamic" not in {n.op for n in report.optimized}
    assert not any(o.approximate for o in report.equivalence.outputs)


def test_compile_bf16_is_checked_as_approximate_too(monkeypatch):
    monkeypatch.setattr(compiler, "no_bf16", lambda device: None)  # a CPU with bf16 arithmetic, whichever runs this
    model, x = make()
    module = gawee.compile(model, (x,), precision="bf16", options=ALWAYS)
    report = module.gawee_report
    assert report.precision == "bf16" and report.rewrite.firings["linear_bf16"] == 2
    assert report.equivalence.ok and report.accuracy.cosine > 0.999
    assert report.precision_skipped == ""


def test_compile_bf16_on_a_cpu_without_bf16_says_so_and_stays_in_float32(monkeypatch, caplog):
    monkeypatch.setattr(compiler, "no_bf16", lambda device: "this CPU has no bf16 instructions (planted)")
    model, x = make()
    with caplog.at_level("WARNING", logger="gawee.backend.compiler"):
        module = gawee.compile(model, (x,), precision="bf16", options=ALWAYS)
    report = module.gawee_report
    assert report.precision is None and report.accuracy is None
    assert report.precision_skipped == (
        "bf16 not applied: this CPU has no bf16 instructions (planted), so the model stays in float32"
    )
    assert f"precision {report.precision_skipped}" in str(report) and report.precision_skipped in caplog.text
    assert "linear_bf16" not in report.rewrite.firings
    assert all(v.dtype.name == "f32" for n in report.optimized for v in n.outputs)
    torch.testing.assert_close(module(x), model(x), rtol=1e-4, atol=1e-5)  # float32: the exact tolerance
    # int8 has no such condition: its kernels run on every x86 CPU
    monkeypatch.setattr(compiler, "no_bf16", lambda device: pytest.fail("asked for int8"))
    assert gawee.compile(model, (x,), precision="int8", options=ALWAYS).gawee_report.precision == "int8"


@pytest.mark.parametrize(
    "fields, native",
    [
        ({"flags": "fpu sse2 avx2 fma"}, False),  # AVX2 only (this project's AMD VM)
        ({"flags": "avx2 avx512f avx512bw"}, False),  # AVX-512 without its bf16 extension
        ({"flags": "avx2 avx512f avx512_bf16"}, True),  # Zen 4, Cooper Lake
        ({"flags": "avx2 avx512f amx_bf16 amx_tile"}, True),  # Sapphire Rapids
        ({"Features": "fp asimd sve"}, False),  # Arm without bf16
        ({"Features": "fp asimd sve bf16"}, True),  # Arm with it
        ({}, True),  # nothing says: no claim
    ],
)
def test_no_bf16_reads_the_cpus_flags(monkeypatch, fields, native):
    from gawee import machine

    monkeypatch.setattr(machine, "cpu_info", lambda: fields)
    why = machine.no_bf16()
    assert (why is None) == native
    assert why is None or why.startswith("this CPU has no bf16 instructions")
    assert machine.no_bf16(torch.device("meta")) is None  # not a CPU or a CUDA device: no claim


def test_compile_refuses_an_unknown_precision_before_capturing():
    model, x = make()
    with pytest.raises(GaweeError, match="no precision phase 'int4'"):
        gawee.compile(model, (x,), precision="int4")


def test_the_bound_helper_is_the_rule_bound():
    """int8_bound (the tests' float64 copy of linear_int8's bound) equals the bound the harness evaluates."""
    from gawee.rewrite.bound import evaluate_bound
    from gawee.rewrite.ruleset import PRECISIONS, load_rules

    rule = load_rules(PRECISIONS["int8"]).rule("linear_int8")
    torch.manual_seed(1)
    x, w, bias = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    b = GraphBuilder("g")
    xv, wv, bv = b.input("x", "f32[3,8]"), b.const(w), b.const(bias)
    y = b.linear(xv, wv, bv)
    data = {xv: x.double(), wv: w.double(), bv: bias.double()}
    env = {"x": xv, "w": wv, "b": bv, "y": y, "a": None}
    (declared,) = evaluate_bound(rule, env, lambda v: data.get(v), [(3, 5)])
    torch.testing.assert_close(declared, int8_bound(x, w, bias), rtol=1e-12, atol=0)


def test_compile_int8_with_a_dynamic_batch():
    """The rules need no guard a symbolic batch (0 in range) fails: the bound's maxima hold a 0 for an empty x."""
    model, x = make()
    batch = torch.export.Dim("batch", max=64)
    module = gawee.compile(model, (x,), precision="int8", dynamic_shapes=({0: batch},), options=ALWAYS)
    report = module.gawee_report
    assert report.rewrite.firings["linear_int8"] == 2
    assert {k.kernel for k in report.kernels} <= set(quantized.LINEAR_KERNELS)
    assert sum(k.nodes for k in report.kernels) == 2
    for rows in (1, 7, 33):
        torch.manual_seed(rows)
        x = torch.randn(rows, 32)
        with torch.no_grad():
            assert_within_mlp_bound(model, x, module(x))
    assert module(torch.randn(0, 32)).shape == (0, 10)


@pytest.mark.parametrize(
    "fields, vnni",
    [
        ({"flags": "fpu sse2 avx2 fma"}, False),  # AVX2 only
        ({"flags": "avx2 avx512f avx512bw"}, False),  # AVX-512 without VNNI (Skylake)
        ({"flags": "avx2 avx512f avx512_vnni"}, True),  # Cascade Lake, Zen 4
        ({"flags": "avx2 avx_vnni"}, True),  # Alder Lake's AVX-VNNI
        ({"Features": "fp asimd sve"}, False),  # not x86: no claim of exactness
        ({}, False),  # nothing says
    ],
)
def test_no_vnni_reads_the_cpus_flags(monkeypatch, fields, vnni):
    from gawee import cpu

    monkeypatch.setattr(cpu, "cpu_info", lambda: fields)
    why = cpu.no_vnni()
    assert (why is None) == vnni
    assert why is None or "VNNI" in why
