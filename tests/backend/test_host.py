"""Every runtime takes its inputs the same way, checked with the same errors, and returns the model's own outputs."""

from __future__ import annotations

import pytest
import torch

import gawee
from gawee.backend import runtime
from gawee.backend.host import InputSignature, OutputStructure
from gawee.backend.torch_backend import TorchOptions
from gawee.errors import CaptureError, InputError
from gawee.ir.symbolic import ShapeOutOfRange, Sym
from gawee.ir.types import DType, TensorType

transformers = pytest.importorskip("transformers")

UNMEASURED = TorchOptions(linear_kernel="aten", attention_kernel="aten", channels_last=False, whole_graph=False)
"""The torch lowering without timing kernels: these tests look at its inputs and outputs."""


@pytest.fixture(scope="module")
def bert():
    """A one-layer BERT of random weights (its output a ``ModelOutput``), captured and rewritten, with its inputs and
    its own output on them."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = transformers.BertModel(config).eval()
    inputs = {"input_ids": torch.randint(0, 100, (1, 8)), "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    graph, _ = gawee.rewrite(gawee.capture(model, inputs))
    with torch.no_grad():
        expected = model(**inputs)
    return model, graph, inputs, expected


def _build(name: str, graph, inputs: dict, structure: OutputStructure):
    """The runtime ``name``'s module of ``graph``, built through the runtime interface (as gawee.compile builds it
    with ``backend=name``), or a skip saying why the runtime cannot run it here."""
    rt = runtime.get(name)
    why = rt.unavailable() or rt.cannot_run(graph)
    if why:
        pytest.skip(f"{rt.title}: {why}")  # oneDNN's primitives: BERT's embedding gathers with i64 ids
    options = {"options": UNMEASURED} if "options" in rt.options else {}
    return rt.build(graph, list(inputs.values()), output_structure=structure, **options)


BAD_CALLS = {
    "a float mask": (
        lambda ids, mask: ((ids, mask.float()), {}),
        InputError,
        "input error: input attention_mask is f32[1,8], the graph takes i64[1,8]",
    ),
    "int32 ids": (
        lambda ids, mask: ((ids.int(), mask), {}),
        InputError,
        "input error: input input_ids is i32[1,8], the graph takes i64[1,8]",
    ),
    "another length": (
        lambda ids, mask: ((torch.zeros(1, 9, dtype=torch.long), mask), {}),
        ShapeOutOfRange,
        "shape error: input input_ids dimension 1 is 9, the graph needs 8 (static)",
    ),
    "a missing input": (
        lambda ids, mask: ((ids,), {}),
        InputError,
        "input error: the graph takes 2 inputs (input_ids i64[1,8], attention_mask i64[1,8]), got 1",
    ),
    "a misspelt name": (
        lambda ids, mask: ((), {"input_ids": ids, "attn_mask": mask}),
        InputError,
        "input error: the graph has no input named 'attn_mask'; its inputs are input_ids, attention_mask",
    ),
    "a list": (
        lambda ids, mask: ((ids.tolist(), mask), {}),
        InputError,
        "input error: input input_ids is a list, the graph takes a tensor i64[1,8]",
    ),
}


@pytest.mark.parametrize(
    "runtime",
    [
        "torch",
        "onnxruntime",
        "onednn_graph",
        "onednn",
        # IREE compiles the model with iree-compile: about 25 s of this test's time on 2 cores
        pytest.param("iree", marks=pytest.mark.slow),
    ],
)
def test_every_runtime_returns_the_models_output_class_and_refuses_bad_inputs_alike(bert, runtime):
    _, graph, inputs, expected = bert
    module = _build(runtime, graph, inputs, OutputStructure.of(expected))
    ids, mask = inputs.values()
    with torch.no_grad():
        for got in (module(ids, mask), module(**inputs), module(ids, attention_mask=mask)):
            assert type(got) is type(expected) and list(got.keys()) == list(expected.keys())
            torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got[1], expected.pooler_output, rtol=1e-4, atol=1e-4)
    for case, (call, error, message) in BAD_CALLS.items():
        args, kwargs = call(ids, mask)
        with pytest.raises(error) as caught:
            module(*args, **kwargs)
        assert str(caught.value) == message, case


class _Pooled(torch.nn.Module):
    """A float32 model that returns a ``ModelOutput``: what oneDNN's primitives run (BERT's i64 ids they do not)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, pixels):
        hidden = torch.relu(self.proj(pixels))
        return transformers.modeling_outputs.BaseModelOutputWithPooling(
            last_hidden_state=hidden, pooler_output=hidden.mean(1)
        )


