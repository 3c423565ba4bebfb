"""docs/CONFIGURATION.md against the vLLM connector: every ``kv_connector_extra_config`` key is listed, in
order, with ``repr()`` of its default, so the document cannot drift from ``EXTRA_CONFIG``."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADING = "## `kv_connector_extra_config` keys (vLLM connector)"


def extra_config_in_source():
    """EXTRA_CONFIG as written in kv_transfer/vllm.py (read, not imported: importing needs vLLM)."""
    tree = ast.parse((ROOT / "python" / "kv_transfer" / "vllm.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "EXTRA_CONFIG":
            return ast.literal_eval(node.value)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXTRA_CONFIG" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("no EXTRA_CONFIG in kv_transfer/vllm.py")


def documented_keys():
    lines = (ROOT / "docs" / "CONFIGURATION.md").read_text().splitlines()
    assert HEADING in lines, "docs/CONFIGURATION.md has no section %r" % HEADING
    rows = []
    for line in lines[lines.index(HEADING) + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("| `"):
            cells = [c.strip() for c in line.split("|")]
            rows.append((cells[1].strip("`"), cells[2].strip("`")))
    return rows


def test_every_extra_config_key_is_documented_with_its_default():
    code = [(k, repr(v)) for k, v in extra_config_in_source().items()]
    assert documented_keys() == code
