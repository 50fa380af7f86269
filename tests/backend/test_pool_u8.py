"""gawee's max pool of u8 codes held channels-last (gawee/backend/pool_u8.py) against torch's max pool."""

import pytest
import torch
import torch.nn.functional as F

from gawee.backend import pool_u8

pytestmark = pytest.mark.skipif(pool_u8.unavailable() is not None, reason=str(pool_u8.unavailable()))


@pytest.mark.parametrize(
    "n, c, h, w, kernel, stride, padding, dilation, ceil",
    [
        (1, 64, 112, 112, 3, 2, 1, 1, False),  # a ResNet's stem: past the threads' split
        (2, 17, 9, 11, 3, 2, 1, 1, True),  # channels no vector holds whole, ceil_mode's extra window
        (1, 3, 8, 8, 2, 2, 0, 1, False),
        (2, 100, 10, 7, 2, 1, 0, 2, False),  # dilation
        (1, 5, 6, 6, 3, 3, 1, 1, True),
    ],
)
def test_the_kernel_pools_as_torch_does(n, c, h, w, kernel, stride, padding, dilation, ceil):
    torch.manual_seed(0)
    x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    want = F.max_pool2d(x.float(), kernel, stride, padding, dilation, ceil_mode=ceil).to(torch.uint8)
    out = torch.full(want.shape, 7, dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    geometry = ([kernel] * 2, [stride] * 2, [padding] * 2, [dilation] * 2)
    assert pool_u8.windows_reach_the_image((h, w), want.shape[2:], *geometry)
    args = pool_u8.args(x.data_ptr(), out.data_ptr(), x.shape, want.shape, *geometry)
    assert pool_u8.library().gawee_max_pool_u8(*args) == 0
    assert torch.equal(out, want)


def test_a_window_of_padding_only_is_refused():
    """The kernel's max starts from code 0: a window with no position in the image (padding past half the window,
    which torch refuses) would give 0 where the pool is -inf, so the runtime does not offer the kernel there."""
    assert not pool_u8.windows_reach_the_image([4], [4], [1], [1], [1], [1])
    assert pool_u8.windows_reach_the_image([4], [2], [3], [2], [1], [1])
