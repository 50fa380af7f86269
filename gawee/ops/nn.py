"""Neural-network ops: convolution, linear algebra, normalization, attention, softmax (pooling: ops.pool)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gawee.errors import InferenceError
from gawee.ir.symbolic import broadcast_shapes, has_symbols, prove
from gawee.ir.types import DType, TensorType
from gawee.ops import sampling as S
from gawee.ops.base import (
    AtenBinding,
    Attr,
    OpDef,
    Operand,
    get_op,
    numel,
    out_numel,
    per_element,
    register,
    zero_flops,
)

PURE = frozenset({"pure"})

# The activations a fused node may carry in its `act` attribute, with how many
# `act_params` each takes. A rule may fuse only these (the compiler checks), and the
# torch backend maps each onto oneDNN's fused post-op or runs it unfused.
ACTIVATIONS = {
    "relu": 0,
    "sigmoid": 0,
    "tanh": 0,
    "silu": 0,
    "hardswish": 0,
    "hardsigmoid": 0,
    "gelu": 0,
    "gelu_tanh": 0,
    "hardtanh": 2,
    "leaky_relu": 1,
}


def apply_act(y: torch.Tensor, act: str | None, params: tuple = ()) -> torch.Tensor:
    """Reference semantics of a fused activation: its standalone op (``act_as_op``) run on ``y``, by
    definition (gawee.testing.unfold proves fusion rules from it)."""
    if act is None:
        return y
    n = ACTIVATIONS[act]
    if len(params) != n:
        raise ValueError(f"activation {act} takes {n} parameters, got {len(params)}")
    if y.is_meta and y.is_floating_point():
        return y  # type inference: each of them keeps a float tensor's shape and dtype (and none raises there)
    op, attrs = act_as_op(act, params)
    return get_op(op).evaluate(y, **attrs)  # attributes left out take the evaluator's defaults


def act_as_op(act: str, params: tuple = ()) -> tuple[str, dict]:
    """A fused activation as its standalone op and attributes: ``gelu_tanh`` is ``gelu(approximate="tanh")``."""
    if act == "gelu_tanh":
        return "gelu", {"approximate": "tanh"}
    if act == "hardtanh":
        return "hardtanh", {"min_val": params[0], "max_val": params[1]}
    if act == "leaky_relu":
        return "leaky_relu", {"negative_slope": params[0]}
    return act, {}


def _no_act_params(attrs: dict) -> dict:
    """Canonical epilogue attributes: no activation carries no parameters (apply_act ignores them)."""
    if attrs.get("act") is None:
        attrs["act_params"] = ()
    return attrs


def _pair(v, n=2):
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


# -- convolution ----------------------------------------------------------------------
def _conv_canon(nd):
    def canon(attrs, _types):
        for k in ("stride", "padding", "dilation"):
            attrs[k] = _pair(attrs[k], nd)
        return _no_act_params(attrs) if "act" in attrs else attrs

    return canon


def _conv_flops(ins, outs, attrs):
    # 2 x MACs, bias not counted (as torch.utils.flop_counter); fused epilogues 1/element.
    w = ins[1]
    macs = outs[0].numel * math.prod(w.shape[1:])
    extra = outs[0].numel * int((attrs.get("act") is not None) + (len(ins) > 3 and ins[3] is not None))
    return 2 * macs + extra


def _same_padding(args, types):
    pad = args.get("padding")
    if isinstance(pad, str):
        if pad == "valid":
            args["padding"] = [0] * (types["weight"].rank - 2)
        elif pad == "same":
            k = types["weight"].shape[2:]
            dil = _pair(args.get("dilation", 1), len(k))
            total = [d * (kk - 1) for d, kk in zip(dil, k)]
            if any(t % 2 for t in total):
                return None  # asymmetric padding: not expressible, stays opaque
            args["padding"] = [t // 2 for t in total]
        else:
            return None
    return args


def _from_convolution(nd, transposed):
    def convert(args, types):
        if bool(args.get("transposed")) != transposed or types["weight"].rank != nd + 2:
            return None
        if not transposed and any(args.get("output_padding") or ()):
            return None
        args = dict(args)
        args.pop("transposed", None)
        if not transposed:
            args.pop("output_padding", None)
        return args

    return convert


def _draw_act(draw) -> dict:
    act = draw.choice([None, None, *ACTIVATIONS])
    params: tuple = ()
    if act == "hardtanh":
        params = tuple(sorted((draw.floats(-2, 1), draw.floats(0, 6))))
    elif act == "leaky_relu":
        params = (draw.floats(-1, 1),)
    return {"act": act, "act_params": params}


def _conv_sample(nd: int, fused: bool):
    def sample(draw, slots, attrs):
        x, w = slots[0], slots[1]
        attrs = dict(attrs)
        if isinstance(w, TensorType):
            if w.rank != nd + 2:
                raise S.Reject("weight rank")
            cout, cin_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
        else:
            cout, cin_g, kernel = None, None, None
        groups = attrs.get("groups")
        if isinstance(x, TensorType):
            if x.rank != nd + 2:
                raise S.Reject("input rank")
            cin = x.shape[1]
            if groups is None:
                groups = cin // cin_g if cin_g else draw.choice([g for g in (1, 2, cin) if g > 0 and cin % g == 0])
        else:
            if groups is None:  # grouped convolutions as often as plain ones: where group bugs hide
                groups = draw.choice([1, 2, 3])
            cin = groups * (cin_g or draw.integers(1, 3))
        if groups < 1 or cin % groups or (cin_g is not None and cin_g * groups != cin):
            raise S.Reject("groups")
        if cout is None:
            cout = groups * draw.integers(1, 3)
        if cout % groups:
            raise S.Reject("groups")
        for k, lo, hi in (("stride", 1, 2), ("padding", 0, 1), ("dilation", 1, 2)):
            if k not in attrs:
                attrs[k] = tuple(draw.integers(lo, hi) for _ in range(nd))
        attrs["groups"] = groups
        if kernel is None and isinstance(x, TensorType):  # a kernel that fits the given input (a conv fed by a mul)
            fits = [
                (n + 2 * p - 1) // d + 1
                for n, d, p in zip(x.shape[2:], _pair(attrs["dilation"], nd), _pair(attrs["padding"], nd))
            ]
            kernel = tuple(draw.integers(1, min(k, 3)) for k in fits)
        elif kernel is None:
            kernel = tuple(draw.integers(1, 3) for _ in range(nd))
        if not isinstance(x, TensorType):
            need = [
                (kk - 1) * d + 1 - 2 * p
                for kk, d, p in zip(kernel, _pair(attrs["dilation"], nd), _pair(attrs["padding"], nd))
            ]
            spatial = tuple(max(n, 1) + draw.size(0, 3) for n in need)
            x = TensorType((draw.integers(1, 2), cin, *spatial), draw.dtype)
        if not isinstance(w, TensorType):
            w = TensorType((cout, cin // groups, *kernel), x.dtype)
        bias = slots[2] if slots[2] is not S.FREE else (None if draw.boolean(0.3) else TensorType((cout,), x.dtype))
        types = [x, w, None if bias is S.ABSENT else bias]
        if fused:
            if "act" not in attrs:
                attrs.update({k: v for k, v in _draw_act(draw).items() if k not in attrs})
            res = slots[3]
            if res is S.FREE and draw.boolean(0.3):
                try:
                    res = get_op("conv2d").infer_types([*types, None], {**attrs, "act": None, "act_params": ()})[0]
                except InferenceError as e:
                    raise S.Reject(e.message) from None
            types.append(None if res in (S.FREE, S.ABSENT) else res)
        return types, attrs

    return sample


def conv_low_precision(fn, input, weight, bias, *args):
    """``fn(input, weight, bias, *args)`` (a torch convolution) for every dtype, safe on every CPU.

    f16/bf16 on CPU compute in float32 and round once to the input dtype. Why not torch's own
    low-precision kernels: oneDNN's f16 convolution (torch 2.14.1) segfaults on AVX-512/AMX CPUs
    for valid strided/padded/dilated geometries, and its result depends on the ISA;
    the non-oneDNN path (``mkldnn.flags(enabled=False)``, a process-global switch) rounds partial
    sums to f16/bf16: against float64, its f16 conv_transpose2d differed from the correctly rounded
    result in 41% of the elements with 2.6x the max error (tests/ops/test_conv_low_precision.py
    checks the bound). float32 accumulation then one rounding is within one ulp of the float64
    result (it differs from the correctly rounded one only at rare near-ties), uses only the
    f32 kernels every CPU runs, and is what CUDA's f16 convolutions compute. Mixed dtypes are
    passed through, so torch reports them as before.
    """
    low = input.dtype in (torch.float16, torch.bfloat16)
    if (
        low
        and input.device.type == "cpu"
        and weight.dtype == input.dtype
        and (bias is None or bias.dtype == input.dtype)
    ):
        y = _conv_cpu(fn, input.float(), weight.float(), None if bias is None else bias.float(), *args)
        return y.to(input.dtype)
    return _conv_cpu(fn, input, weight, bias, *args)


def _conv_cpu(fn, input, weight, bias, *args):
    """``fn(...)``; a channels-last CPU input with a spatial dim of size 1 is convolved in NCHW and the result
    put back in channels-last. Such a tensor's strides are ambiguous, and oneDNN's channels-last convolution
    (torch 2.14.1) segfaults on valid geometries over it (a padded, dilated, strided window over a width of
    1); its NCHW convolution does not. Neither the interpreter nor a compiled module's reference kernels may
    take the process down; other inputs keep torch's own choice of kernel."""
    if input.device.type != "cpu" or input.dim() not in (4, 5) or 1 not in input.shape[2:]:
        return fn(input, weight, bias, *args)
    fmt = torch.channels_last if input.dim() == 4 else torch.channels_last_3d
    if input.is_contiguous() or not input.is_contiguous(memory_format=fmt):
        return fn(input, weight, bias, *args)
    return fn(input.contiguous(), weight, bias, *args).contiguous(memory_format=fmt)


