/* Search ranking for the book (Sphinx's html_search_scorer; _ext/book_html.py sets it).
 *
 * Sphinx's index says only whether a page has a word: every chapter that mentions a term
 * tied with the chapter about it, ties came out in title order ("1., 10., 13., 3."), a
 * page came twice (once for itself, once for a section), and the snippets quoted the
 * print-only contents list and raw TeX. Here, with the per-chapter data of
 * _ext/book_search.py (_static/search_data.js, `BOOK_SEARCH`):
 *
 * 1. the glossary entry whose term is exactly the query (any other glossary hit last);
 * 2. the chapters, by relevance: the glossary entry of the query links to the chapter
 *    (400), the query is in its title (300), in its section titles (100 each, up to 3),
 *    then how often its words occur (text counts 3, code 1, printed output 0.2);
 * 3. the landing page, then everything else, in Sphinx's order.
 *
 * One result per page (the best one), snippets from the text around the query as typed,
 * and a hyphenated or dotted query ("per-sample", "derivatives.yaml") highlighted whole.
 */
const bookQuery = () => (new URLSearchParams(window.location.search).get("q") || "")
  .trim().toLowerCase();
const bookIndex = () => (typeof Search === "undefined" ? null : Search._index);
const bookData = () => (typeof BOOK_SEARCH === "undefined" ? null : BOOK_SEARCH);
const bookNorm = (text) => text.toLowerCase().replace(/[\s-]+/g, " ").trim();
const bookWords = (text) => text.toLowerCase().match(/[\p{L}\p{N}_]+/gu) || [];
// The query as a phrase: whole words ("cudnn" is not in "cudnn_convolution"), any run of
// spaces or hyphens between them.
const bookPhrase = (query) => new RegExp(
  "(?<![\\p{L}\\p{N}_])"
  + bookNorm(query).replace(/[.*+?^${}()|[\]\\]/g, "\\$&").replace(/ /g, "[\\s-]+")
  + "(?![\\p{L}\\p{N}_])", "u");

// The anchors of the glossary entries whose term is exactly the query (lower case).
const glossaryAnchors = (query) => {
  // searchtools.js declares `const Search`: a global binding, not a window property.
  const index = bookIndex();
  if (!index || !index.indexentries) return [];
  return (index.indexentries[query] || [])
    .filter(([file]) => index.docnames[file] === "book/glossary")
    .map(([, id]) => "#" + id);
};

// How much a chapter (or the landing page) is about the query.
const bookRelevance = (docname, query) => {
  const data = bookData();
  const page = data && data.pages[docname];
  if (!page || !query) return 0;
  const phrase = bookPhrase(query);
  let score = 0;
  if ((data.glossary[query] || []).includes(docname)) score += 400;
  if (phrase.test(bookNorm(page.title))) score += 300;
  score += 100 * Math.min(3, page.headings.filter((h) => phrase.test(bookNorm(h))).length);
  const index = Object.keys(data.pages).indexOf(docname);
  const weight = (word) => {
    const entry = data.words[word] || [];
    for (let i = 0; i < entry.length; i += 2) if (entry[i] === index) return entry[i + 1];
    return 0;
  };
  const words = bookWords(query);
  const often = words.length ? Math.min(...words.map(weight)) : 0;
  return score + 20 * Math.log2(1 + often);
};

var Scorer = {
  score: (result) => {
    const [docname, , anchor, , score] = result;
    const query = bookQuery();
    if (docname === "book/glossary") {
      const exact = glossaryAnchors(query);
      if (exact.includes(anchor)) return 100000 + score;
      // The term's own entry leads: other glossary hits (the page, longer terms) go last.
      return exact.length ? score - 1000 : score;
    }
    if (/^book\/\d\d_/.test(docname)) return 10000 + bookRelevance(docname, query) + score / 100;
    if (docname === "book/intro") return 5000 + bookRelevance(docname, query) + score / 100;
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

if (typeof Search !== "undefined") {
  // One result per page: the best scoring one (a section hit keeps its anchor). Results
  // are in ascending order (searchtools.js shows the last first).
  const performSearch = Search._performSearch;
  Search._performSearch = (...args) => {
    const results = performSearch(...args);
    const best = new Map();
    for (const result of results) {
      const kept = best.get(result[0]);
      if (!kept || result[4] > kept[4]
          || (result[4] === kept[4] && result[2] && !kept[2])) best.set(result[0], result);
    }
    return results.filter((result) => best.get(result[0]) === result);
  };

  // Highlight the query's words as typed, split at spaces only: "per-sample" whole, not
  // "per" inside "property".
  const parseQuery = Search._parseQuery;
  Search._parseQuery = (query) => {
    const parsed = parseQuery(query);
    const whole = query.trim().toLowerCase().split(/\s+/).filter((w) => w);
    parsed[3] = new Set(whole);
    return parsed;
  };

  // Snippets from the reader's text: not the print-only contents list, the labelled
  // buttons or the header links; math shown as "…" instead of raw TeX. With `prose`, the
  // code cells and their outputs are left out too.
  Search.htmlToText = (htmlString, anchor, prose = false) => {
    const html = new DOMParser().parseFromString(htmlString, "text/html");
    const drop = ".headerlink, script, style, #jb-print-docs-body, .book-actions, "
      + ".bd-header-article, .prev-next-area, .toc-entry, details.hide > summary"
      + (prose ? ", div.cell, div.highlight, table" : "");
    html.querySelectorAll(drop).forEach((el) => el.remove());
    html.querySelectorAll(".math, mjx-container").forEach((el) => el.replaceWith("…"));
    const main = html.querySelector('[role="main"]');
    const block = (anchor && main && main.querySelector(anchor)) || main;
    return block ? block.textContent.replace(/\s+/g, " ") : "";
  };

  // The snippet starts near the first place the query occurs as typed (as a phrase) in
  // the text, else in code or output, else near a word of it.
  Search.makeSearchSummary = (htmlText, keywords, anchor) => {
    const query = bookQuery();
    let text = Search.htmlToText(htmlText, anchor, true);
    let found = query ? text.search(bookPhrase(query)) : -1;
    if (found < 0) {
      text = Search.htmlToText(htmlText, anchor);
      found = query ? text.search(bookPhrase(query)) : -1;
    }
    if (!text) return null;
    const lower = text.toLowerCase();
    const start = found > -1 ? found : [...keywords]
      .map((k) => lower.indexOf(k.toLowerCase())).filter((i) => i > -1).sort((a, b) => a - b)[0];
    const from = Math.max((start || 0) - 80, 0);
    const summary = document.createElement("p");
    summary.classList.add("context");
    summary.textContent = (from ? "..." : "") + text.substr(from, 240).trim()
      + (from + 240 < text.length ? "..." : "");
    return summary;
  };
}
