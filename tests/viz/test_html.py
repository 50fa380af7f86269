"""The HTML report: self-contained, deterministic, and drawn by a real browser with both graphs visible.

The browser test renders the ResNet-18 report in headless Chromium (Debian's
``chromium``) and reads the screenshot's pixels. Without a browser it is skipped with
the reason, so that ``make test`` passes on a fresh machine without root; CI installs
Chromium and runs with ``--require-renderers`` (.ci/run), which turns the skip into a
failure.
"""

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import gawee
from gawee.report import Column
from gawee.viz.html import html_report
from gawee.viz.view import STYLES
from tests.conftest import captured, renderer

WINDOW = (1600, 1000)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--mute-audio",
]


def _report(graph, optimized, report) -> str:
    cols = [Column("before", gawee.cost(graph)), Column("after", gawee.cost(optimized), {"verification": "ok"})]
    return html_report(graph, optimized, cols, trace=report.trace, firings=report.firings)


@pytest.fixture(scope="module")
def resnet18_report():
    graph, _, _ = captured("resnet18")
    optimized, report = gawee.rewrite(graph, trace=True)
    return graph, optimized, report, _report(graph, optimized, report)


@pytest.fixture
def chromium(request) -> str:
    return renderer(
        request.config,
        ["chromium", "chromium-browser"],
        "headless Chromium renders the HTML report (apt-get install -y chromium; .ci/run installs it in CI)",
    )


def _browse(chromium: str, page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args, page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"chromium failed ({done.returncode}):\n{done.stderr[-2000:]}"
    return done


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))


def test_the_report_renders_in_chromium_with_both_graphs_visible(chromium, resnet18_report, tmp_path):
    graph, optimized, _, text = resnet18_report
    page = tmp_path / "resnet18.html"
    page.write_text(text)
    shot = tmp_path / "resnet18.png"
    _browse(chromium, page, tmp_path, f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}")
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape == (WINDOW[1], WINDOW[0], 3)

    def count(box, colour=None, dark=False) -> int:
        x0, y0, x1, y1 = box
        region = pixels[y0:y1, x0:x1]
        if dark:
            return int((region.sum(axis=-1) < 300).sum())
        return int(np.all(region == colour, axis=-1).sum())

    half = WINDOW[0] // 2
    left, right = (0, 150, half, WINDOW[1]), (half, 150, WINDOW[0], WINDOW[1])
    io, made = _rgb(STYLES["io"].fill), _rgb(STYLES["rule"].fill)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50, "the screenshot is blank"
    # each panel has drawn boxes with text: the input box, and then ops
    assert count(left, io) > 1500 and count(right, io) > 1500
    assert count(left, dark=True) > 2000 and count(right, dark=True) > 2000
    # the fused convolutions (orange) are in the right panel only: the graphs are side by side
    assert count(right, made) > 20000 and count(left, made) == 0

    dom = _browse(chromium, page, tmp_path, "--dump-dom").stdout
    svgs = re.findall(r'<svg [^>]*class="graph" id="(\w+)"', dom)
    assert svgs == ["b", "a"]
    before_svg, after_svg = dom.split('id="a"', 1)
    assert before_svg.count('class="box ') == 1 + len(graph) + 1
    assert after_svg.count('class="box ') == 1 + len(optimized) + 1


def test_the_report_is_self_contained_and_complete(resnet18_report):
    _, _, report, text = resnet18_report
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)|@import|url\(\s*["']?https?:""", text)
    assert "<script" not in text and "<link" not in text
    assert text.count("<svg ") == 2
    assert text.count('<td class="rule">') == len(report.trace) == 46
    for cell in ("bytes read", "peak memory", "batch_norm", "verification", "fold_conv_bn x20"):
        assert cell in text
    assert "```" not in text and "| metric | before | after | change |" in text  # the Markdown, for copying


def test_the_report_is_deterministic(resnet18_report):
    graph, _, _, text = resnet18_report
    optimized, report = gawee.rewrite(graph, trace=True)
    again = _report(graph, optimized, report)
    assert again == text  # no timestamps, no ids that vary: byte for byte
