"""The benchmark harness records a run without losing what RESULTS.md says below its table."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.__main__ import write_results  # noqa: E402  (the repository's, not installed)


def test_a_run_replaces_the_table_and_keeps_the_written_sections(tmp_path):
    path = str(tmp_path / "RESULTS.md")
    write_results(path, "# Benchmark results\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    with open(path, "a") as f:
        f.write("\n## A session\n\nmeasured by hand\n\n## Another\n\nmore\n")
    write_results(path, "# Benchmark results\n\n| a | b |\n|---|---|\n| 3 | 4 |\n\n"
                        "_Partial run (peers)._\n")
    text = open(path).read()
    assert "| 3 | 4 |" in text and "| 1 | 2 |" not in text
    assert text.index("_Partial run (peers)._") < text.index("## A session")
    assert text.endswith("## A session\n\nmeasured by hand\n\n## Another\n\nmore\n")
    assert not (tmp_path / "RESULTS.md.tmp").exists()
