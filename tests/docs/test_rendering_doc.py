"""docs/rendering.md cannot drift from the code: its catalog of client markers is the
catalog's own table, and every template it names is one the project ships."""

from __future__ import annotations

from pathlib import Path

from prefixgate.cache.render import TEMPLATES, template_file
from prefixgate.hygiene.markers import MARKERS, known_marker, markers_table

DOC = Path(__file__).parents[2] / "docs" / "rendering.md"


def test_the_markers_catalog_in_the_docs_is_the_codes():
    text = DOC.read_text()
    start = text.index("<!-- markers:begin -->\n") + len("<!-- markers:begin -->\n")
    end = text.index("<!-- markers:end -->")
    assert text[start:end] == markers_table()


def test_each_marker_is_found_by_its_own_example_and_nothing_else():
    for m in MARKERS:
        assert known_marker(m.looks_like + "\nand the rest of the text") == m.name
    assert known_marker("You are a careful assistant. <total_tokens>x</total_tokens>") is None


def test_the_templates_ship_with_the_package():
    for name in TEMPLATES:
        assert template_file(name).is_file()
