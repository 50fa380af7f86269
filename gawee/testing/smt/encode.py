"""SMT encodings of element terms (z3): IEEE floats in the term's dtype, bit-vectors for integers.

``ENCODINGS`` holds one encoding per op whose torch semantics is exact IEEE (or wrap-around integer)
arithmetic — Alive2's ``toSMT``, kept in the testing layer beside the ops' own reference semantics.
``exact(op, ...)`` says whether a node can use it (dtypes as the encoding expects); every other
elementwise op is an uninterpreted function (``uf`` terms), constrained only by ``AXIOMS``: facts
about torch's kernel that tests/testing/test_smt_encode.py checks against torch itself.

Choices that follow torch's CPU kernels (each checked by the same tests):
  * f16/bf16 arithmetic is computed in float32 and rounded once: for +, -, *, / that is the
    correctly rounded f16/bf16 result (float32 has more than 2p + 2 bits), so it is encoded in the
    narrow format directly;
  * sqrt is not encoded: torch's float32 sqrt is not correctly rounded (sqrt(3e38) is one unit in the
    last place above IEEE's), so it is an uninterpreted function like the transcendentals;
  * a cast from f64 or from an integer to f16/bf16 rounds through float32 (twice), as torch does;
  * a cast from float to an integer truncates; nan, inf and values out of range give a platform-defined
    result in torch, encoded as an open ``choice`` (so no proof may rely on it);
  * ``maximum``/``minimum`` propagate nan; which zero they return for (+0, -0) differs between torch's
    scalar and vector loops, so it is an open ``choice`` too;
  * integer +, -, *, neg wrap around (two's complement), as torch's kernels do on every CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from gawee.ir.types import DType
from gawee.testing.smt.terms import NAN_KEY, Term, from_bits

FLOATS = (DType.f16, DType.bf16, DType.f32, DType.f64)
INTS = (DType.i8, DType.i16, DType.i32, DType.i64, DType.u8)

_FP_BITS = {DType.f16: (5, 11), DType.bf16: (8, 8), DType.f32: (8, 24), DType.f64: (11, 53)}


def z3mod():
    """The z3 module, imported on first use (``import gawee`` does not load the solver)."""
    import z3

    return z3


@contextmanager
def fresh_context():
    """Make every z3 term and solver inside the block in a new z3 context (z3's Python API makes them in
    its main context unless each call is given one). What z3 spends on a query depends on the terms made
    before it in the context (their ids order its simplifier's and bit-blaster's work): in one shared
    context, whether a query finished within its resource limit depended on the queries the process had
    asked before it. A context per query makes the verdict a function of the query alone."""
    import z3.z3 as api

    saved = api._main_ctx  # the API's default context: it has no setter
    api._main_ctx = api.Context()
    try:
        yield
    finally:
        api._main_ctx = saved


def sort(dtype: DType):
    """The z3 sort of one element of ``dtype``."""
    z3 = z3mod()
    if dtype.is_float:
        return z3.FPSort(*_FP_BITS[dtype])
    if dtype is DType.bool:
        return z3.BoolSort()
    return z3.BitVecSort(dtype.itemsize * 8)


def literal(dtype: DType, key: Any):
    """The z3 value of a const term's key (see ``Term.key``)."""
    z3 = z3mod()
    if dtype.is_float:
        if key == NAN_KEY:
            return z3.fpNaN(sort(dtype))
        width = dtype.itemsize * 8
        return z3.simplify(z3.fpBVToFP(z3.BitVecVal(key % (1 << width), width), sort(dtype)))
    if dtype is DType.bool:
        return z3.BoolVal(bool(key))
    return z3.BitVecVal(key % (1 << (dtype.itemsize * 8)), dtype.itemsize * 8)


def value_of(dtype: DType, v) -> float | int | bool:
    """A z3 model value of an element of ``dtype`` as a Python number."""
    z3 = z3mod()
    if dtype.is_float:
        if v.isNaN():
            return float("nan")
        bits = z3.simplify(z3.fpToIEEEBV(v)).as_long()
        return from_bits(dtype, bits)
    if dtype is DType.bool:
        return z3.is_true(v)
    n = v.as_long()
    width = dtype.itemsize * 8
    return n - (1 << width) if dtype is not DType.u8 and n >= 1 << (width - 1) else n