def _conv(name: str, nd: int, fused: bool = False, doc: str = "") -> OpDef:
    operands = (Operand("input"), Operand("weight"), Operand("bias", optional=True))
    attrs = (
        Attr("stride", "ints", (1,) * nd),
        Attr("padding", "ints", (0,) * nd),
        Attr("dilation", "ints", (1,) * nd),
        Attr("groups", "int", 1),
    )
    if fused:
        operands += (Operand("residual", optional=True),)
        attrs += (Attr("act", "str?", None), Attr("act_params", "floats", ()))

    def evaluate(
        input, weight, bias=None, residual=None, *, stride, padding, dilation, groups, act=None, act_params=()
    ):
        fn = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
        y = conv_low_precision(fn, input, weight, bias, stride, padding, dilation, groups)
        if residual is not None:
            if residual.shape != y.shape or residual.dtype != y.dtype:
                raise ValueError(
                    f"residual {list(residual.shape)} {residual.dtype} must have the output's shape "
                    f"{list(y.shape)} and dtype {y.dtype}"
                )
            y = y + residual
        return apply_act(y, act, act_params)

    return register(
        OpDef(
            name,
            operands,
            evaluate,
            attrs=attrs,
            traits=PURE,
            flops=_conv_flops,
            canonicalize=_conv_canon(nd),
            sample=_conv_sample(nd, fused),
            aten=(
                f"aten.{name}.default",
                AtenBinding(f"aten.{name}.padding", convert=_same_padding),
                AtenBinding("aten.convolution.default", convert=_from_convolution(nd, False)),
            ),
            doc=doc,
        )
    )


