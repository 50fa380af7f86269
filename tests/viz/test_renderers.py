"""The picture tests' renderers: skipped with the reason on a fresh machine, required under --require-renderers."""

import shutil

import pytest

from tests.conftest import renderer


class _Config:
    def __init__(self, require: bool):
        self.require = require

    def getoption(self, name: str) -> bool:
        assert name == "--require-renderers"
        return self.require


def test_a_missing_renderer_skips_with_the_reason(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(pytest.skip.Exception, match=r"chromium or chromium-browser not found.*apt-get install"):
        renderer(_Config(False), ["chromium", "chromium-browser"], "apt-get install -y chromium")


def test_a_missing_renderer_fails_under_require_renderers(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(pytest.fail.Exception, match=r"dot not found.*--require-renderers"):
        renderer(_Config(True), ["dot"], "apt-get install -y graphviz")


def test_the_first_renderer_found_is_used(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}" if name == "chromium-browser" else None)
    assert renderer(_Config(True), ["chromium", "chromium-browser"], "") == "/usr/bin/chromium-browser"


def test_the_option_is_registered(pytestconfig):
    assert pytestconfig.getoption("--require-renderers") in (True, False)
