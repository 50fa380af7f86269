"""How far a reduced-precision model's outputs are from the float model's: max and mean absolute error, cosine
similarity, and top-1 agreement for outputs that look like classifier logits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Accuracy:
    """Outputs compared with the reference's, all floating outputs together (each flattened, in float64)."""

    max_abs_error: float
    mean_abs_error: float
    cosine: float
    """Cosine similarity of all the outputs' elements as one vector (1.0 for two zero vectors)."""
    top1: tuple[int, int] | None = None
    """(rows whose argmax agrees, rows) over the rank-2 [batch, classes] outputs with more than one class; None
    when there is none."""

    def __str__(self) -> str:
        text = (
            f"max abs error {self.max_abs_error:.3g}, mean abs error {self.mean_abs_error:.3g}, "
            f"cosine {self.cosine:.6f}"
        )
        if self.top1 is not None:
            agree, rows = self.top1
            text += f", top-1 agreement {agree}/{rows}"
        return text

    def as_dict(self) -> dict:
        return {
            "max_abs_error": self.max_abs_error,
            "mean_abs_error": self.mean_abs_error,
            "cosine": self.cosine,
            "top1_agree": None if self.top1 is None else self.top1[0],
            "top1_rows": None if self.top1 is None else self.top1[1],
        }


def compare_outputs(reference: Sequence[torch.Tensor], got: Sequence[torch.Tensor]) -> Accuracy | None:
    """``got`` against ``reference``, output by output (the same shapes); None when no output is floating.
    Non-finite elements count where both are not the same (an inf error, a nan cosine)."""
    if len(reference) != len(got):
        raise ValueError(f"{len(got)} outputs to compare with {len(reference)}")
    pairs = [(r, g) for r, g in zip(reference, got) if r.is_floating_point()]
    if not pairs:
        return None
    for r, g in pairs:
        if r.shape != g.shape:
            raise ValueError(f"an output of shape {list(g.shape)} to compare with {list(r.shape)}")
    ref = torch.cat([r.detach().double().reshape(-1) for r, _ in pairs])
    out = torch.cat([g.detach().double().reshape(-1) for _, g in pairs])
    same = (ref == out) | (torch.isnan(ref) & torch.isnan(out))
    error = torch.where(same, 0.0, (ref - out).abs().nan_to_num(nan=torch.inf))
    norms = ref.norm() * out.norm()
    cosine = 1.0 if bool(same.all()) else float(torch.dot(ref, out) / norms) if norms > 0 else 0.0
    logits = [(r, g) for r, g in pairs if r.dim() == 2 and r.shape[1] > 1]
    top1 = None
    if logits:
        agree = sum(int((r.argmax(dim=1) == g.argmax(dim=1)).sum()) for r, g in logits)
        top1 = (agree, sum(r.shape[0] for r, _ in logits))
    return Accuracy(
        float(error.max()) if error.numel() else 0.0,
        float(error.mean()) if error.numel() else 0.0,
        cosine,
        top1,
    )