_conv("conv1d", 1)
_conv(
    "conv2d",
    2,
    fused=True,
    doc="act(conv2d(input, weight, bias) + residual): residual and act are optional fused epilogues",
)
_conv("conv3d", 3)


def _convt_flops(ins, outs, attrs):
    x, w = ins[0], ins[1]
    return 2 * x.shape[0] * math.prod(x.shape[2:]) * math.prod(w.shape)


def _conv_transpose_sample(draw, slots, attrs):
    """[N, C_in, H, W] and a [C_in, C_out / groups, kh, kw] weight; output_padding below stride or dilation, as
    torch requires."""
    x, w = slots[0], slots[1]
    attrs = dict(attrs)
    groups = attrs.setdefault("groups", draw.choice([1, 2]) if not isinstance(w, TensorType) else 1)
    if isinstance(w, TensorType):
        if w.rank != 4:
            raise S.Reject("weight rank")
        cin, cout_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
    else:
        cin, cout_g, kernel = (
            groups * draw.integers(1, 2),
            draw.integers(1, 2),
            (draw.integers(1, 3), draw.integers(1, 3)),
        )
    if isinstance(x, TensorType) and (x.rank != 4 or x.shape[1] != cin):
        raise S.Reject("input channels")
    if groups < 1 or cin % groups:
        raise S.Reject("groups")
    for k, lo, hi in (("stride", 1, 2), ("padding", 0, 1), ("dilation", 1, 2)):
        attrs.setdefault(k, (draw.integers(lo, hi), draw.integers(lo, hi)))
    stride, dilation = _pair(attrs["stride"]), _pair(attrs["dilation"])
    attrs.setdefault("output_padding", tuple(draw.integers(0, max(s, d) - 1) for s, d in zip(stride, dilation)))
    if not isinstance(x, TensorType):
        x = TensorType((draw.integers(1, 2), cin, draw.integers(1, 4), draw.integers(1, 4)), draw.dtype)
    if not isinstance(w, TensorType):
        w = TensorType((cin, cout_g, *kernel), x.dtype)
    bias = (
        slots[2] if slots[2] is not S.FREE else (None if draw.boolean(0.3) else TensorType((cout_g * groups,), x.dtype))
    )
    return [x, w, None if bias is S.ABSENT else bias], attrs


register(
    OpDef(
        "conv_transpose2d",
        (Operand("input"), Operand("weight"), Operand("bias", optional=True)),
        lambda input, weight, bias=None, *, stride, padding, output_padding, groups, dilation: conv_low_precision(
            F.conv_transpose2d, input, weight, bias, stride, padding, output_padding, groups, dilation
        ),
        attrs=(
            Attr("stride", "ints", (1, 1)),
            Attr("padding", "ints", (0, 0)),
            Attr("output_padding", "ints", (0, 0)),
            Attr("groups", "int", 1),
            Attr("dilation", "ints", (1, 1)),
        ),
        traits=PURE,
        flops=_convt_flops,
        sample=_conv_transpose_sample,
        canonicalize=lambda a, t: {
            **a,
            **{k: _pair(a[k]) for k in ("stride", "padding", "output_padding", "dilation")},
        },
        aten=(
            "aten.conv_transpose2d.input",
            AtenBinding("aten.convolution.default", convert=_from_convolution(2, True)),
        ),
    )
)


