"""bench/scaling.py's table, rendered from a committed result (no training runs)."""

from __future__ import annotations

import json

from bench_scripts import BENCH, load

RESULT = BENCH / "results" / "scaling_2026-11-23b.json"


def _scaling():
    return load("scaling")


def test_table_ratios_against_the_first_case():
    cases = json.loads(RESULT.read_text())["cases"]
    rows = {(r[0], r[1]): r for r in (line.split(" | ") for line in _scaling().render_table(cases, "t")[5:])}
    # 16 x 512 against 16 x 128: 4.83 / 2.56 ms per counted token; a cost proportional to the completion
    # tokens would give (3,730 / 5,682) / (1,280 / 3,232) = 1.657x
    row = rows[("| 16", "512")]
    assert row[5:8] == ["4.83", "1.89x", "1.66x"]
    assert row[-3] == "NO"  # 1.89x is over the 1.5x target
    assert rows[("| 256", "512")][5:8] == ["3.38", "1.32x", "1.58x"]
    assert rows[("| 16", "128")][6:8] == ["1.00x", "1.00x"]
    # per distinct token, each 122-token prompt once (1,944 and 1,960 counted prompt tokens / n = 8):
    # 16 x 128: 9.839 s / (1,453 + 243) and 6.799 s / (1,107 + 245) -> 5.80, 5.03 ms, median 5.42;
    # 16 x 512: 22.869 s / (2,774 + 243) and 32.002 s / (4,687 + 245) -> 7.58, 6.49 ms, median 7.03 (1.30x)
    assert rows[("| 16", "128")][8:10] == ["5.42", "1.00x"]
    assert row[8:10] == ["7.03", "1.30x"]
