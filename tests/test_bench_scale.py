"""`bench/scale.py` (run by `make bench`): a small run end to end, so the bench keeps working as the code under it
changes: the API double with churn, `extender serve` against it, both scenarios, every pod that fits placed, the
report."""

from __future__ import annotations

import pytest

from bench import scale


def test_a_small_run_places_every_pod_and_reports_each_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert scale.main(["--nodes", "12", "--pods", "6", "--churn", "50", "--other-pods", "2"]) == 0
    printed = capsys.readouterr()
    assert "API double: 12 nodes" in printed.err
    rows = [line for line in printed.out.splitlines() if line.startswith(("| three shapes", "| varied"))]
    assert len(rows) == 2, printed.out
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        # Pods placed, and refused because the filter passed no node: of 4, 8 and 16 GiB every one fits here;
        # of shapes up to 39 GiB and 8 cpus, one may find no GPU free enough on these 12 nodes.
        placed, refused = int(cells[1]), int(cells[2])
        assert placed + refused == 6 and placed >= 1, row
        if row.startswith("| three shapes"):
            assert refused == 0, row
        assert float(cells[11]) >= 0 and float(cells[13]) > 0, row  # the loop's longest hold, RSS