# -- linear algebra -------------------------------------------------------------------
def _contract_flops(ins, outs, attrs):
    """2 x MACs of a (batched) matrix product: out elements x the contracted size."""
    return 2 * outs[0].numel * ins[0].shape[-1]


def _linear_sample(draw, slots, attrs):
    x, w, b = slots
    if isinstance(x, TensorType) and x.rank == 0:
        raise S.Reject("linear needs rank >= 1")
    if isinstance(w, TensorType) and w.rank != 2:
        raise S.Reject("linear needs a 2-D weight")
    k = x.shape[-1] if isinstance(x, TensorType) else (w.shape[1] if isinstance(w, TensorType) else draw.integers(1, 4))
    if isinstance(w, TensorType) and w.shape[1] != k:
        raise S.Reject(f"linear: input features {k}, weight {w}")
    if not isinstance(x, TensorType):
        x = TensorType((*S.shape(draw, draw.integers(0, 3)), k), draw.dtype)
    if not isinstance(w, TensorType):
        w = TensorType((draw.integers(1, 4), k), x.dtype)
    if b is S.FREE:  # absent, per feature, or a scalar (F.linear broadcasts the bias)
        b = draw.choice([None, TensorType((w.shape[0],), x.dtype), TensorType((w.shape[0],), x.dtype)])
        if b is not None and draw.boolean(0.1):
            b = TensorType((), x.dtype)
    if "act" not in attrs:
        attrs = {**attrs, **{k: v for k, v in _draw_act(draw).items() if k not in attrs}}
    return [x, w, None if b is S.ABSENT else b], attrs


def _batch_like(draw, batch: tuple[int, ...]) -> tuple[int, ...]:
    """Batch dims that broadcast against ``batch``: the same, fewer, size-1 ones, or more."""
    kind = draw.choice(["same", "same", "fewer", "ones", "more"])
    if kind == "fewer":
        return batch[draw.integers(0, len(batch)) :]
    if kind == "ones":
        return tuple(1 if draw.boolean() else d for d in batch)
    if kind == "more":
        return (draw.integers(1, 3), *batch) if len(batch) < 3 else batch
    return batch


def _matmul_sample(draw, slots, attrs):
    """Every shape combination of torch.matmul: vectors, matrices, batched with broadcasting."""
    a, b = slots
    for t in (a, b):
        if isinstance(t, TensorType) and t.rank == 0:
            raise S.Reject("matmul needs rank >= 1")
    if not isinstance(a, TensorType):
        if isinstance(b, TensorType):
            k = b.shape[-2] if b.rank >= 2 else b.shape[0]
            dtype = b.dtype
            batch = _batch_like(draw, b.shape[:-2])
        else:
            k, dtype, batch = draw.integers(1, 4), draw.dtype, S.shape(draw, draw.integers(0, 2))
        rank = draw.choice([1, 2, 2, 3])
        a = TensorType((k,) if rank == 1 else (*batch, draw.integers(1, 4), k), dtype)
    if not isinstance(b, TensorType):
        k = a.shape[-1]
        if draw.boolean(0.2):
            b = TensorType((k,), a.dtype)
        else:
            b = TensorType((*_batch_like(draw, a.shape[:-2]), k, draw.integers(1, 4)), a.dtype)
    return [a, b], attrs


def _mm_sample(batched: bool, extra: bool):
    """mm / bmm (``batched``), and addmm / baddbmm (``extra``: a broadcasting first operand)."""

    def sample(draw, slots, attrs):
        slots = list(slots)
        c = slots.pop(0) if extra else None
        a, b = slots
        rank = 3 if batched else 2
        for t in (a, b):
            if isinstance(t, TensorType) and t.rank != rank:
                raise S.Reject(f"needs rank {rank}")
        batch = (
            (a.shape[0],)
            if isinstance(a, TensorType) and batched
            else ((b.shape[0],) if isinstance(b, TensorType) and batched else S.shape(draw, 1) if batched else ())
        )
        if not isinstance(a, TensorType):
            k = b.shape[-2] if isinstance(b, TensorType) else draw.integers(1, 4)
            a = TensorType((*batch, draw.integers(1, 4), k), b.dtype if isinstance(b, TensorType) else draw.dtype)
        if not isinstance(b, TensorType):
            b = TensorType((*batch, a.shape[-1], draw.integers(1, 4)), a.dtype)
        types = [a, b]
        if extra:
            out = TensorType((*batch, a.shape[-2], b.shape[-1]), a.dtype)
            bias = TensorType(out.shape[-1:], out.dtype)  # the usual addmm(bias, x, w): one per output column
            types.insert(0, c if isinstance(c, TensorType) else draw.choice([bias, S.broadcast_partner(draw, out)]))
            attrs = {"beta": draw.choice([1, 1, 0, 0.5]), "alpha": draw.choice([1, 1, 2.0]), **attrs}
        return types, attrs

    return sample


