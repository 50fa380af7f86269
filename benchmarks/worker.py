"""One measurement in its own Python process: a crash, a timeout or a memory blow-up becomes
a row of the report, and the other measurements still run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMEOUT = "timeout"


def run_worker(
    script: Path,
    args: list[str],
    *,
    timeout: float,
    threads: int = 1,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[dict | None, str, float]:
    """Run ``python script *args --out FILE`` (the worker writes its row to FILE as JSON); ``env``: variables set
    for it beyond this process's.

    Returns (row, "", wall seconds), or (None, why no row came back, wall seconds) where why is
    TIMEOUT or the exit status with the last lines the worker printed.
    """
    with tempfile.TemporaryDirectory(prefix="gawee-worker-") as tmp:
        out = Path(tmp) / "row.json"
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore", **(env or {}))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, str(script), *args, "--out", str(out)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                cwd=cwd,
            )
        except subprocess.TimeoutExpired:
            return None, TIMEOUT, time.perf_counter() - t0
        wall = time.perf_counter() - t0
        if out.exists():
            return json.loads(out.read_text()), "", wall
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-6:]
        status = "killed (out of memory?)" if proc.returncode in (-9, 137) else f"exit status {proc.returncode}"
        return None, f"{status}: " + " | ".join(tail), wall
