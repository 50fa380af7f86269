"""Where gawee's files live: its bundled data — the rule grammar (``grammar/``) and the default pipeline
(``rules/``) — and the cache directory where answers are kept between processes.

The repository keeps both at its top level. A wheel carries them inside the package as
``gawee/_data/grammar`` and ``gawee/_data/rules`` (copied there by the build step in
``setup.py``); a checkout or an editable install (``pip install -e .``) reads the source
tree's top-level directories. Either way the lookup is relative to this file, never to the
working directory, so gawee runs from any directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from gawee.errors import GaweeError

VERSION = "0.1.0"
"""gawee's version (``gawee.__version__``); cache keys include it."""

PACKAGE_DIR = Path(__file__).resolve().parent

BUNDLED = {"grammar": "*.lark", "rules": "**/*.rules"}
"""Bundled data directory → the files of it that ship (the build step in setup.py copies these)."""


def bundled_dir(name: str) -> Path:
    """The directory of bundled data ``name`` ("grammar" or "rules"): the installed package's copy
    (``gawee/_data/<name>``) if there is one, else the source tree's top-level ``<name>/``.

    Does not check that it exists: callers report a missing file with :func:`missing_hint`.
    """
    if name not in BUNDLED:
        raise GaweeError(f"no bundled data named {name!r}", hint="one of: " + ", ".join(BUNDLED))
    packaged = PACKAGE_DIR / "_data" / name
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / name


def missing_hint() -> str:
    """What to do when bundled data is not found."""
    return (
        f"gawee at {PACKAGE_DIR} has neither gawee/_data/ (a wheel built with setup.py's build step) nor a source "
        "tree beside it: reinstall with `pip install .` (or `pip install -e .` from a checkout)"
    )


def cache_dir() -> Path:
    """Where answers are kept: ``$XDG_CACHE_HOME/gawee``, else ``~/.cache/gawee``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gawee"
