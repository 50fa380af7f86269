"""linear's fused activation: the fuse rules are sound, and gawee.compile runs the kernel it measured fastest.

The kernel a linear runs on is chosen by timing the candidates on this machine, so the tests never
assume which one wins: they check that the choice is recorded, is the fastest of what was measured,
and is the kernel the generated fx code actually calls.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gawee
from gawee.backend import kernels
from gawee.backend.torch_backend import TorchOptions
from gawee.errors import GaweeError
from gawee.frontend.models import resolve
from gawee.ops import ACTIVATIONS, apply_act
from gawee.testing import check_rule

ROOT = Path(__file__).resolve().parents[2]
LINEAR_ACT_RULES = [
    "fuse_linear_relu",
    "fuse_linear_gelu",
    "fuse_linear_gelu_tanh",
    "fuse_linear_silu",
    "fuse_linear_tanh",
]

KERNEL_TARGETS = {
    "aten": torch.nn.functional.linear,
    "mkl": torch.ops.mkl._mkl_linear.default,
    "onednn": torch.ops.mkldnn._linear_pointwise.default,
}


def test_fuse_linear_gelu_passes_the_harness_cli():
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "gawee-rewrite"),
            "check",
            "rules/3-fuse.rules",
            "--rule",
            "fuse_linear_gelu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fuse_linear_gelu" in done.stdout and "sound" in done.stdout and "UNSOUND" not in done.stdout


def test_every_linear_act_rule_fuses_in_the_bundled_rules():
    """Their soundness runs in tests/test_rule_soundness.py with every bundled rule; here: they are bundled,
    fire, and give the linear the activation they name."""
    names = {r.name for r in gawee.default_rules().rules}
    assert set(LINEAR_ACT_RULES) <= names
    acts = {
        torch.nn.ReLU(): "relu",
        torch.nn.GELU(): "gelu",
        torch.nn.GELU("tanh"): "gelu_tanh",
        torch.nn.SiLU(): "silu",
        torch.nn.Tanh(): "tanh",
    }
    model = torch.nn.Sequential(*(m for act in acts for m in (torch.nn.Linear(4, 4), act))).eval()
    graph, _ = gawee.rewrite(gawee.capture(model, (torch.randn(2, 4),)))
    assert [n.attrs["act"] for n in graph if n.op == "linear"] == list(acts.values())
    assert len(graph) == len(acts)


def test_the_harness_catches_a_wrong_linear_act_fusion():
    """The exact GELU fused as the tanh approximation: close, not equal — the harness must say so."""
    wrong = gawee.load_rules_text(
        'rule wrong_gelu: linear(x, w, b, act=none) |> gelu(approximate="none") => linear(x, w, b, act="gelu_tanh")'
    ).rules[0]
    assert check_rule(wrong, examples=200).verdict == "UNSOUND"


@pytest.fixture(scope="module")
def small_bert():
    source = resolve("hf:bert")
    return source.module, source.example_inputs


def _linear_calls(module):
    return [n for n in module.graph.nodes if n.op == "call_function" and n.target in KERNEL_TARGETS.values()]


def test_compiled_bert_equals_eager_and_runs_the_measured_kernels(small_bert):
    model, inputs = small_bert
    module = gawee.compile(model, inputs, options=TorchOptions(whole_graph=False))
    report = module.gawee_report
    with torch.no_grad():
        expected, got = model(*inputs), module(*inputs)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())

    linears = [n for n in report.optimized if n.op == "linear"]
    assert any(n.attrs["act"] == "gelu" for n in linears), "the FFN's GELU is fused into its linear"
    assert not any(n.op == "gelu" for n in report.optimized)
    # every linear is covered by a recorded, measured choice, and the choice is the fastest measured
    chosen = [c for c in report.kernels if c.op == "linear"]
    assert sum(c.nodes for c in chosen) == len(linears)
    for choice in chosen:
        assert set(choice.ms) >= {"aten"} and choice.kernel in choice.ms
        assert choice.ms[choice.kernel] == min(choice.ms.values())
    assert "kernels" in str(report) and report.kernel_seconds >= 0
    # the fx code calls exactly the chosen kernels, as many times as the choices say
    calls = _linear_calls(module)
    assert len(calls) == len(linears)
    for kernel, target in KERNEL_TARGETS.items():
        want = sum(c.nodes for c in chosen if c.kernel == kernel)
        assert sum(n.target is target for n in calls) == want, kernel
    gelu = next(c for c in chosen if c.act == "gelu")
    fused = [n for n in calls if n.target is KERNEL_TARGETS[gelu.kernel]]
    if gelu.kernel == "onednn":  # the activation is oneDNN's post-op
        assert any("gelu" in n.args for n in fused)
    else:  # GEMM, then GELU in place on its output
        assert any(u.target is torch.ops.aten.gelu_.default for n in fused for u in n.users)


@pytest.mark.parametrize("kernel", kernels.LINEAR_KERNELS)
def test_each_forced_kernel_equals_eager(small_bert, kernel):
    model, inputs = small_bert
    if kernel not in kernels.linear_candidates("gelu", gawee.DType.f32):
        pytest.skip(f"{kernel} is not available in this torch build")
    module = gawee.compile(model, inputs, options=TorchOptions(linear_kernel=kernel, whole_graph=False))
    with torch.no_grad():
        expected, got = model(*inputs), module(*inputs)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    calls = _linear_calls(module)
    assert calls and all(n.target is KERNEL_TARGETS[kernel] for n in calls)
    chosen = [c for c in module.gawee_report.kernels if c.op == "linear"]
    assert {c.kernel for c in chosen} == {kernel}
    assert all(not c.ms for c in chosen), "forced, not measured"


def test_measured_choice_is_cached_per_shape():
    first = kernels.measure_linear(8, 16, 24, True, "relu", min_rounds=2, budget_s=0.0)
    assert kernels.measure_linear(8, 16, 24, True, "relu", min_rounds=2, budget_s=0.0) is first
    # the times are reported rounded to 0.1 us: two candidates may tie there, the choice is made before rounding
    assert first.ms[first.kernel] == min(first.ms.values())


class _Clock:
    """best_calls' clock, moved on by the fake kernels alone: their times are exact on any machine under any load
    (real sleeps of 40 ms overslept past the 1.25x verdict with two test workers on two cores)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(kernels, "time", fake)
    return fake