def _sdpa_sample(draw, slots, attrs):
    """(batch..., L, E) queries, (batch..., S, E) keys, (batch..., S, Ev) values, an optional mask."""
    q, k, v, m = slots
    fixed = [t for t in (q, k, v) if isinstance(t, TensorType)]
    if any(t.rank < 2 for t in fixed):
        raise S.Reject("attention needs rank >= 2")
    ref = fixed[0] if fixed else None
    batch = ref.shape[:-2] if ref is not None else S.shape(draw, draw.integers(0, 2))
    dtype = ref.dtype if ref is not None else draw.dtype
    e = q.shape[-1] if isinstance(q, TensorType) else k.shape[-1] if isinstance(k, TensorType) else draw.integers(1, 4)
    length = q.shape[-2] if isinstance(q, TensorType) else draw.integers(1, 4)
    src = (
        k.shape[-2] if isinstance(k, TensorType) else v.shape[-2] if isinstance(v, TensorType) else draw.integers(1, 4)
    )
    q = q if isinstance(q, TensorType) else TensorType((*batch, length, e), dtype)
    k = k if isinstance(k, TensorType) else TensorType((*batch, src, e), dtype)
    v = v if isinstance(v, TensorType) else TensorType((*batch, src, draw.integers(1, 4)), dtype)
    if m is S.FREE:
        mask = TensorType((length, src), draw.choice([dtype, DType.bool]))
        m = None if draw.boolean(0.5) else S.broadcast_partner(draw, mask)
    attrs = {"is_causal": draw.boolean(0.3) and m is None, "scale": draw.choice([None, None, 0.5]), **attrs}
    return [q, k, v, None if m is S.ABSENT else m], attrs


def _linear(input, weight, bias=None, *, act=None, act_params=()):
    return apply_act(F.linear(input, weight, bias), act, act_params)


def _linear_flops(ins, outs, attrs):
    return _contract_flops(ins, outs, attrs) + outs[0].numel * int(attrs.get("act") is not None)


register(
    OpDef(
        "linear",
        (Operand("input"), Operand("weight"), Operand("bias", optional=True)),
        _linear,
        attrs=(Attr("act", "str?", None), Attr("act_params", "floats", ())),
        traits=PURE,
        canonicalize=lambda attrs, _types: _no_act_params(attrs),
        flops=_linear_flops,
        sample=_linear_sample,
        aten=("aten.linear.default",),
        doc="act(input @ weight.T + bias): act is an optional fused epilogue",
    )
)
register(
    OpDef(
        "matmul",
        (Operand("self"), Operand("other")),
        torch.matmul,
        traits=PURE,
        flops=_contract_flops,
        sample=_matmul_sample,
        aten=("aten.matmul.default",),
        doc="numpy-style matmul with broadcasting",
    )
)
register(
    OpDef(
        "mm",
        (Operand("self"), Operand("mat2")),
        torch.mm,
        traits=PURE,
        flops=_contract_flops,
        sample=_mm_sample(False, False),
        aten=("aten.mm.default",),
    )
)
register(
    OpDef(
        "bmm",
        (Operand("self"), Operand("mat2")),
        torch.bmm,
        traits=PURE,
        flops=_contract_flops,
        sample=_mm_sample(True, False),
        aten=("aten.bmm.default",),
    )
)
register(
    OpDef(
        "addmm",
        (Operand("self"), Operand("mat1"), Operand("mat2")),
        lambda self, mat1, mat2, beta=1, alpha=1: torch.addmm(self, mat1, mat2, beta=beta, alpha=alpha),
        attrs=(Attr("beta", "scalar", 1), Attr("alpha", "scalar", 1)),
        traits=PURE,
        sample=_mm_sample(False, True),
        flops=lambda ins, outs, a: 2 * outs[0].numel * ins[1].shape[-1],
        aten=("aten.addmm.default",),
        doc="beta * self + alpha * (mat1 @ mat2)",
    )
)


def _baddbmm_shape(types, attrs):
    """[b, n, m] @ [b, m, p] -> [b, n, p], which self must broadcast to without growing it (torch's kernel
    pins the batch of a 0-d self)."""
    x, a, b = types
    if a.rank != 3 or b.rank != 3 or prove(a.shape[0], "==", b.shape[0]) is not True:
        raise ValueError("batch1 and batch2 must be 3-D with one batch size")
    if prove(a.shape[2], "==", b.shape[1]) is not True:
        raise ValueError(f"batch1's columns {a.shape[2]} must be batch2's rows {b.shape[1]}")
    out = (a.shape[0], a.shape[1], b.shape[2])
    if broadcast_shapes(x.shape, out) != out:
        raise ValueError(f"self {list(x.shape)} does not broadcast to {list(out)}")
    return [out]


register(
    OpDef(
        "baddbmm",
        (Operand("self"), Operand("batch1"), Operand("batch2")),
        lambda self, batch1, batch2, beta=1, alpha=1: torch.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha),
        attrs=(Attr("beta", "scalar", 1), Attr("alpha", "scalar", 1)),
        traits=PURE,
        shape_formula=_baddbmm_shape,
        sample=_mm_sample(True, True),
        flops=lambda ins, outs, a: 2 * outs[0].numel * ins[1].shape[-1],
        aten=("aten.baddbmm.default",),
    )
)