@pytest.mark.parametrize("runtime", ["onednn", "torch"])
def test_a_float_model_output_comes_back_from_onednns_primitives(runtime):
    torch.manual_seed(0)
    model, x = _Pooled().eval(), torch.randn(2, 4, 8)
    graph, _ = gawee.rewrite(gawee.capture(model, x))
    with torch.no_grad():
        expected = model(x)
    module = _build(runtime, graph, {"pixels": x}, OutputStructure.of(expected))
    got = module(pixels=x)
    assert type(got) is type(expected)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeOutOfRange, match=r"^shape error: input pixels dimension 1 is 5, the graph needs 4"):
        module(torch.randn(2, 5, 8))


def test_compile_with_the_torch_lowering_keeps_a_model_output_and_takes_keyword_inputs(bert):
    model, _, inputs, expected = bert
    module = gawee.compile(model, inputs, options=TorchOptions(whole_graph=False))
    got = module(**inputs)
    assert type(got) is type(expected)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, rtol=1e-4, atol=1e-4)


def test_an_output_keeps_its_nesting_and_the_values_that_are_not_tensors():
    t = torch.zeros(2)
    example = {"logits": t, "extra": (t, 3, "label", None)}
    structure = OutputStructure.of(example)
    assert structure.tensors == 2
    a, b = torch.ones(2), torch.full((2,), 2.0)
    assert structure([a, b]) == {"logits": a, "extra": (b, 3, "label", None)}
    assert OutputStructure.of(t)([a]) is a
    assert OutputStructure.of((t, t))([a, b]) == (a, b)


S = Sym("s0", 1, 32, 4)
SIGNATURE = InputSignature(["ids", "scores"], [TensorType((1, S), DType.i64), TensorType((1, 2 * S, 3), DType.f32)])


def test_symbolic_dimensions_are_solved_and_checked_against_their_ranges():
    ids, scores = torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 10, 3)
    assert SIGNATURE(ids, scores) == (5,) and SIGNATURE.inputs((ids,), {"scores": scores}) == (ids, scores)
    cases = {
        "shape error: input ids dimension 1 is 40, outside the range of s0: 1..32": (
            torch.zeros(1, 40, dtype=torch.long),
            torch.zeros(1, 80, 3),
        ),
        "shape error: input scores dimension 1 is 11, the graph needs 10 (2*s0 = 10)": (ids, torch.zeros(1, 11, 3)),
        "shape error: input scores dimension 2 is 4, the graph needs 3 (static)": (ids, torch.zeros(1, 10, 4)),
        "shape error: input scores has rank 2 (shape [1, 10]), the graph takes rank 3": (ids, torch.zeros(1, 10)),
    }
    for message, xs in cases.items():
        with pytest.raises(ShapeOutOfRange) as caught:
            SIGNATURE(*xs)
        assert str(caught.value).splitlines()[0] == message
        assert isinstance(caught.value, ValueError)
    with pytest.raises(InputError, match=r"input scores is f64\[1,10,3\], the graph takes f32\[1,2\*s0,3\] \(s0 in "):
        SIGNATURE(ids, scores.double())
    with pytest.raises(InputError, match="input ids is given twice"):
        SIGNATURE.inputs((ids,), {"ids": ids})


def test_capture_and_compile_take_a_bare_tensor_as_the_models_one_input():
    model, x = torch.nn.Linear(4, 2).eval(), torch.randn(1, 4)
    graph = gawee.capture(model, x)
    assert [str(v.type) for v in graph.inputs] == ["f32[1,4]"]  # the batch dimension is kept
    module = gawee.compile(model, x, options=UNMEASURED)
    torch.testing.assert_close(module(x), model(x))


class _Keywords(torch.nn.Module):
    def forward(self, a, b=None, c=None):
        return {"sum": a + 2 * b - c}


def test_capture_and_compile_take_a_dict_of_keyword_inputs():
    a, b, c = (torch.randn(3) for _ in range(3))
    graph = gawee.capture(_Keywords(), {"c": c, "a": a, "b": b})
    assert [v.name for v in graph.inputs] == ["c", "a", "b"]  # torch.export's order: the dict's
    module = gawee.compile(_Keywords(), {"a": a, "b": b, "c": c}, options=UNMEASURED)
    torch.testing.assert_close(module(a=a, c=c, b=b)["sum"], a + 2 * b - c)
    torch.testing.assert_close(module(a, b, c)["sum"], a + 2 * b - c)


@pytest.mark.parametrize("example", [3, "x", None, {0: torch.randn(3)}])
def test_other_example_inputs_are_a_capture_error_saying_what_they_must_be(example):
    with pytest.raises(CaptureError, match="example_inputs is a") as caught:
        gawee.capture(torch.nn.Linear(3, 2), example)
    assert "a tuple or list (its positional inputs" in str(caught.value)
    with pytest.raises(CaptureError, match="example_inputs is a"):
        gawee.compile(torch.nn.Linear(3, 2), example)
