"""sensitivity printed ``inf`` with no word of why: the residual Add alone in INT8 has no Q/DQ
(quantize gives its residual input Q/DQ only beside the quantized conv before it), so that view
quantized nothing and its outputs equal FP32's."""

from __future__ import annotations

import json
import re


def test_a_view_that_quantized_nothing_says_why(run_cli, cnn_path, cnn_data, tmp_path):
    out = tmp_path / "s.json"
    code, _, err = run_cli("sensitivity", cnn_path, "--data", cnn_data, "--calib-data", cnn_data,
                           "-m", "minmax", "--max-samples", "8", "--json", out)  # fmt: skip
    assert code == 0, err
    rows = {r["node"]: r for r in json.loads(out.read_text())["rows"]}
    adds = [n for n, r in rows.items() if r["op_type"] == "Add"]
    assert adds and all(rows[n]["only_quantized_nodes"] == 0 for n in adds)
    text = " ".join(err.split())
    for node in adds:
        assert re.search(rf"{re.escape(node)} — / \d", text), text
    assert not re.search(r" inf / | / inf\b", text)
    assert "—: no op was quantized in that view" in text
