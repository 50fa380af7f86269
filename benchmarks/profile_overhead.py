"""Does the per-node profile add up to what the module takes uninstrumented? Measured in a quiet process of its own.

    python benchmarks/profile_overhead.py                    # resnet18 at 1x3x112x112, one torch thread
    python benchmarks/profile_overhead.py --model mobilenet_v3_small --size 224 --threads 2

``gawee.profile.profile`` stamps the time after every kernel of a module built by ``gawee.to_torch``; the claim
is that the stamps cost little, so the per-node times add up to the module's own time per call. Both are
noisy on a shared machine, so each is taken as the quietest of ``--attempts`` medians. Exit code 1 when the
node sum is more than ``--tolerance`` (default 15%) away from the uninstrumented median. The suite checks the
profile's arithmetic with a deterministic clock instead (tests/test_profile.py): wall-clock times inside a
parallel test run are not reliable.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", help="a torchvision model name (default resnet18)")
    parser.add_argument("--size", type=int, default=112, help="input height and width (default 112)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--attempts", type=int, default=5, help="medians taken of each (default 5)")
    parser.add_argument("--repeats", type=int, default=15, help="calls per median (default 15)")
    parser.add_argument("--tolerance", type=float, default=0.15, help="allowed relative difference (default 0.15)")
    args = parser.parse_args(argv)

    import torch
    import torchvision

    import gawee
    from gawee.profile import cpu_name, profile, time_call
    from gawee.threads import torch_threads

    torch.manual_seed(0)
    model = torchvision.models.get_model(args.model, weights=None).eval()
    x = torch.randn(1, 3, args.size, args.size)
    optimized, _ = gawee.rewrite(gawee.capture(model, (x,)))
    module = gawee.to_torch(optimized)
    totals, sums = [], []
    with torch_threads(args.threads):
        for _ in range(args.attempts):
            totals.append(time_call(lambda: module(x), repeats=args.repeats).median)
            sums.append(profile(module, optimized, [x], repeats=args.repeats).node_sum)
    total, node_sum = min(totals), min(sums)
    off = abs(node_sum - total) / total
    print(f"{args.model} 1x3x{args.size}x{args.size} on {cpu_name()}, {args.threads} thread(s)")
    print(f"uninstrumented median {total * 1e3:.3f} ms (attempts: {', '.join(f'{t * 1e3:.3f}' for t in totals)})")
    print(f"profile node sum      {node_sum * 1e3:.3f} ms (attempts: {', '.join(f'{t * 1e3:.3f}' for t in sums)})")
    print(f"difference {off:.1%} ({'within' if off <= args.tolerance else 'beyond'} {args.tolerance:.0%})")
    return 0 if off <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
