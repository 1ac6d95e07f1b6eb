"""Each claim of :mod:`convlab.lab.claims` is a sentence of its chapter, word for word.

A claim's ``sentence`` is the book's sentence that its check tests: after
:func:`normalize` (MyST markup to plain text) it must occur in the markdown of its
chapter (``book/intro.md`` for ``"intro"``, the markdown cells of ``book/NN_*.ipynb``
otherwise), no two claims may state the same sentence, and each must be a whole
sentence or a whole clause of the book. The rule for that, checked on the normalized
text of one block (a paragraph, a list item, a heading): the claim starts where the
block starts or right after a ``.``, ``:``, ``;``, ``?`` or ``!`` (and a space), and its
own last character is one of those five, as in the book.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from convlab.lab.claims import CLAIMS

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
ENDS = ".:;?!"

# {role}`shown <target>` or {role}`shown`, and a plain `code` span.
_SPAN = re.compile(r"(\{[\w:.+-]+\})?`([^`]*)`")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_SYMBOLS = {"\u00d7": "x", "\u2192": "->", "\u2212": "-"}
# A line that starts a block of its own: a list item, a heading, a fence; a label line
# (``(name)=``) is a block of its own.
_BLOCK_START = re.compile(r"^\s*(?:[-*+]\s|\d+\.\s|#{1,6}\s|```|:::)")
_LABEL = re.compile(r"^\s*\(\S+\)=\s*$")


def _plain(text: str) -> str:
    """Text outside code spans: no emphasis, no ``$`` of inline math."""
    return text.replace("*", "").replace("$", "")


def normalize(text: str) -> str:
    """MyST markdown as plain text: a role shows its text (``{term}`x``` -> ``x``,
    ``{ref}`text <label>``` -> ``text``), a link its text, a code span its content;
    no ``*``/``**`` emphasis, inline math keeps its inner text, ``\u00d7``/``\u2192``/
    ``\u2212`` become ``x``/``->``/``-``, and whitespace runs become one space.

    >>> normalize("A {term}`pointwise <pw>` **1x1** `conv2d` [link](u) $N = 8$.")
    'A pointwise 1x1 conv2d link N = 8.'
    """
    text = _LINK.sub(r"\1", text)
    parts, last = [], 0
    for m in _SPAN.finditer(text):
        parts.append(_plain(text[last:m.start()]))
        shown = m.group(2)
        if m.group(1):
            shown = re.sub(r"\s*<[^<>]*>$", "", shown) or shown
        parts.append(shown)
        last = m.end()
    parts.append(_plain(text[last:]))
    out = "".join(parts)
    for k, v in _SYMBOLS.items():
        out = out.replace(k, v)
    return " ".join(out.split())


@cache
def chapter_markdown(chapter: int | str) -> str:
    """The markdown of a chapter: ``book/intro.md``, or a notebook's markdown cells."""
    if chapter == "intro":
        return (BOOK / "intro.md").read_text()
    [path] = sorted(BOOK.glob(f"{int(chapter):02d}_*.ipynb"))
    nb = json.loads(path.read_text())
    return "\n\n".join("".join(c["source"]) for c in nb["cells"]
                       if c["cell_type"] == "markdown")


def blocks(markdown: str) -> list[str]:
    """The normalized blocks of ``markdown``: split at blank lines and label lines, and
    before each line that starts a list item, a heading or a fence."""
    found: list[list[str]] = [[]]
    for line in markdown.splitlines():
        if not line.strip() or _LABEL.match(line) or _BLOCK_START.match(line):
            found.append([])
        if line.strip() and not _LABEL.match(line):
            found[-1].append(line)
    return [b for b in (normalize("\n".join(lines)) for lines in found) if b]


def whole(sentence: str, block: str) -> bool:
    """Whether ``sentence`` occurs in ``block`` as a whole sentence or clause."""
    if not sentence or sentence[-1] not in ENDS:
        return False
    start = block.find(sentence)
    while start != -1:
        before = block[:start].rstrip()
        if not before or before[-1] in ENDS:
            return True
        start = block.find(sentence, start + 1)
    return False


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.id for c in CLAIMS])
def test_the_claim_is_its_chapters_sentence(claim) -> None:
    sentence = normalize(claim.sentence)
    assert sentence in normalize(chapter_markdown(claim.chapter)), (
        f"{claim.id}: not in chapter {claim.chapter}: {sentence!r}")
    assert any(whole(sentence, b) for b in blocks(chapter_markdown(claim.chapter))), (
        f"{claim.id}: not a whole sentence or clause of chapter {claim.chapter}")


def test_no_two_claims_state_the_same_sentence() -> None:
    seen: dict[str, str] = {}
    twice = []
    for c in CLAIMS:
        key = normalize(c.sentence).lower()
        if key in seen:
            twice.append(f"{seen[key]} and {c.id}")
        seen.setdefault(key, c.id)
    assert not twice, "the same sentence twice: " + "; ".join(twice)


@pytest.mark.parametrize(("text", "plain"), [
    ("{py:func}`convlab.aten.backends.select_backend`", "convlab.aten.backends.select_backend"),
    ("{ref}`shown live <proof-mask-request>`", "shown live"),
    ("{doc}`03_dispatch`", "03_dispatch"),
    ("a $1{\\times}1$ kernel", "a 1{\\times}1 kernel"),
    ("`N*C*H*W > 20480` and **bold** *it*", "N*C*H*W > 20480 and bold it"),
    ("3 \u2192 16 at 224 \u00d7 224, \u22121", "3 -> 16 at 224 x 224, -1"),
    ("[#70042](https://github.com/pytorch/pytorch/issues/70042)\n  next", "#70042 next"),
])
def test_normalize(text: str, plain: str) -> None:
    assert normalize(text) == plain


def test_whole_sentence_rule() -> None:
    block = normalize("First one. Second: a clause; the last one.")
    assert whole("Second:", block) and whole("a clause;", block)
    assert whole("the last one.", block) and whole("First one.", block)
    assert not whole("one.", block) and not whole("Second: a clause", block)
