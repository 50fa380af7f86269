"""Grouped-query attention whose key or value has no heads: torch's kernel takes the query's heads modulo theirs
and the process dies of SIGFPE (on meta tensors too, so type inference alone would kill it); gawee's op refuses it
with a typed error instead, and keeps what torch computes (every head count 0)."""

import pytest
import torch

from gawee.errors import InferenceError
from gawee.ir.types import DType, TensorType
from gawee.ops import get_op

OP = get_op("scaled_dot_product_attention")
GQA = OP.complete_attrs({"enable_gqa": True, "is_causal": True}, "")


def _types(q_heads: int, k_heads: int, v_heads: int) -> list:
    return [
        TensorType((6, 1, q_heads, 4, 4), DType.f32),
        TensorType((6, 1, k_heads, 1, 4), DType.f32),
        TensorType((6, 1, v_heads, 1, 6), DType.f32),
        None,
    ]


@pytest.mark.parametrize("heads", [(2, 0, 2), (2, 2, 0), (4, 0, 0)])
def test_a_key_or_value_of_no_heads_is_an_error_not_a_crash(heads):
    types = _types(*heads)
    with pytest.raises(InferenceError, match="at least one head"):
        OP.infer_types(types, GQA)
    with pytest.raises(ValueError, match="at least one head"):
        OP.run([torch.zeros(t.shape) for t in types[:3]] + [None], GQA)


def test_attention_of_no_heads_at_all_is_typed_as_torch_types_it():
    assert OP.infer_types(_types(0, 0, 0), GQA) == [TensorType((6, 1, 0, 4, 6), DType.f32)]
