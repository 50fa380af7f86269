"""gawee.cache keeps what is slow to learn about this machine between processes, and only for this machine."""

import subprocess

import pytest

from gawee import cache
from gawee.backend import onednn_graph


@pytest.fixture
def cache_at(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "gawee"


def test_an_answer_is_recalled_for_its_question_on_this_machine_only(cache_at, monkeypatch):
    assert cache.recall("trial", "does it run?") is None
    cache.keep("trial", "does it run?", "partitions attention")
    assert cache.recall("trial", "does it run?") == "partitions attention"
    assert cache.recall("trial", "does it run on attention?") is None  # another question
    assert [p.name.startswith("trial-") for p in cache_at.iterdir()] == [True]
    monkeypatch.setattr(cache, "machine", lambda: "another CPU")
    assert cache.recall("trial", "does it run?") is None  # another machine or torch


def test_the_machine_is_the_cpu_and_torch():
    import torch

    assert torch.__version__ in cache.machine()


def test_a_cache_dir_that_cannot_be_written_is_no_error(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    cache.keep("trial", "q", "a")  # cannot be written: not kept, no error
    assert cache.recall("trial", "q") is None


def _fake_trial(monkeypatch, returncode: int, stdout: str) -> list:
    runs = []

    def run(args, **kwargs):
        runs.append(args)
        return subprocess.CompletedProcess(args, returncode, stdout=stdout, stderr="")

    monkeypatch.setattr(onednn_graph.subprocess, "run", run)
    onednn_graph._trial.cache_clear()
    return runs


@pytest.mark.parametrize(
    "returncode,stdout,kept",
    [(0, "partitions ok\nattention ok\n", True), (-6, "partitions ok\n", True), (-9, "partitions ok\n", False)],
)
def test_the_fuser_trial_runs_once_per_machine_unless_it_was_killed_from_outside(
    cache_at, monkeypatch, returncode, stdout, kept
):
    """A finished trial (or a crash: native code crashes every time) is kept for the next process; one killed
    from outside (the OOM killer's SIGKILL) says nothing about the fuser and is tried again."""
    runs = _fake_trial(monkeypatch, returncode, stdout)
    try:
        first = onednn_graph._trial()
        onednn_graph._trial.cache_clear()  # a new process
        assert onednn_graph._trial() == first == frozenset(line[:-3] for line in stdout.splitlines())
        assert len(runs) == (1 if kept else 2)
    finally:
        onednn_graph._trial.cache_clear()