def equal(dtype: DType, a, b):
    """The harness's notion of two equal elements: the same number (+0 == -0), or both nan."""
    z3 = z3mod()
    if dtype.is_float:
        return z3.Or(z3.fpEQ(a, b), z3.And(z3.fpIsNaN(a), z3.fpIsNaN(b)))
    return a == b


def far_apart(dtype: DType, a, b, tolerance: float):
    """a and b differ by more than the harness could forgive on their own: nan or inf on one side only,
    or finite and apart by more than ``tolerance`` x max(1, |b|) (computed in float64). Used to search
    for counterexamples once equality fails (a model of mere rounding differences replays as sound)."""
    z3 = z3mod()
    if not dtype.is_float:
        return a != b
    wide = sort(DType.f64)
    a64, b64 = z3.fpToFP(_rne(), a, wide), z3.fpToFP(_rne(), b, wide)
    gap = z3.fpAbs(z3.fpSub(_rne(), a64, b64))
    scale = z3.fpMax(z3.FPVal(1.0, wide), z3.fpAbs(b64))
    finite = z3.And(*[z3.Not(z3.Or(z3.fpIsNaN(x), z3.fpIsInf(x))) for x in (a, b)])
    return z3.Or(
        z3.fpIsNaN(a) != z3.fpIsNaN(b),
        z3.And(z3.fpIsInf(a) != z3.fpIsInf(b), z3.Not(z3.fpIsNaN(a)), z3.Not(z3.fpIsNaN(b))),
        z3.And(finite, z3.fpGT(gap, z3.fpMul(_rne(), z3.FPVal(tolerance, wide), scale))),
    )


# -- the encodings ---------------------------------------------------------------------------
Encoding = Callable[[list, list[DType], DType, dict], Any]
"""encode(args as z3 terms, their dtypes, the result dtype, attrs) -> the result as a z3 term."""

ENCODINGS: dict[str, Encoding] = {}
"""Op name -> its exact encoding (used where ``exact`` allows it)."""


def _rne():
    return z3mod().RNE()


def _fp_or_int(fp: Callable, bv: Callable | None = None) -> Encoding:
    def encode(args, dtypes, out, attrs):
        return fp(*args) if out.is_float else bv(*args)

    return encode


def _register(name: str, encoding: Encoding) -> None:
    ENCODINGS[name] = encoding


def _zero(dtype: DType, negative: bool = False):
    z3 = z3mod()
    return z3.fpMinusZero(sort(dtype)) if negative else z3.fpPlusZero(sort(dtype))


def _num(dtype: DType, x: float):
    z3 = z3mod()
    return z3.FPVal(x, sort(dtype)) if dtype.is_float else z3.BitVecVal(int(x), dtype.itemsize * 8)


def _lt(dtype: DType, a, b):
    z3 = z3mod()
    if dtype.is_float:
        return z3.fpLT(a, b)
    return z3.ULT(a, b) if dtype is DType.u8 else a < b


def _relu(args, dtypes, out, attrs):
    z3 = z3mod()
    (a,) = args
    # torch's relu is clamp_min(x, 0): x where it is not below 0 (nan and -0 pass through)
    return z3.If(_lt(out, a, _num(out, 0)), _zero(out) if out.is_float else _num(out, 0), a)


def _abs(args, dtypes, out, attrs):
    z3 = z3mod()
    (a,) = args
    if out.is_float:
        return z3.fpAbs(a)
    return a if out is DType.u8 else z3.If(a < 0, -a, a)


def _extremum(largest: bool) -> Encoding:
    def encode(args, dtypes, out, attrs):
        z3 = z3mod()
        a, b, pick_a = args
        if not out.is_float:
            first = _lt(out, b, a) if largest else _lt(out, a, b)
            return z3.If(first, a, b)
        nan = z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b))
        a_wins = z3.fpGT(a, b) if largest else z3.fpLT(a, b)
        b_wins = z3.fpGT(b, a) if largest else z3.fpLT(b, a)
        # equal and not nan: the same number, or two zeros of either sign (torch's loops differ there)
        return z3.If(nan, z3.fpNaN(sort(out)), z3.If(a_wins, a, z3.If(b_wins, b, z3.If(pick_a, a, b))))

    return encode


