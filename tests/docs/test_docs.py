"""The documentation stays a user's: a short README without dated lines, and generated pages
that match the code they are generated from. Fast: reads files, starts nothing."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from app.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.report import rewrite_marked  # noqa: E402  (the README's generated block, taken out below)

README = ROOT / "README.md"
DOCS = ROOT / "docs"
DATED = re.compile(r"20\d\d-\d\d-\d\d|\d\d:\d\d UTC")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move reference material into docs/"


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    assert text.index("make serve") < text.index("make test") < 600


def test_readme_has_no_dated_lines():
    """No hand-written dates: the one dated line is the benchmark block `make bench` writes between
    its markers (bench/report.py), which is taken out before the check."""
    text = rewrite_marked(README.read_text(), "")
    dated = [f"{i}: {line}" for i, line in enumerate(text.splitlines(), 1) if DATED.search(line)]
    assert not dated, "dated measurements belong in CHANGELOG.md:\n" + "\n".join(dated)


def test_docs_pages_have_no_dated_lines():
    """History goes to CHANGELOG.md; the generated benchmark page is the one exception."""
    for page in DOCS.glob("*.md"):
        if page.name == "benchmarks.md":
            continue
        dated = [line for line in page.read_text().splitlines() if DATED.search(line)]
        assert not dated, f"{page.name}: {dated}"


def test_settings_page_matches_its_generator():
    gen = _load(DOCS / "gen_settings.py", "_gen_settings")
    assert (DOCS / "settings.md").read_text() == gen.render(), (
        "docs/settings.md has drifted from app/settings.py: run `.venv/bin/python docs/gen_settings.py`")


def test_every_setting_is_documented():
    page = (DOCS / "settings.md").read_text()
    missing = [s.env for s in SETTINGS if f"`{s.env}`" not in page or f"`{s.flag}`" not in page]
    assert not missing, f"not in docs/settings.md: {missing}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page, plus explicit <a id=...> ones."""
    text = page.read_text()
    out = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+\s+(.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_readme_and_docs_links_resolve():
    """Every relative link in README.md and docs/*.md names a file of the checkout, and a
    #fragment into a markdown page names one of its headings."""
    link = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")
    broken = []
    for page in [README, *DOCS.glob("*.md")]:
        for target, fragment in link.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = page.parent / target if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
            elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
                broken.append(f"{page.relative_to(ROOT)} -> {target}#{fragment}")
    assert not broken, broken
