"""Same model + same rules → byte-identical saved graph (.json and .npz), across captures and processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gawee
from gawee.frontend.capture import CaptureStats
from gawee.frontend.models import load_graph

MODEL = "resnet18"  # conv + batch_norm folds, fused residuals: rewritten constants and new names


def capture_optimize_save(directory: Path) -> tuple[Path, Path, CaptureStats]:
    stats = CaptureStats()
    graph, _ = load_graph(MODEL, stats=stats)
    optimized, report = gawee.rewrite(graph, gawee.default_rules())
    assert report.firings["fold_conv_bn"] > 0  # the saved constants include computed ones
    json_path, npz_path = optimized.save(directory / "model.json")
    return json_path, npz_path, stats


def test_two_captures_save_byte_identical_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    json_a, npz_a, stats_a = capture_optimize_save(tmp_path / "a")
    json_b, npz_b, stats_b = capture_optimize_save(tmp_path / "b")
    assert json_a.read_bytes() == json_b.read_bytes()
    assert npz_a.read_bytes() == npz_b.read_bytes()
    # timings stay available to reports, not in the artifact
    for stats in (stats_a, stats_b):
        assert stats.export_s > 0 and stats.convert_s > 0
        assert set(stats.seconds()) == {"export_s", "decompose_s", "convert_s"}
    text = json_a.read_text()
    assert "export_s" not in text and "convert_s" not in text


def test_another_process_with_another_hash_seed_saves_the_same_bytes(tmp_path):
    """The CLI in a fresh process (other PYTHONHASHSEED, other working directory) writes what the API writes here."""
    (tmp_path / "api").mkdir()
    (tmp_path / "cli").mkdir()
    json_api, npz_api, _ = capture_optimize_save(tmp_path / "api")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    cli = [str(Path(sys.executable).parent / "gawee-rewrite")]
    done = subprocess.run(
        [*cli, "optimize", MODEL, "--no-verify", "-o", str(tmp_path / "cli" / "model.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "cli" / "model.json").read_bytes() == json_api.read_bytes()
    assert (tmp_path / "cli" / "model.npz").read_bytes() == npz_api.read_bytes()