def _compare(fp: str, signed: str, unsigned: str) -> Encoding:
    def encode(args, dtypes, out, attrs):
        z3 = z3mod()
        a, b = args
        if dtypes[0].is_float:
            return getattr(z3, fp)(a, b)
        if dtypes[0] is DType.u8:
            return getattr(z3, unsigned)(a, b)
        return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[signed]

    return encode


def _fmod(a, b, dtype: DType):
    """C's fmod (the remainder of the truncated quotient, with a's sign). Where the truncated quotient
    n is below 2^p (p the significand bits), RTZ(a / b) truncates to n exactly and a - n * b (the
    remainder, always representable) is one exact fused multiply-add. Larger quotients go to an
    uninterpreted function of (a, b): fmod is a function, so equal operands still give equal results,
    and IEEE's remainder operation (exact, but costly for a solver) is never needed."""
    z3 = z3mod()
    s = sort(dtype)
    n = z3.fpRoundToIntegral(z3.RTZ(), z3.fpDiv(z3.RTZ(), a, b))
    small = z3.fpLT(z3.fpAbs(n), z3.FPVal(2.0 ** s.sbits(), s))
    r = z3.fpFMA(_rne(), z3.fpNeg(n), b, a)
    wide = z3.Function(f"fmod_{dtype.value}", s, s, s)(a, b)
    zero = z3.If(z3.fpIsNegative(a), _zero(dtype, True), _zero(dtype))
    r = z3.If(small, z3.If(z3.fpIsZero(r), zero, r), wide)
    special = z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b), z3.fpIsInf(a), z3.fpIsZero(b))
    keeps_a = z3.And(z3.fpIsInf(b), z3.Not(special))  # fmod(a, ±inf) = a, fmod(±0, b) = ±0
    return z3.If(special, z3.fpNaN(s), z3.If(z3.Or(keeps_a, z3.fpIsZero(a)), a, r))


def _floor_divide_fp(a, b, dtype: DType):
    """torch's div_floor_floating (c10/util/generic_math.h), step by step in ``dtype``."""
    z3 = z3mod()
    rne = _rne()
    one = z3.FPVal(1.0, sort(dtype))
    quotient = z3.fpDiv(rne, a, b)
    mod = _fmod(a, b, dtype)
    div = z3.fpDiv(rne, z3.fpSub(rne, a, mod), b)
    adjust = z3.And(z3.Not(z3.fpEQ(mod, _zero(dtype))), z3.fpLT(b, _zero(dtype)) != z3.fpLT(mod, _zero(dtype)))
    div = z3.If(adjust, z3.fpSub(rne, div, one), div)
    floor = z3.fpRoundToIntegral(z3.RTN(), div)
    floor = z3.If(z3.fpGT(z3.fpSub(rne, div, floor), z3.FPVal(0.5, sort(dtype))), z3.fpAdd(rne, floor, one), floor)
    signed_zero = z3.If(z3.fpIsNegative(quotient), _zero(dtype, True), _zero(dtype))
    result = z3.If(z3.Not(z3.fpEQ(div, _zero(dtype))), floor, signed_zero)
    return z3.If(z3.fpEQ(b, _zero(dtype)), quotient, result)


def _in_opmath(fn: Callable, dtype: DType):
    """``fn`` computed as torch's CPU kernels compute f16/bf16: in float32, rounded once at the end."""
    z3 = z3mod()
    if dtype not in (DType.f16, DType.bf16):
        return fn
    wide = sort(DType.f32)

    def run(*args):
        up = [z3.fpToFP(_rne(), a, wide) for a in args]
        return z3.fpToFP(_rne(), fn(*up, DType.f32), sort(dtype))

    return lambda *args: run(*args)


