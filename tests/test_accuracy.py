"""gawee.accuracy: a reduced-precision model's outputs against the float model's."""

import math

import pytest
import torch

from gawee.accuracy import compare_outputs


def test_identical_outputs_have_no_error_and_cosine_one():
    a = torch.randn(4, 10)
    acc = compare_outputs([a], [a.clone()])
    assert acc.max_abs_error == 0 and acc.mean_abs_error == 0 and acc.cosine == 1.0 and acc.top1 == (4, 4)


def test_errors_cosine_and_top1_are_measured():
    ref = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]])
    got = torch.tensor([[3.0, 1.0, 0.5], [0.0, 1.0, 1.5]])  # row 1's argmax moves from 1 to 2
    acc = compare_outputs([ref], [got])
    assert acc.max_abs_error == pytest.approx(1.0) and acc.mean_abs_error == pytest.approx(2.0 / 6)
    expected = float(torch.dot(ref.flatten(), got.flatten()) / (ref.norm() * got.norm()))
    assert acc.cosine == pytest.approx(expected) and acc.cosine < 1
    assert acc.top1 == (1, 2)
    text = str(acc)
    assert "max abs error 1" in text and "top-1 agreement 1/2" in text
    assert acc.as_dict()["top1_agree"] == 1 and acc.as_dict()["top1_rows"] == 2


def test_only_rank2_outputs_with_classes_count_for_top1():
    acc = compare_outputs([torch.randn(2, 3, 4), torch.randn(5, 1)], [torch.randn(2, 3, 4), torch.randn(5, 1)])
    assert acc.top1 is None and acc.as_dict()["top1_rows"] is None and "top-1" not in str(acc)


def test_several_outputs_and_integer_ones():
    acc = compare_outputs(
        [torch.ones(3), torch.arange(4), torch.zeros(2)], [torch.ones(3) * 2, torch.arange(4) + 1, torch.zeros(2)]
    )
    assert acc.max_abs_error == 1.0 and acc.mean_abs_error == pytest.approx(3 / 5)  # the integer output is left out
    assert compare_outputs([torch.arange(3)], [torch.arange(3)]) is None


def test_non_finite_differences_count():
    acc = compare_outputs([torch.tensor([1.0, math.inf, math.nan])], [torch.tensor([1.0, math.inf, 0.0])])
    assert acc.max_abs_error == math.inf


def test_mismatched_outputs_are_refused():
    with pytest.raises(ValueError, match="2 outputs to compare with 1"):
        compare_outputs([torch.zeros(2)], [torch.zeros(2), torch.zeros(2)])
    with pytest.raises(ValueError, match="shape"):
        compare_outputs([torch.zeros(2)], [torch.zeros(3)])
