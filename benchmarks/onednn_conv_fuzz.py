"""oneDNN's fused convolution over random geometries: where it crashes or computes wrong values, raw and with the
guards of gawee's torch lowering (gawee.backend.onednn: effective_dilation, safe_geometry).

Each case is a random conv2d (batch, channels, groups, kernel, stride, padding, dilation, input size, NCHW or
channels-last, float32 or bf16) run through ``torch.ops.mkldnn._convolution_pointwise`` on the weight packed for
the input (``_reorder_convolution_weight``, what the lowering emits) and on the plain weight, and compared with
``torch.nn.functional.conv2d`` in float32 (within 1e-3 of the output's magnitude for float32, 5% for bf16). The
cases run in a child process: a segfault ends the child, the case it was running is recorded as a crash, and a new
child goes on from the next case. "guarded" applies the lowering's guards first: dilation is made effective, and a
case the lowering keeps from oneDNN (a dilated window over a spatial size of 1, a stride of 1 in height and more in
width) is counted as kept away.

With ``--int8`` the kernel is oneDNN's int8 convolution as gawee's torch lowering runs it
(``gawee.backend.quantized.StaticInt8Conv``: ``onednn::qconv2d_pointwise`` on a prepacked int8 weight, the input
quantized with a fixed scale, relu, a residual summed in every other case), compared with the reference semantics
of ``conv2d_int8_static`` (an exact integer convolution: within 1e-5 of the output's magnitude); "guarded" also
keeps away a geometry with a window wholly in the padding (``onednn.window_in_padding``), as the lowering does.

    python benchmarks/onednn_conv_fuzz.py --cases 3000          # both modes, the same cases
    python benchmarks/onednn_conv_fuzz.py --cases 3000 --int8   # the int8 kernel
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys

import torch

from gawee.backend import onednn


def geometry(rng: random.Random) -> dict | None:
    """A random valid convolution, or None where its window does not fit the padded input."""
    groups = rng.choice([1, 1, 1, 2, 4])
    cin, cout = groups * rng.randint(1, 8), groups * rng.randint(1, 8)
    if rng.random() < 0.2:
        groups, cout = cin, cin
    k = [rng.randint(1, 4), rng.randint(1, 4)]
    stride = [rng.randint(1, 3), rng.randint(1, 3)]
    padding = [rng.randint(0, 3), rng.randint(0, 3)]
    dilation = [rng.randint(1, 3), rng.randint(1, 3)]
    size = [rng.randint(1, 12), rng.randint(1, 12)]
    if any(s + 2 * p - d * (kk - 1) - 1 < 0 for s, p, d, kk in zip(size, padding, dilation, k)):
        return None
    return {
        "x": [rng.randint(1, 2), cin, *size],
        "w": [cout, cin // groups, *k],
        "stride": stride,
        "padding": padding,
        "dilation": dilation,
        "groups": groups,
        "channels_last": rng.random() < 0.5,
        "dtype": rng.choice(["float32", "bfloat16"]),
    }


def run_case(g: dict, guarded: bool) -> str:
    """ "ok", "kept away", "packed wrong", "plain wrong" or "both wrong" for one case (a crash never returns)."""
    dtype = getattr(torch, g["dtype"])
    dilation = g["dilation"]
    if guarded:
        dilation = onednn.effective_dilation(g["w"][2:], dilation)
        if not onednn.safe_geometry(g["x"], g["stride"], dilation):
            return "kept away"
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(g["x"], generator=gen).to(dtype), torch.randn(g["w"], generator=gen).to(dtype)
    b = torch.randn(g["w"][0], generator=gen).to(dtype)
    if g["channels_last"]:
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    geo = (g["padding"], g["stride"], dilation, g["groups"])
    ref = torch.nn.functional.conv2d(x.float(), w.float(), b.float(), g["stride"], g["padding"], dilation, g["groups"])
    tol = (1e-3 if dtype is torch.float32 else 0.05) * max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
    mk = torch.ops.mkldnn
    plain = mk._convolution_pointwise(x, w, b, *geo, "none", [], "")
    p = mk._reorder_convolution_weight(w, g["padding"], g["stride"], dilation, g["groups"], list(x.shape))
    packed = mk._convolution_pointwise(x, p, b, *geo, "none", [], "")
    wrong = [bool(t.numel()) and (t.float() - ref).abs().max().item() > tol for t in (packed, plain)]
    return {(False, False): "ok", (True, False): "packed wrong", (False, True): "plain wrong"}.get(
        tuple(wrong), "both wrong"
    )


def run_int8_case(g: dict, guarded: bool) -> str:
    """ "ok", "kept away" or "wrong" for one case through the int8 kernel (a crash never returns)."""
    from gawee.backend.quantized import StaticInt8Conv, conv_unavailable
    from gawee.ops.quantized import conv2d_int8_static, quantize_per_channel_symmetric, static_qparams

    levels = 255 if conv_unavailable(255) is None else 127
    dilation = g["dilation"]
    if guarded:
        dilation = onednn.effective_dilation(g["w"][2:], dilation)
        if not onednn.safe_geometry(g["x"], g["stride"], dilation) or onednn.window_in_padding(
            g["x"], g["w"][2:], g["stride"], g["padding"], dilation
        ):
            return "kept away"
    gen = torch.Generator().manual_seed(0)
    x, w = 2 * torch.randn(g["x"], generator=gen), torch.randn(g["w"], generator=gen)
    b = torch.randn(g["w"][0], generator=gen)
    fmt = torch.channels_last if g["channels_last"] else torch.contiguous_format
    x = x.contiguous(memory_format=fmt)
    q, scale = quantize_per_channel_symmetric(w, axis=0)
    s, z = static_qparams(-3.0, 4.0, levels)
    geo = (g["stride"], g["padding"], dilation, g["groups"])
    kernel = StaticInt8Conv("fuzz", q, scale, b, geo, "relu", (), s, z, levels, tuple(x.shape), g["channels_last"])
    out = [g["x"][0], g["w"][0]] + [
        (n + 2 * p - d * (k - 1) - 1) // st + 1
        for n, p, d, k, st in zip(g["x"][2:], g["padding"], dilation, g["w"][2:], g["stride"])
    ]
    residual = g["dtype"] == "bfloat16"  # the geometry's coin for the float kernel's dtype: half the cases
    r = torch.randn(out, generator=gen).contiguous(memory_format=fmt) if residual else None
    got = kernel(x) if r is None else kernel(x, r.clone())
    ref = conv2d_int8_static(
        x, q, scale, b, r, stride=geo[0], padding=geo[1], dilation=geo[2], groups=geo[3], act="relu",
        scale=s, zero_point=z, levels=levels,
    )  # fmt: skip
    tol = 1e-5 * max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
    return "wrong" if got.shape != ref.shape or (got.numel() and (got - ref).abs().max().item() > tol) else "ok"


def child(seed: int, cases: int, start: int, guarded: bool, int8: bool = False) -> None:
    """Run cases ``start``.. of the seed's sequence, a line before (the case) and after (its outcome) each."""
    torch.set_num_threads(1)
    rng = random.Random(seed)
    drawn = [geometry(rng) for _ in range(cases)]
    for i in range(start, cases):
        if drawn[i] is None:
            continue
        print(json.dumps({"case": i, "g": drawn[i]}), flush=True)
        outcome = (run_int8_case if int8 else run_case)(drawn[i], guarded)
        print(json.dumps({"case": i, "outcome": outcome}), flush=True)