def _einsum_flops(ins, outs, attrs):
    eq = attrs["equation"].replace(" ", "")
    lhs = eq.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, t in zip(lhs, ins):
        letters = [c for c in term if c.isalpha()]
        dims = t.shape[len(t.shape) - len(letters) :] if "..." in term else t.shape
        for c, d in zip(letters, dims):
            sizes[c] = max(sizes.get(c, 1), d)
    total = math.prod(sizes.values())
    if "..." in eq:
        total *= outs[0].numel // max(1, math.prod(sizes[c] for c in eq.split("->")[-1] if c.isalpha()))
    return 2 * total if len(ins) > 1 else numel(ins[0])


register(
    OpDef(
        "einsum",
        (Operand("tensors", variadic=True),),
        lambda *tensors, equation: torch.einsum(equation, *tensors),
        attrs=(Attr("equation", "str"),),
        traits=PURE,
        flops=_einsum_flops,
        aten=(AtenBinding("aten.einsum.default", drop=frozenset({"path"})),),
        doc="Einstein summation; FLOPs counted as 2 x the full index space (naive evaluation)",
    )
)


# -- normalization ----------------------------------------------------------------------
def _bn_sample(draw, slots, attrs):
    x = slots[0]
    if not isinstance(x, TensorType):
        x = S.tensor(draw, draw.rank(2, 4))
    if x.rank < 2:
        raise S.Reject("batch_norm needs rank >= 2")
    c = TensorType((x.shape[1],), x.dtype)
    types = [x] + [
        None
        if s is S.ABSENT or (s is S.FREE and opt and draw.boolean(0.2))
        else (s if isinstance(s, TensorType) else c)
        for s, opt in zip(slots[1:], (True, True, False, False))
    ]
    return types, {"eps": draw.choice([1e-5, 1e-3, 0.1]), **attrs}


def _embedding_sample(draw, slots, attrs):
    """A [rows, width] table with rows to spare for the drawn ids; padding_idx none or a row."""
    weight = slots[0] if isinstance(slots[0], TensorType) else TensorType((S.INDEXED, draw.integers(1, 4)), draw.dtype)
    if weight.rank != 2:
        raise S.Reject("embedding takes a 2-D table")
    ids = slots[1] if isinstance(slots[1], TensorType) else S.indices(draw)
    rows = weight.shape[0] if isinstance(weight.shape[0], int) else S.INDEXED
    return [weight, ids], {"padding_idx": draw.choice([-1, draw.integers(0, rows - 1)]), **attrs}


def _gn_sample(draw, slots, attrs):
    """[N, C, *] with num_groups dividing C; per-channel weight and bias, each maybe absent."""
    x = slots[0]
    if not isinstance(x, TensorType):
        x = S.tensor(draw, draw.rank(2, 4))
    if x.rank < 2 or has_symbols(x.shape[1:2]) or not x.shape[1]:
        raise S.Reject("group_norm needs rank >= 2 and a known, nonzero channel count")
    groups = attrs.get("num_groups") or draw.choice([g for g in range(1, x.shape[1] + 1) if x.shape[1] % g == 0])
    c = TensorType((x.shape[1],), x.dtype)
    types = [x] + [None if s is S.ABSENT or (s is S.FREE and draw.boolean(0.2)) else c for s in slots[1:]]
    return types, {"eps": draw.choice([1e-5, 1e-3, 0.1]), **attrs, "num_groups": groups}


def _ln_sample(draw, slots, attrs):
    x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.rank(1, 4))
    if x.rank == 0:
        raise S.Reject("layer_norm needs rank >= 1")
    attrs = dict(attrs)
    if "normalized_shape" not in attrs:
        attrs["normalized_shape"] = x.shape[x.rank - draw.integers(1, x.rank) :]
    norm = TensorType(tuple(attrs["normalized_shape"]), x.dtype)
    types = [x] + [
        None if s is S.ABSENT or (s is S.FREE and draw.boolean(0.2)) else (s if isinstance(s, TensorType) else norm)
        for s in slots[1:]
    ]
    return types, {"eps": draw.choice([1e-5, 1e-3]), **attrs}


register(
    OpDef(
        "batch_norm",
        (
            Operand("input"),
            Operand("weight", optional=True),
            Operand("bias", optional=True),
            Operand("running_mean"),
            Operand("running_var", domain="nonnegative"),
        ),
        lambda input, weight, bias, running_mean, running_var, *, eps: F.batch_norm(
            input, running_mean, running_var, weight, bias, False, 0.0, eps
        ),
        attrs=(Attr("eps", "float", 1e-5),),
        traits=PURE,
        flops=per_element(2),
        sample=_bn_sample,
        aten=(
            AtenBinding(
                "aten._native_batch_norm_legit_no_training.default", drop=frozenset({"momentum"}), outputs=(0,)
            ),
            AtenBinding(
                "aten.batch_norm.default", fixed={"training": False}, drop=frozenset({"momentum", "cudnn_enabled"})
            ),
        ),
        doc="inference batch norm: (x - mean) / sqrt(var + eps) * weight + bias, per channel (dim 1)",
    )
)


