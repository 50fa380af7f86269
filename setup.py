"""The build step that ships the top-level ``grammar/`` and ``rules/`` inside the wheel.

All metadata and configuration are in pyproject.toml; this file only extends ``build_py``
so that a built package carries ``gawee/_data/grammar/*.lark`` and ``gawee/_data/rules/**/*.rules``
(``gawee.resources`` looks there first, then in the source tree). An editable install reads
the source tree directly, so it gets no copy and rule edits take effect at once.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUNDLED = {"grammar": "*.lark", "rules": "**/*.rules"}  # as gawee.resources.BUNDLED


class BuildPyWithBundledData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name, pattern in BUNDLED.items():
            files = sorted((ROOT / name).glob(pattern))
            if not files:
                raise SystemExit(f"error: no {name}/{pattern} in {ROOT}: the wheel would have no bundled {name}")
            dest = Path(self.build_lib) / "gawee" / "_data" / name
            shutil.rmtree(dest, ignore_errors=True)  # a file deleted from the source must not linger in build/
            dest.mkdir(parents=True)
            for f in files:  # rules/layout/*.rules too: phases that are not default ones keep their folder
                target = dest / f.relative_to(ROOT / name)
                target.parent.mkdir(parents=True, exist_ok=True)
                self.copy_file(str(f), str(target))


setup(cmdclass={"build_py": BuildPyWithBundledData})