def _div(args, dtypes, out, attrs):
    z3 = z3mod()
    a, b = args
    mode = attrs.get("rounding_mode")
    if mode is None:
        return z3.fpDiv(_rne(), a, b)
    if mode == "trunc":  # (float32 and float64 only: see exact)
        return z3.fpRoundToIntegral(z3.RTZ(), z3.fpDiv(_rne(), a, b))
    return _in_opmath(lambda x, y, d=out: _floor_divide_fp(x, y, d), out)(a, b)


def _cast(args, dtypes, out, attrs):
    z3 = z3mod()
    a, pick = args
    src = dtypes[0]
    if src is out:
        return a
    if src is DType.bool:
        return z3.If(a, _num(out, 1), _num(out, 0)) if out is not DType.bool else a
    if out is DType.bool:
        return z3.Not(z3.fpIsZero(a)) if src.is_float else a != 0
    if src.is_float and out.is_float:
        if out in (DType.f16, DType.bf16) and src is DType.f64:  # torch rounds through float32
            a = z3.fpToFP(_rne(), a, sort(DType.f32))
        return z3.fpToFP(_rne(), a, sort(out))
    if out.is_float:  # from an integer: torch rounds to float32 first for f16/bf16
        via = DType.f32 if out in (DType.f16, DType.bf16) else out
        x = z3.fpToFPUnsigned(_rne(), a, sort(via)) if src is DType.u8 else z3.fpToFP(_rne(), a, sort(via))
        return x if via is out else z3.fpToFP(_rne(), x, sort(out))
    width = out.itemsize * 8
    if src.is_float:  # truncation; nan, inf and out of range: torch's result is platform-defined
        wide = 64 if out is DType.i64 else 32
        lo, hi = (-(2.0**63), 2.0**63) if wide == 64 else (-(2.0**31), 2.0**31)
        # compared in float64, exactly: the bounds overflow a narrow source (-2^31 is -inf in f16)
        t = z3.fpToFP(_rne(), z3.fpRoundToIntegral(z3.RTZ(), a), sort(DType.f64))
        ok = z3.And(z3.fpGEQ(t, z3.FPVal(lo, sort(DType.f64))), z3.fpLT(t, z3.FPVal(hi, sort(DType.f64))))
        as_int = z3.Extract(width - 1, 0, z3.fpToSBV(z3.RTZ(), a, z3.BitVecSort(wide)))
        return z3.If(ok, as_int, pick)
    have = src.itemsize * 8  # integer to integer: sign- or zero-extend, or wrap
    if width <= have:
        return z3.Extract(width - 1, 0, a)
    return z3.ZeroExt(width - have, a) if src is DType.u8 else z3.SignExt(width - have, a)


def _where(args, dtypes, out, attrs):
    return z3mod().If(*args)


def _isnan(args, dtypes, out, attrs):
    z3 = z3mod()
    return z3.fpIsNaN(args[0]) if dtypes[0].is_float else z3.BoolVal(False)


def _isinf(args, dtypes, out, attrs):
    z3 = z3mod()
    return z3.fpIsInf(args[0]) if dtypes[0].is_float else z3.BoolVal(False)


def _logical(fn: str) -> Encoding:
    def encode(args, dtypes, out, attrs):
        z3 = z3mod()
        return {"and": z3.And, "or": z3.Or, "xor": z3.Xor, "not": z3.Not}[fn](*args)

    return encode


def _bitwise(fn: str) -> Encoding:
    def encode(args, dtypes, out, attrs):
        z3 = z3mod()
        if out is DType.bool:
            return {"and": z3.And, "or": z3.Or, "xor": z3.Xor, "not": z3.Not}[fn](*args)
        return {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "not": lambda a: ~a}[
            fn
        ](*args)

    return encode


def _rounding(mode: str) -> Encoding:
    def encode(args, dtypes, out, attrs):
        z3 = z3mod()
        return z3.fpRoundToIntegral(getattr(z3, mode)(), args[0]) if out.is_float else args[0]

    return encode


def _binary_fp(name: str, bv: Callable) -> Encoding:
    def encode(args, dtypes, out, attrs):
        z3 = z3mod()
        return getattr(z3, name)(_rne(), *args) if out.is_float else bv(*args)

    return encode


