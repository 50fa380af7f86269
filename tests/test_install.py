"""A wheel built from this repository carries the grammar and the bundled rules, and an installed gawee runs
from any directory (not only from its source tree, and not only as an editable install)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gawee import resources
from gawee.errors import GaweeError

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ["gawee", "grammar", "rules", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md"]


def _run(argv: list[str], cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The repository built into a wheel (offline, from a copy: the shared tree gets no build/) and installed
    with ``pip install --target``; returns the target directory."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_data"))
        else:
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", "dist", "./src"], tmp)
    (wheel,) = (tmp / "dist").glob("gawee-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for name, pattern in resources.BUNDLED.items():
            expected = sorted((ROOT / name).glob(pattern))
            assert expected, f"no {name}/{pattern} in the repository"
            for f in expected:
                member = f"gawee/_data/{name}/{f.relative_to(ROOT / name).as_posix()}"
                assert member in names, f"the wheel lacks {member}"
                assert zf.read(member) == f.read_bytes()
    _run([*pip, "install", "-q", "--no-deps", "--no-index", "--target", "site", str(wheel)], tmp)
    return tmp / "site"


def _env(site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(site)  # before the .venv's editable-install finder: the installed copy is imported
    return env


def test_the_installed_copy_is_imported_and_finds_its_data(installed, tmp_path):
    code = (
        "import gawee\n"
        "from gawee.dsl.parser import GRAMMAR_PATH\n"
        "from gawee.rewrite.ruleset import RULES_DIR\n"
        "print(gawee.__file__); print(GRAMMAR_PATH); print(RULES_DIR)\n"
    )
    out = _run([sys.executable, "-c", code], tmp_path, _env(installed)).stdout.split()
    gawee_file, grammar, rules = (Path(p) for p in out)
    assert gawee_file.is_relative_to(installed), gawee_file
    assert grammar == installed / "gawee" / "_data" / "grammar" / "rules.lark"
    assert rules == installed / "gawee" / "_data" / "rules"


def test_installed_gawee_rewrite_optimizes_resnet18_from_another_directory(installed, tmp_path):
    script = installed / "bin" / "gawee-rewrite"
    done = _run([str(script), "optimize", "resnet18", "-o", "out.json"], tmp_path, _env(installed), timeout=240)
    assert "rules fired: fold_conv_bn x20" in done.stdout, done.stdout
    assert "ok, max error" in done.stdout, done.stdout  # verified against the original
    assert (tmp_path / "out.json").is_file() and (tmp_path / "out.npz").is_file()
    for source in ("gawee", "rules", "grammar"):  # nothing of the source tree is read
        assert f"{ROOT / source}/" not in done.stdout + done.stderr


def test_bundled_dir_prefers_the_packaged_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "PACKAGE_DIR", tmp_path / "gawee")
    (tmp_path / "gawee" / "_data" / "rules").mkdir(parents=True)
    assert resources.bundled_dir("rules") == tmp_path / "gawee" / "_data" / "rules"
    assert resources.bundled_dir("grammar") == tmp_path / "grammar"  # the source-tree layout
    with pytest.raises(GaweeError, match="no bundled data named"):
        resources.bundled_dir("models")
