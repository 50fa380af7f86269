"""Freed activation memory kept in the process: calls that free and allocate again stop faulting pages in."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
import torch

import gawee
from gawee.profile import time_call

from .test_compiler import block

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator setting is glibc's")

FREE_AND_ALLOCATE_AGAIN = """
import ctypes, json
from gawee.backend.allocator import keep_freed_memory, minor_faults

# malloc and free straight from the C library (torch's CPU allocator calls the same functions): torch's own
# small allocations between the blocks would sometimes pin the heap's top and hide glibc's trimming.
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.restype, libc.memset.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
SIZE = 2 << 20

def call():
    # Three 2 MiB activations written and freed per call: the pattern of a module's intermediate tensors.
    blocks = [libc.malloc(SIZE) for _ in range(3)]
    for b in blocks:
        libc.memset(b, 1, SIZE)
    for b in blocks:
        libc.free(b)

def faults_per_call(calls=20):
    for _ in range(10):
        call()
    f0 = minor_faults()
    for _ in range(calls):
        call()
    return (minor_faults() - f0) / calls

before = faults_per_call()
done = keep_freed_memory()
print(json.dumps({"before": before, "done": done, "after": faults_per_call()}))
"""


@glibc
def test_memory_a_call_frees_is_not_faulted_in_again_once_kept():
    # A fresh process, so glibc's thresholds are its defaults: they give the freed blocks back to the OS.
    out = subprocess.run([sys.executable, "-c", FREE_AND_ALLOCATE_AGAIN], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    pages = 3 * (2 << 20) // 4096
    assert result["before"] > pages / 3, result  # the premise: plain glibc faults the pages in on every call
    assert result["done"].startswith("freed memory kept in the process (glibc"), result
    assert result["after"] < 5, result


@glibc
def test_compile_keeps_freed_memory_unless_told_not_to_and_says_so():
    model, x = block(), torch.randn(2, 4, 8, 8)
    report = gawee.compile(model, (x,)).gawee_report
    assert report.allocator.startswith("freed memory kept in the process"), report.allocator
    assert report.allocator in str(report)
    off = gawee.compile(model, (x,), options=gawee.TorchOptions(keep_freed_memory=False)).gawee_report
    assert off.allocator == "" and "freed memory" not in str(off)


@glibc  # another allocator may keep a large block instead of mapping it afresh
def test_a_timing_counts_the_page_faults_of_its_calls():
    big = 48 << 20  # above any mmap threshold: mapped afresh, and faulted in, on every call

    def allocate():
        torch.empty(big // 4).fill_(1.0)

    timing = time_call(allocate, repeats=5)
    assert timing.page_faults is not None and timing.page_faults >= 10  # at least one fault per 2 MiB huge page
    assert "page faults per call" in str(timing) and timing.as_dict()["page_faults_per_call"] == timing.page_faults
    quiet = time_call(lambda: None, repeats=5)
    assert quiet.page_faults < 5