def batch_stats_dtype(t: torch.dtype) -> torch.dtype:
    """The dtype of batch_norm_training's mean and rstd: float32 for f16/bf16 inputs (ATen's meta and CUDA
    kernels; its CPU kernel returns the input's dtype), else the input's."""
    return torch.float32 if t in (torch.float16, torch.bfloat16) else t


def _batch_norm_training(input, weight=None, bias=None, *, eps):
    out, mean, rstd = torch.ops.aten._native_batch_norm_legit.no_stats(input, weight, bias, True, 0.0, eps)
    stats = batch_stats_dtype(input.dtype)
    return out, mean.to(stats), rstd.to(stats)


def _bn_training_sample(draw, slots, attrs):
    """[N, C, *] of rank 2-4 with per-channel weight and bias, each maybe absent."""
    x = slots[0] if isinstance(slots[0], TensorType) else S.tensor(draw, draw.integers(2, 4))
    if x.rank < 2 or not x.dtype.is_float:
        raise S.Reject("batch_norm_training needs a float tensor of rank >= 2")
    c = TensorType((x.shape[1],), x.dtype)
    types = [x] + [
        None if s is S.ABSENT or (s is S.FREE and draw.boolean(0.2)) else (s if isinstance(s, TensorType) else c)
        for s in slots[1:]
    ]
    return types, {"eps": draw.choice([1e-6, 1e-5, 1e-3]), **attrs}


register(
    OpDef(
        "batch_norm_training",
        (Operand("input"), Operand("weight", optional=True), Operand("bias", optional=True)),
        _batch_norm_training,
        attrs=(Attr("eps", "float", 1e-5),),
        traits=frozenset({"pure", "multi_output"}),
        flops=per_element(5),
        sample=_bn_training_sample,
        aten=(
            AtenBinding(
                "aten._native_batch_norm_legit.no_stats", fixed={"training": True}, drop=frozenset({"momentum"})
            ),
            AtenBinding(
                "aten.batch_norm.default",
                fixed={"training": True, "running_mean": None, "running_var": None},
                drop=frozenset({"momentum", "cudnn_enabled"}),
                outputs=(0,),
            ),
        ),
        doc="batch norm by the batch's own statistics (training mode, no running statistics), per channel (dim 1) "
        "over every other dim: outputs (x - mean) * rstd * weight + bias, the mean, and rstd = 1 / sqrt(var + eps) "
        "(biased variance; f16/bf16 statistics in float32). Weight standardization (timm's StdConv2d, NFNets) "
        "computes it on constant weights, so constant folding removes it",
    )
)
register(
    OpDef(
        "layer_norm",
        (Operand("input"), Operand("weight", optional=True), Operand("bias", optional=True)),
        lambda input, weight=None, bias=None, *, normalized_shape, eps: F.layer_norm(
            input, normalized_shape, weight, bias, eps
        ),
        attrs=(Attr("normalized_shape", "ints"), Attr("eps", "float", 1e-5)),
        traits=PURE,
        flops=per_element(5),
        sample=_ln_sample,
        aten=(AtenBinding("aten.layer_norm.default", drop=frozenset({"cudnn_enable"})),),
    )
)
register(
    OpDef(
        "rms_norm",
        (Operand("input"), Operand("weight", optional=True)),
        lambda input, weight=None, *, normalized_shape, eps: F.rms_norm(input, normalized_shape, weight, eps),
        attrs=(Attr("normalized_shape", "ints"), Attr("eps", "float?", None)),
        traits=PURE,
        flops=per_element(4),
        sample=_ln_sample,
        aten=("aten.rms_norm.default",),
        doc="x / sqrt(mean(x^2) + eps) * weight over the trailing normalized_shape dims; f16/bf16 compute in "
        "float32 and round once (eps None: float32's machine epsilon for them, else the dtype's); T5's and "
        "Llama's RMSNorm",
    )
)
register(
    OpDef(
        "group_norm",
        (Operand("input"), Operand("weight", optional=True), Operand("bias", optional=True)),
        lambda input, weight=None, bias=None, *, num_groups, eps: F.group_norm(input, num_groups, weight, bias, eps),
        attrs=(Attr("num_groups", "int"), Attr("eps", "float", 1e-5)),
        traits=PURE,
        flops=per_element(5),
        sample=_gn_sample,
        aten=(AtenBinding("aten.group_norm.default", drop=frozenset({"cudnn_enabled"})),),
    )
)


# -- attention, softmax -------------------------------------------------------------------
def _sdpa(query, key, value, attn_mask=None, *, dropout_p, is_causal, scale, enable_gqa):
    if enable_gqa and min(query.dim(), key.dim(), value.dim()) >= 3:
        heads = {query.shape[-3], key.shape[-3], value.shape[-3]}
        if len(heads) > 1 and 0 in (key.shape[-3], value.shape[-3]):
            # torch takes the query's heads modulo theirs: SIGFPE, the process dies (on meta tensors too)
            raise ValueError("grouped-query attention needs a key and a value of at least one head")
    kwargs = {"enable_gqa": True} if enable_gqa else {}
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kwargs)