def fuzz(seed: int, cases: int, guarded: bool, int8: bool = False) -> dict:
    """Every case of the seed, in as many children as crashes need: outcome → (count, first example)."""
    found: dict[str, list] = {}
    start = 0
    while start < cases:
        argv = [
            sys.executable,
            __file__,
            "--child",
            str(seed),
            str(cases),
            str(start),
            str(int(guarded)),
            str(int(int8)),
        ]
        proc = subprocess.run(argv, capture_output=True, text=True)
        last = None
        for line in proc.stdout.splitlines():
            record = json.loads(line)
            if "g" in record:
                last = record
            else:
                entry = found.setdefault(record["outcome"], [0, None])
                entry[0] += 1
                if entry[1] is None and record["outcome"] != "ok":
                    entry[1] = last["g"]
                last = None
        if proc.returncode == 0:
            break
        if last is None:
            raise RuntimeError(f"the child failed outside a case: {proc.stderr[-2000:]}")
        entry = found.setdefault(f"crashed ({proc.returncode})", [0, last["g"]])
        entry[0] += 1
        start = last["case"] + 1
    return found


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        seed, cases, start, guarded, int8 = map(int, sys.argv[2:7])
        child(seed, cases, start, bool(guarded), bool(int8))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=3000, help="random geometries drawn (invalid ones are skipped)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--int8", action="store_true", help="oneDNN's int8 convolution (gawee's StaticInt8Conv) instead")
    args = p.parse_args(argv)
    kernel = "int8 " if args.int8 else ""
    print(f"torch {torch.__version__}; {kernel}{args.cases} geometries drawn, seed {args.seed}\n")
    print("| mode | outcome | cases | first example |\n|---|---|---:|---|")
    for guarded in (False, True):
        for outcome, (count, example) in sorted(fuzz(args.seed, args.cases, guarded, args.int8).items()):
            shown = "" if example is None else f"`{json.dumps(example)}`"
            print(f"| {'guarded' if guarded else 'raw'} | {outcome} | {count} | {shown} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
