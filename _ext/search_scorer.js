/* Search ranking for the book (Sphinx's html_search_scorer; _ext/book_html.py sets it).
 *
 * Sphinx ranks an API object (score 11-16) and a second glossary entry that merely contains
 * the query ("aten::convolution_backward" for "convolution_backward") above the chapters
 * that use the name (5-15), so a reader's top three were glossary and API entries and the
 * first chapter came ninth. Here: the glossary entry whose term is exactly the query first
 * (any other glossary hit last), then the chapters (section titles before plain text hits),
 * then the landing page, then everything else. Sphinx's order holds within each tier.
 */
// The anchors of the glossary entries whose term is exactly the query (lower case).
const glossaryAnchors = (query) => {
  // searchtools.js declares `const Search`: a global binding, not a window property.
  const index = typeof Search === "undefined" ? null : Search._index;
  if (!index || !index.indexentries) return [];
  return (index.indexentries[query] || [])
    .filter(([file]) => index.docnames[file] === "book/glossary")
    .map(([, id]) => "#" + id);
};

var Scorer = {
  score: (result) => {
    const [docname, , anchor, , score] = result;
    const query = (new URLSearchParams(window.location.search).get("q") || "")
      .trim().toLowerCase();
    if (docname === "book/glossary") {
      const exact = glossaryAnchors(query);
      if (exact.includes(anchor)) return 1000 + score;
      // The term's own entry leads: other glossary hits (the page, longer terms) go last.
      return exact.length ? score - 1000 : score;
    }
    if (/^book\/\d\d_/.test(docname)) return 500 + score;
    if (docname === "book/intro") return 400 + score;
    return score;
  },

  // Sphinx's defaults (this object replaces searchtools.js's own Scorer).
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: {0: 15, 1: 5, 2: -5},
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