_register("add", _binary_fp("fpAdd", lambda a, b: a + b))
_register("sub", _binary_fp("fpSub", lambda a, b: a - b))
_register("mul", _binary_fp("fpMul", lambda a, b: a * b))
_register("div", _div)
_register("floor_divide", lambda args, dtypes, out, attrs: _div(args, dtypes, out, {"rounding_mode": "floor"}))
_register("reciprocal", lambda args, dtypes, out, attrs: z3mod().fpDiv(_rne(), _num(out, 1.0), args[0]))
_register("neg", _fp_or_int(lambda a: z3mod().fpNeg(a), lambda a: -a))
_register("abs", _abs)
_register("relu", _relu)
_register("maximum", _extremum(largest=True))
_register("minimum", _extremum(largest=False))
_register("floor", _rounding("RTN"))
_register("ceil", _rounding("RTP"))
_register("trunc", _rounding("RTZ"))
_register("round", _rounding("RNE"))
for _name, _fp in (("eq", "fpEQ"), ("ne", "fpNEQ"), ("lt", "fpLT"), ("le", "fpLEQ"), ("gt", "fpGT"), ("ge", "fpGEQ")):
    _u = {"eq": "eq", "ne": "ne", "lt": "ULT", "le": "ULE", "gt": "UGT", "ge": "UGE"}[_name]
    _register(_name, _compare(_fp, _name, _u))
ENCODINGS["eq"] = _compare("fpEQ", "eq", "eq")
_register("where", _where)
_register("isnan", _isnan)
_register("isinf", _isinf)
_register("cast", _cast)
for _name in ("and", "or", "xor", "not"):
    _register(f"logical_{_name}", _logical(_name))
    _register(f"bitwise_{_name}", _bitwise(_name))

NEEDS_CHOICE = frozenset({"maximum", "minimum", "cast"})
"""Ops whose encoding takes one more argument: an open choice (see the module docstring)."""

_ARITH = frozenset({"add", "sub", "mul", "neg"})
_FLOAT_ONLY = frozenset({"div", "floor_divide", "reciprocal", "floor", "ceil", "trunc", "round"})
_COMPARE = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


def exact(op: str, attrs: dict, ins: list[DType], out: DType) -> bool:
    """Whether ``ENCODINGS[op]`` encodes this node exactly: operands of the dtypes it was written for
    (no type promotion inside the op: torch computes some mixed-dtype ops on the un-rounded scalar)."""
    if op not in ENCODINGS or any(d.is_complex for d in ins) or out.is_complex:
        return False
    if op == "cast":
        return True
    if op in ("isnan", "isinf"):
        return True
    if op in _COMPARE:
        return len(set(ins)) == 1 and ins[0] is not DType.bool and out is DType.bool
    if op.startswith("logical_"):
        return all(d is DType.bool for d in ins) and out is DType.bool
    if op.startswith("bitwise_"):
        return all(d is out for d in ins) and not out.is_float
    if op == "where":
        return ins[0] is DType.bool and ins[1] is out and ins[2] is out
    if op == "round" and attrs.get("decimals", 0) != 0:
        return False
    if op == "div" and attrs.get("rounding_mode") is not None and not out.is_float:
        return False
    if op == "div" and attrs.get("rounding_mode") == "trunc" and out in (DType.f16, DType.bf16):
        return False  # torch's scalar loop truncates the rounded quotient, its vector loop the float32 one
    if any(d is not out for d in ins) or out is DType.bool:
        return False
    if op in _FLOAT_ONLY:
        return out.is_float
    return op in _ARITH or op in ("abs", "relu", "maximum", "minimum")


# -- axioms of the uninterpreted ops --------------------------------------------------------
Axiom = Callable[[Any, Any, DType], list]
"""axiom(argument, result, dtype) -> facts about one application of a unary op."""


def _nan_in_nan_out(a, r, d):
    z3 = z3mod()
    return [z3.Implies(z3.fpIsNaN(a), z3.fpIsNaN(r))]


