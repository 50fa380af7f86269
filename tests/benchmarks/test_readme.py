"""benchmarks/readme.py: each benchmark program rewrites only its own README section."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from readme import INTRO, replace_section

DOC = """# gawee benchmarks

## Model zoo

old zoo

```sh
## not a heading: inside a fence
```

### Targets (computed from the table)

old targets

### Notes

hand-written, kept

### Figures behind the code

also hand-written, kept

## Runtime

old runtime
"""


def test_replaces_only_its_section_and_keeps_notes(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(DOC)
    replace_section("## Model zoo", "new zoo\n\n### Targets (computed from the table)\n\nnew targets", path)
    text = path.read_text()
    assert "old zoo" not in text and "not a heading" not in text and "old targets" not in text
    notes, figures = text.index("### Notes\n\nhand-written, kept"), text.index("also hand-written, kept")
    assert text.index("new zoo") < text.index("new targets") < notes < figures < text.index("## Runtime")
    assert text.endswith("## Runtime\n\nold runtime\n")
    replace_section("## Model zoo", "newer zoo", path)  # idempotent shape: the notes are not doubled
    text = path.read_text()
    assert text.count("### Notes") == 1 and text.count("### Figures behind the code") == 1


def test_appends_a_missing_section_and_creates_the_file(tmp_path):
    path = tmp_path / "README.md"
    replace_section("## Engine speed", "figures", path)
    assert path.read_text() == INTRO.rstrip() + "\n\n## Engine speed\n\nfigures\n"
    assert not list(tmp_path.glob(".README.*"))  # the temporary file was renamed into place
