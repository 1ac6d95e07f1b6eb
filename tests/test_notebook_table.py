"""convlab.lab.notebook.Table: plain text, Markdown, and the optional caption and label."""

from __future__ import annotations

import pytest

from convlab.lab.notebook import Table


def test_without_caption_is_a_plain_markdown_table() -> None:
    table = Table(["a", "b"], [[1, "x|y"]])
    assert table._repr_markdown_() == "| a | b |\n|---|---|\n| 1 | x\\|y |"
    assert repr(table) == "a | b\n- | ---\n1 | x|y"


def test_caption_makes_a_myst_table_directive_and_a_first_text_line() -> None:
    table = Table(["a"], [["`x`"]], caption="A `code` caption", label="tbl-demo")
    markdown = table._repr_markdown_().splitlines()
    assert markdown[0] == ":::{table} A `code` caption"
    assert markdown[1] == ":name: tbl-demo"
    assert markdown[2:-1] == ["| a |", "|---|", "| `x` |"]
    assert markdown[-1] == ":::"
    assert repr(table).splitlines()[0] == "A `code` caption"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"caption": ""}, ValueError),
        ({"caption": "two\nlines"}, ValueError),
        ({"caption": 3}, TypeError),
        ({"label": "tbl-x"}, ValueError),
        ({"caption": "c", "label": "has space"}, ValueError),
    ],
)
def test_bad_caption_or_label_is_refused(kwargs: dict, error: type) -> None:
    with pytest.raises(error, match="caption|label"):
        Table(["a"], [[1]], **kwargs)


def test_row_of_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rows\[0\]"):
        Table(["a", "b"], [[1]])
