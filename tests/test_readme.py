"""The README's Python examples run as written, and the demo runs (on a few trees)."""
from __future__ import annotations

import pathlib
import re
import runpy

from cocktailer import demo

README = pathlib.Path(__file__).parent.parent / "README.md"


def test_every_python_example_in_the_readme_runs(tmp_path):
    """Each block as a script of its own (capture reads the source of the functions it converts)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert blocks, "the README has Python examples"
    for k, block in enumerate(blocks):
        script = tmp_path / f"readme_example_{k}.py"
        script.write_text(block)
        runpy.run_path(str(script), run_name="__main__")


def test_the_demo_checks_unpadded_trees_against_eager(capsys):
    demo.main(["--trees", "6", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "all 6 trees match eager PyTorch" in out and "unpadded" in out
