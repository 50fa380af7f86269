"""Shared fixtures: small captured models (cached per session) and hypothesis profiles."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Sequence

import pytest
import torch
from hypothesis import HealthCheck, settings

from gawee.resources import cache_dir

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci")  # `pytest --hypothesis-profile=thorough` for the long run

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _WORKERS)))
"""Threads per process: the cores shared out among pytest-xdist's workers. Two workers of two threads each on two
cores oversubscribe them, and a parallel region then waits a time slice for a descheduled thread: oneDNN's
1x512x1000 linear measured 0.12 ms alone and 8 ms (median) beside another busy two-thread process (AMD EPYC
Zen 3), which once made it the slowest op of ResNet-18 in a CI run."""

os.environ.setdefault("GAWEE_ACCEL_DIR", str(cache_dir() / "accel"))
os.environ["XDG_CACHE_HOME"] = _CACHE = tempfile.mkdtemp(prefix="gawee-test-cache-")
"""The suite's answers about this machine (gawee.cache) start empty and are its own (its CLI runs share them):
nothing a developer's or an earlier run's cache holds decides a test. The compiled engine that `make test` has just
built stays where it is (gawee.accel, GAWEE_ACCEL_DIR): it decides no result, only how fast the suite runs."""
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption(
        "--require-renderers",
        action="store_true",
        help="fail, instead of skip, the picture tests whose renderer (headless Chromium, Graphviz's dot) is not "
        "installed: CI installs both and passes this (.ci/run)",
    )


def renderer(config: pytest.Config, names: Sequence[str], install: str) -> str:
    """The path of the first program of ``names`` on PATH. Without one, the test is skipped with ``install`` as the
    reason (``make test`` on a fresh machine needs no system package), or fails with it under
    ``--require-renderers`` (CI, where skipping would hide a broken picture)."""
    for name in names:
        exe = shutil.which(name)
        if exe is not None:
            return exe
    reason = f"{' or '.join(names)} not found on PATH: {install}"
    if config.getoption("--require-renderers"):
        pytest.fail(f"{reason} (--require-renderers: this run must render)")
    pytest.skip(reason)


HARNESS: dict[str, float] = {
    "bundled rules": 0,
    "examples": 0,
    "planted unsound": 0,
    "caught": 0,
    "correct twins": 0,
    "twins passing": 0,
    "fuzz graphs": 0,
    "fuzz rule texts": 0,
    "seconds": 0.0,
}
"""Soundness-harness figures gathered by the tests, printed at the end of the run."""


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)  # a pytest-xdist worker: hand the figures back
    if workeroutput is not None:
        workeroutput["harness"] = dict(HARNESS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: each worker's harness figures add up to the run's."""
    for key, value in getattr(node, "workeroutput", {}).get("harness", {}).items():
        HARNESS[key] += value


def pytest_terminal_summary(terminalreporter):
    if any(HARNESS.values()):
        terminalreporter.section("soundness harness")
        terminalreporter.write_line(
            ", ".join(f"{k}: {round(v, 1) if isinstance(v, float) else v}" for k, v in HARNESS.items())
        )


@functools.cache
def captured(name: str, batch: int = 1):
    """(graph, model, example input) for a torchvision model with seeded random weights."""
    import torchvision

    import gawee
    from gawee.frontend.models import default_input

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None).eval()
    (x,) = default_input(name, batch)
    return gawee.capture(model, (x,), name=name), model, x


@pytest.fixture(scope="session")
def resnet18():
    return captured("resnet18")
