"""Local Sphinx extension: what the search page needs to rank chapters by relevance.

Sphinx's index says only *whether* a page has a word, so every chapter that mentions a
term once tied with the chapter about it, and ties came out in title order ("1., 10.,
13., 3."). ``_static/search_data.js`` (loaded by the search page only) gives
``_ext/search_scorer.js``, per chapter and the landing page:

* ``title`` and ``headings``: the page title and its section titles (not table or figure
  captions);
* ``words``: how often each word occurs on each of those pages, weighted by where: 3 in
  the text, 1 in code, 0.2 in a cell's output (a table of records that repeats a name 200
  times says less than a paragraph that explains it); words weighing under 1 are left out;

and ``glossary``: each glossary term, lower case, with the chapters its entry links to.

Enabled in ``_config.yml`` under ``sphinx: local_extensions: {book_search: _ext}``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx

DATA = "search_data.js"
CHAPTER = re.compile(r"^book/\d\d_")
LANDING = "book/intro"
GLOSSARY = "book/glossary"
WORD = re.compile(r"\w+")
WEIGHT = {"text": 3.0, "code": 1.0, "output": 0.2}
SKIP = (nodes.math, nodes.math_block, nodes.raw, nodes.comment, nodes.system_message,
        nodes.target)


def zone(node: nodes.Node) -> str | None:
    """Where a text node sits: "text", "code" (a cell's source, a code block), "output"
    (what a cell printed or displayed), or None (math, raw HTML, comments)."""
    current = node.parent
    found = "text"
    while current is not None:
        if isinstance(current, SKIP):
            return None
        element = current.get("nb_element") if isinstance(current, nodes.Element) else None
        if element == "cell_code_output":
            return "output"
        if element == "cell_code_source" or isinstance(current, nodes.literal_block):
            found = "code"
        current = current.parent
    return found


def page_data(doctree: nodes.document, title: str) -> dict[str, Any]:
    """A page's title, section titles and weighted word counts."""
    headings = [
        section[0].astext().strip()
        for section in doctree.findall(nodes.section)
        if section.children and isinstance(section[0], nodes.title)
    ]
    counts: Counter[str] = Counter()
    for text in doctree.findall(nodes.Text):
        where = zone(text)
        if where is None:
            continue
        for word in WORD.findall(text.astext().lower()):
            counts[word] += WEIGHT[where]
    words = {w: round(c) for w, c in sorted(counts.items()) if c >= 1 and not w.isdigit()}
    return {"title": title, "headings": [h for h in headings if h != title], "words": words}


def glossary_links(doctree: nodes.document, glossary: str) -> dict[str, list[str]]:
    """Each glossary term (lower case) and the documents its entry links to ({doc})."""
    base = glossary.rsplit("/", 1)[0]
    links: dict[str, list[str]] = {}
    for item in doctree.findall(nodes.definition_list_item):
        terms = [t.astext().strip().lower() for t in item.findall(nodes.term)]
        docs = []
        for ref in item.findall(addnodes.pending_xref):
            if ref.get("reftype") != "doc":
                continue
            target = str(ref.get("reftarget", ""))
            doc = target.lstrip("/") if target.startswith("/") else f"{base}/{target}"
            if doc not in docs:
                docs.append(doc)
        for term in terms:
            if docs:
                links[term] = docs
    return links


def search_data(app: Sphinx) -> dict[str, Any]:
    """``{"pages": {docname: {title, headings}}, "words": {word: [docname index, weight,
    ...]}, "glossary": {term: [docname, ...]}}`` (indices into the pages in order)."""
    env = app.env
    pages, words = {}, {}
    for docname in sorted(env.found_docs):
        if CHAPTER.match(docname) or docname == LANDING:
            title = env.titles[docname].astext().strip() if docname in env.titles else ""
            data = page_data(env.get_doctree(docname), title)
            for word, weight in data.pop("words").items():
                words.setdefault(word, []).extend([len(pages), weight])
            pages[docname] = data
    glossary = {}
    if GLOSSARY in env.found_docs:
        glossary = glossary_links(env.get_doctree(GLOSSARY), GLOSSARY)
    return {"pages": pages, "words": words, "glossary": glossary}


def add_search_data(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """On the search page only: write ``_static/search_data.js`` and load it."""
    if pagename != "search" or app.builder.name != "html":
        return
    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    text = json.dumps(search_data(app), ensure_ascii=False, separators=(",", ":"))
    (static / DATA).write_text(f"var BOOK_SEARCH = {text};\n", encoding="utf-8")
    context.setdefault("script_files", []).append(f"_static/{DATA}")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", add_search_data)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
