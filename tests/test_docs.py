"""docs/ops.md lists every op name the frontend lowers (and nothing it does not)."""
import pathlib
import re

from cocktailer.frontend.lowering import supported_op_names

DOC = pathlib.Path(__file__).parent.parent / "docs" / "ops.md"


def test_ops_table_matches_the_frontend():
    text = DOC.read_text()
    table = text[text.index("## Tensor operations"):]
    operators = {"+", "-", "*", "/", "//", "%", "**", "@", "==", "!=", "<", "<=", ">", ">=", "&", "|", "^", "~"}
    documented = {w for cell in re.findall(r"`([^`]*)`", table) for w in cell.split()} - operators
    documented = {w for w in documented if not w.startswith(("nn.", ".", "..."))}
    dunder_operators = {n for n in supported_op_names() if n.startswith("__") and n not in
                        {"__getitem__", "__setitem__", "__iter__", "__deepcopy__"}}
    missing = set(supported_op_names()) - documented - dunder_operators
    assert not missing, f"supported but not documented: {sorted(missing)}"
    extra = documented - set(supported_op_names()) - {"None", "T", "mT"}
    assert not extra, f"documented but not supported: {sorted(extra)}"