def _sleeper(seconds: float, calls: list, clock: _Clock, cycle: tuple[float, ...] = (1.0,)):
    """A fake kernel taking ``seconds`` times the factors of ``cycle`` in turn."""

    def run(*_):
        calls.append(seconds)
        clock.now += seconds * cycle[len(run.made) % len(cycle)]
        run.made.append(seconds)

    run.made = []
    return run


def test_a_clear_winner_or_a_tie_ends_the_measurement_early_and_a_close_call_does_not(clock):
    """Fake kernels of known duration, not kernels: their ratio is known on any CPU."""
    calls: list = []
    best = kernels.best_calls(
        {"fast": _sleeper(0.001, calls, clock), "slow": _sleeper(0.01, calls, clock)},
        (),
        min_rounds=3,
        max_rounds=10,
        budget_s=1.0,
    )
    assert len(calls) == 2 and min(best, key=best.get) == "fast"  # 10x apart: one round decides
    calls.clear()
    close = {"a": _sleeper(0.005, calls, clock), "b": _sleeper(0.005, calls, clock, (1.05, 0.96, 1.14))}
    best = kernels.best_calls(close, (), 3, 10, budget_s=1.0)
    assert len(calls) == 2 * 10 and min(best, key=best.get) == "b"  # 4% apart, with spread: until max_rounds
    calls.clear()
    steady = {"a": _sleeper(0.005, calls, clock), "b": _sleeper(0.005 * 1.05, calls, clock)}
    best = kernels.best_calls(steady, (), 3, 10, budget_s=1.0)
    assert len(calls) == 2 * 3 and min(best, key=best.get) == "a"  # 5% behind in every round: surely not faster
    calls.clear()
    behind = {"a": _sleeper(0.005, calls, clock), "b": _sleeper(0.005 * (kernels.BEHIND + 0.02), calls, clock)}
    kernels.best_calls(behind, (), 3, 10, budget_s=1.0)
    assert len(calls) == 2 * 3  # further behind than that, though within CLEAR_WIN: the first rounds decide
    calls.clear()
    tied = {"a": _sleeper(0.005, calls, clock), "b": _sleeper(0.005 * 1.01, calls, clock)}
    kernels.best_calls(tied, (), 3, 10, budget_s=1.0)
    assert len(calls) == 2 * 3  # within TIE: either would do, so the first rounds end it


