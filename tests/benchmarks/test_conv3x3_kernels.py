"""benchmarks/conv3x3_kernels.py: oneDNN and NNPACK on one 3x3 convolution, timed and checked against float64."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import conv3x3_kernels


def test_each_candidate_computes_the_convolution_and_is_timed(capsys):
    row = conv3x3_kernels.measure(batch=1, channels=8, size=6, calls=2)
    expected = {"onednn", "nnpack"} if torch.backends.nnpack.is_available() else {"onednn"}
    assert set(row["ms"]) == set(row["error"]) == expected
    assert all(ms > 0 for ms in row["ms"].values())
    assert all(err < 1e-4 for err in row["error"].values())  # a wrong kernel would be off by the output's size
    assert conv3x3_kernels.main(["--batches", "1", "--shapes", "8x6", "--calls", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("b1 8x6x6: onednn ") and "1.00x oneDNN's speed" in out[1]


def test_a_kernel_computing_something_else_shows_its_error(monkeypatch):
    real = conv3x3_kernels.candidates

    def wrong(x, w, b):
        found = real(x, w, b)
        found["onednn"] = lambda f=found["onednn"]: f() * 1.01
        return found

    monkeypatch.setattr(conv3x3_kernels, "candidates", wrong)
    row = conv3x3_kernels.measure(batch=1, channels=8, size=6, calls=1)
    assert row["error"]["onednn"] == pytest.approx(0.01, rel=0.05)
