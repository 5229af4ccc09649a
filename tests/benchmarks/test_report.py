"""The README's benchmark block: written between its markers by a whole `make bench` run."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.report import README, README_BEGIN, README_END, readme_block, rewrite_marked  # noqa: E402
from bench.table import Row  # noqa: E402


def test_the_block_between_the_markers_is_replaced_and_nothing_else():
    text = f"# etserve\n\nintro\n{README_BEGIN}\nold table\nold line\n{README_END}\n\n## Next\n"
    out = rewrite_marked(text, "new table\n")
    assert out == f"# etserve\n\nintro\n{README_BEGIN}\nnew table\n{README_END}\n\n## Next\n"
    assert rewrite_marked(out, "new table") == out  # rewriting is idempotent


def test_without_both_markers_the_text_is_kept():
    for text in ("no markers", f"{README_BEGIN}\nonly the start", f"{README_END}\n{README_BEGIN}\nswapped"):
        assert rewrite_marked(text, "table") == text


def test_the_block_holds_the_rows_against_llamacpp_and_the_host():
    rows = [Row("decode vs llama.cpp", "tok/s ...", "80.1 / 70.2", 1.141, (">=", 1.0)),
            Row("http overhead", "ms", "1.2 / 1.0", 1.2),
            Row("fim vs llama.cpp", "not run", "not built")]
    block = readme_block(rows, "2026-12-03, Some CPU")
    assert "2026-12-03, Some CPU" in block
    assert "| decode vs llama.cpp | 80.1 / 70.2 | 1.14 | ≥ 1 | yes |" in block
    assert "http overhead" not in block and "fim vs llama.cpp" not in block  # not the peer's; not measured


def test_the_readme_has_the_markers():
    text = README.read_text()
    assert text.count(README_BEGIN) == 1 and text.index(README_BEGIN) < text.index(README_END)