def test_a_kernel_that_cannot_win_is_dropped_and_the_rest_measured_on(clock):
    """1.375x apart: not decisive in the first round, dropped after min_rounds; the two close ones (their calls'
    spread hiding which is faster) run on."""
    calls: list = []
    b = _sleeper(0.042, calls, clock, (1.0, 0.9, 1.1))
    best = kernels.best_calls(
        {"a": _sleeper(0.04, calls, clock), "b": b, "slow": _sleeper(0.055, calls, clock)},
        (),
        min_rounds=2,
        max_rounds=6,
        budget_s=2.0,
    )
    assert calls.count(0.055) == 2 and calls.count(0.04) == calls.count(0.042) == 6
    assert best["slow"] > max(best["a"], best["b"])


def test_linear_activation_runs_in_every_dtype_and_rank():
    """f64 takes torch's GEMM (the packed kernels are float32-only); N-d and 2-D inputs, with and without bias."""
    for dtype, bias, shape in (
        (torch.float32, True, (2, 3, 6)),
        (torch.float32, False, (3, 6)),
        (torch.float64, True, (3, 6)),
        (torch.float64, False, (2, 3, 6)),
    ):
        m = torch.nn.Sequential(torch.nn.Linear(6, 5, bias=bias), torch.nn.SiLU()).to(dtype).eval()
        x = torch.randn(*shape, dtype=dtype)
        module = gawee.compile(m, (x,))
        assert [n.attrs["act"] for n in module.gawee_report.optimized if n.op == "linear"] == ["silu"]
        with torch.no_grad():
            torch.testing.assert_close(module(x), m(x), rtol=1e-5, atol=1e-6)
        if dtype == torch.float64:
            assert {c.kernel for c in module.gawee_report.kernels} <= {"aten"}


def test_unknown_linear_kernel_is_a_typed_error():
    m = torch.nn.Linear(4, 3).eval()
    with pytest.raises(GaweeError, match="unknown linear kernel") as e:
        gawee.to_torch(gawee.capture(m, (torch.randn(2, 4),)), TorchOptions(linear_kernel="blas"))
    assert "measure" in str(e.value.hint)


def test_bf16_linears_race_onednns_prepacked_kernel_only_where_it_runs_bf16(monkeypatch):
    from gawee.backend import onednn
    from gawee.ir.types import DType

    def candidates(supported: bool) -> list[str]:
        monkeypatch.setattr(onednn, "supports", lambda dtype: supported)
        return kernels.linear_candidates(None, DType.bf16)

    if not kernels._has_onednn_linear(None):
        pytest.skip("this torch has no oneDNN fused linear")
    assert candidates(True) == ["aten", "onednn"] and candidates(False) == ["aten"]
    assert "onednn" not in kernels.linear_candidates(None, DType.f16)


@pytest.mark.skipif(
    not (kernels.onednn.supports(gawee.DType.bf16) and kernels._has_onednn_linear("gelu")),
    reason="this CPU or torch runs no oneDNN bf16 kernels",
)
def test_a_bf16_linear_runs_the_kernel_measured_fastest_in_bf16():
    from gawee.ir.builder import GraphBuilder

    gb = GraphBuilder("bf16_linear")
    x = gb.input("x", "bf16[64,96]")
    w = gb.const(torch.randn(128, 96, generator=torch.Generator().manual_seed(0)).bfloat16(), "w")
    b = gb.const(torch.randn(128, generator=torch.Generator().manual_seed(1)).bfloat16(), "b")
    graph = gb.output(gb.linear(x, w, b, act="gelu"))
    module = gawee.to_torch(graph)
    (choice,) = [c for c in module.gawee_kernels if c.op == "linear"]
    assert set(choice.ms) == {"aten", "onednn"} and choice.ms[choice.kernel] == min(choice.ms.values())
    assert any(n.target is KERNEL_TARGETS[choice.kernel] for n in module.graph.nodes if n.op == "call_function")
    xs = torch.randn(64, 96, generator=torch.Generator().manual_seed(2)).bfloat16()
    (got,) = module(xs)
    (want,) = gawee.run(graph, xs)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_every_activation_runs_in_place_as_its_reference(act):
    """act_inplace covers every fused activation (the int8 kernels' results rely on it): in y's own memory, the
    reference's values."""
    params = {0: (), 1: (0.1,), 2: (-1.0, 2.0)}[ACTIVATIONS[act]]
    y = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 3
    want = apply_act(y.clone(), act, params)
    got = kernels.act_inplace(y, act, params)
    assert got.data_ptr() == y.data_ptr() and torch.equal(got, want)