def _sdpa_flops(ins, outs, attrs):
    q, k, v = ins[0], ins[1], ins[2]
    batch = math.prod(q.shape[:-2])
    length, e = q.shape[-2], q.shape[-1]
    s, ev = k.shape[-2], v.shape[-1]
    return 2 * batch * length * s * e + 2 * batch * length * s * ev


def _sdpa_shape(types, attrs):
    """[..., L, E], [..., S, E], [..., S, Ev] -> [..., L, Ev] (batch dims broadcast; a mask must broadcast
    to [..., L, S]); torch's math kernel fails on a 0-d mask beside a symbolic batch."""
    q, k, v, mask = types
    if attrs["enable_gqa"] or min(q.rank, k.rank, v.rank) < 2:
        raise ValueError("no formula for grouped-query or 1-D attention")
    if prove(q.shape[-1], "==", k.shape[-1]) is not True or prove(k.shape[-2], "==", v.shape[-2]) is not True:
        raise ValueError("query/key widths or key/value lengths differ for some sizes")
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        scores = (*batch, q.shape[-2], k.shape[-2])
        if broadcast_shapes(mask.shape, scores) != scores:
            raise ValueError(f"the mask {list(mask.shape)} does not broadcast to the scores {list(scores)}")
    return [(*batch, q.shape[-2], v.shape[-1])]


register(
    OpDef(
        "scaled_dot_product_attention",
        (Operand("query"), Operand("key"), Operand("value"), Operand("attn_mask", optional=True)),
        _sdpa,
        attrs=(
            Attr("dropout_p", "float", 0.0),
            Attr("is_causal", "bool", False),
            Attr("scale", "float?", None),
            Attr("enable_gqa", "bool", False),
        ),
        traits=PURE,
        flops=_sdpa_flops,
        shape_formula=_sdpa_shape,
        sample=_sdpa_sample,
        aten=("aten.scaled_dot_product_attention.default",),
        doc="softmax(q @ k.T * scale + mask) @ v; FLOPs: the two matrix products (as flop_counter)",
    )
)

for _name, _fn in [("softmax", F.softmax), ("log_softmax", F.log_softmax)]:
    register(
        OpDef(
            _name,
            (Operand("self"),),
            (lambda fn: lambda self, *, dim: fn(self, dim))(_fn),
            attrs=(Attr("dim", "int"),),
            traits=PURE,
            flops=per_element(5),
            sample=lambda d, sl, a: (lambda t: ([t], {"dim": S.dim(d, max(t.rank, 1)), **a}))(
                S.same_as_input(d, sl, a)
            ),
            aten=(
                AtenBinding(f"aten.{_name}.int", fixed={"dtype": None}),
                AtenBinding(f"aten._{_name}.default", fixed={"half_to_float": False}),
            ),
        )
    )

register(
    OpDef(
        "dropout",
        (Operand("input"),),
        lambda input, *, p, train: F.dropout(input, p, training=train),
        attrs=(Attr("p", "float", 0.5), Attr("train", "bool", False)),
        traits=frozenset(),
        sample=lambda d, sl, a: (
            [S.same_as_input(d, sl, a)],
            {"p": d.choice([0.0, 0.1, 0.5]), "train": d.boolean(0.3), **a},
        ),
        flops=out_numel,
        aten=("aten.dropout.default",),
        doc="not pure: random when train; the identity when not train",
    )
)

register(
    OpDef(
        "embedding",
        (Operand("weight"), Operand("indices", domain="nonnegative")),
        lambda weight, indices, *, padding_idx: F.embedding(indices, weight, padding_idx if padding_idx >= 0 else None),
        attrs=(Attr("padding_idx", "int", -1),),
        traits=PURE,
        flops=zero_flops,
        sample=_embedding_sample,
        aten=(AtenBinding("aten.embedding.default", fixed={"scale_grad_by_freq": False, "sparse": False}),),
    )
)

register(
    OpDef(
        "upsample_nearest2d",
        (Operand("input"),),
        lambda input, *, output_size, scale_factors: torch.ops.aten.upsample_nearest2d.vec(
            input, output_size, scale_factors
        ),
        attrs=(Attr("output_size", "ints?", None), Attr("scale_factors", "floats?", None)),
        traits=PURE,
        flops=zero_flops,
        aten=("aten.upsample_nearest2d.vec",),
    )
)
register(
    OpDef(
        "upsample_bilinear2d",
        (Operand("input"),),
        lambda input, *, output_size, align_corners, scale_factors: torch.ops.aten.upsample_bilinear2d.vec(
            input, output_size, align_corners, scale_factors
        ),
        attrs=(
            Attr("output_size", "ints?", None),
            Attr("align_corners", "bool", False),
            Attr("scale_factors", "floats?", None),
        ),
        traits=PURE,
        flops=per_element(4),
        aten=("aten.upsample_bilinear2d.vec",),
    )
)
