"""A small CNN that spells hard-swish by hand (x * relu6(x + 3) / 6), as MobileNetV3 papers and ports write it."""

import torch
import torch.nn.functional as F
from torch import nn


class SwishNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.bn1(self.conv1(x))
        x = x * F.relu6(x + 3) / 6
        x = self.conv2(x)
        x = x * F.relu6(x + 3) / 6
        return self.head(x.mean(dim=(2, 3)))


def make():
    torch.manual_seed(0)
    return SwishNet().eval(), (torch.randn(1, 3, 32, 32),)
