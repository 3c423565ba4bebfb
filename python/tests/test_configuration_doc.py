"""docs/CONFIGURATION.md against the vLLM connector: every ``kv_connector_extra_config`` key is listed, in
order, with ``repr()`` of its default, so the document cannot drift from ``EXTRA_CONFIG``."""

import pathlib

from kv_transfer.vllm.options import EXTRA_CONFIG

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADING = "## `kv_connector_extra_config` keys (vLLM connector)"


def documented_keys():
    lines = (ROOT / "docs" / "CONFIGURATION.md").read_text().splitlines()
    assert HEADING in lines, f"docs/CONFIGURATION.md has no section {HEADING!r}"
    rows = []
    for line in lines[lines.index(HEADING) + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("| `"):
            cells = [c.strip() for c in line.split("|")]
            rows.append((cells[1].strip("`"), cells[2].strip("`")))
    return rows


def test_every_extra_config_key_is_documented_with_its_default():
    code = [(k, repr(v)) for k, v in EXTRA_CONFIG.items()]
    assert documented_keys() == code