def _within(lo: float, hi: float) -> Axiom:
    def facts(a, r, d):
        z3 = z3mod()
        s = sort(d)
        return [z3.Implies(z3.Not(z3.fpIsNaN(a)), z3.And(z3.fpGEQ(r, z3.FPVal(lo, s)), z3.fpLEQ(r, z3.FPVal(hi, s))))]

    return facts


def _at(x: float, y: float) -> Axiom:
    def facts(a, r, d):
        z3 = z3mod()
        s = sort(d)
        return [z3.Implies(z3.fpEQ(a, z3.FPVal(x, s)), z3.fpEQ(r, z3.FPVal(y, s)))]

    return facts


def _zero_at_zero(a, r, d):
    z3 = z3mod()
    return [z3.Implies(z3.fpIsZero(a), z3.fpIsZero(r))]


AXIOMS: dict[str, list[Axiom]] = {
    "exp": [_nan_in_nan_out, _at(0.0, 1.0), _within(0.0, float("inf"))],
    "sigmoid": [_nan_in_nan_out, _at(0.0, 0.5), _within(0.0, 1.0)],
    "tanh": [_nan_in_nan_out, _zero_at_zero, _within(-1.0, 1.0)],
    "erf": [_nan_in_nan_out, _zero_at_zero, _within(-1.0, 1.0)],
    "log": [_nan_in_nan_out, _at(1.0, 0.0)],
    "gelu": [_nan_in_nan_out, _zero_at_zero],
    "silu": [_nan_in_nan_out, _zero_at_zero],
}
"""Facts about torch's float kernels of these unary ops, for every dtype (checked against torch by the
tests): enough to move such ops around, never to compute them."""


def axioms(op: str, attrs: dict, arg_dtypes: list[DType], out: DType) -> list[Axiom]:
    """The axioms that hold for this application (unary, float in and out, default attributes)."""
    if len(arg_dtypes) != 1 or arg_dtypes[0] is not out or not out.is_float:
        return []
    if op == "gelu" and attrs.get("approximate", "none") != "none":
        return [_nan_in_nan_out]
    return AXIOMS.get(op, [])


class Translator:
    """Terms to z3 terms, each distinct term translated once; uninterpreted functions and opaque
    elements named in order of first appearance (the names carry no meaning: the key decides)."""

    def __init__(self):
        self._memo: dict[int, Any] = {}
        self._names: dict[Any, str] = {}
        self.side: list = []
        """Axioms of the uninterpreted applications translated so far."""

    def _name(self, prefix: str, key: Any) -> str:
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"{prefix}!{len(self._names)}"
        return name

    def __call__(self, t: Term):
        done = self._memo.get(id(t))
        if done is not None:
            return done
        z3 = z3mod()
        for u in _postorder(t):
            if id(u) in self._memo:
                continue
            if u.kind == "var":
                e = z3.Const(f"x{u.key[0]}_{u.key[1]}", sort(u.dtype))
            elif u.kind == "const":
                e = literal(u.dtype, u.key)
            elif u.kind == "choice":
                e = z3.Const(f"choice_{u.key}", sort(u.dtype))
            elif u.kind == "opaque":
                e = z3.Const(self._name(u.key[0], ("opaque", u.key)), sort(u.dtype))
            else:
                args = [self._memo[id(a)] for a in u.args]
                dtypes = [a.dtype for a in u.args]
                name, attrs = u.key[0], dict(u.key[1])
                if u.kind == "op":
                    e = ENCODINGS[name](args, dtypes, u.dtype, attrs)
                else:
                    f = z3.Function(self._name(name, ("uf", u.key)), *[sort(d) for d in dtypes], sort(u.dtype))
                    e = f(*args)
                    for axiom in axioms(name, attrs, dtypes, u.dtype):
                        self.side += axiom(args[0], e, u.dtype)
            self._memo[id(u)] = e
        return self._memo[id(t)]


def _postorder(t: Term) -> list[Term]:
    out, seen, stack = [], set(), [(t, False)]
    while stack:
        u, done = stack.pop()
        if done:
            out.append(u)
            continue
        if id(u) in seen:
            continue
        seen.add(id(u))
        stack.append((u, True))
        stack.extend((a, False) for a in reversed(u.args))
    return out
