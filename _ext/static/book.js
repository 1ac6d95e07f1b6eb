/* Small reader fixes for the book's theme (see _ext/book_html.py). */
(() => {
  "use strict";

  // Search highlights belong to the page opened from a search result only. Sphinx keeps
  // the terms in localStorage for whichever page opens next (a result or not), so here the
  // result links carry them in their URL (?highlight=, which Sphinx reads and then drops
  // from the address) and the stored copy is always cleared.
  const KEY = "sphinx_highlight_terms";
  const forget = () => { try { localStorage.removeItem(KEY); } catch (e) { /* blocked */ } };
  forget();
  const tagResults = (results) => {
    // Result titles are often long dotted names: break them after a "." (as in the text).
    addBreaks(results.querySelectorAll("li > a, li .context"));
    const terms = new URLSearchParams(window.location.search).get("q") || "";
    for (const link of results.querySelectorAll("a[href]")) {
      if (!terms || link.dataset.highlight) continue;
      const url = new URL(link.href, window.location.href);
      url.searchParams.set("highlight", terms);
      link.href = url.toString();
      link.dataset.highlight = "1";
    }
    forget();
  };

  // A tap on an entry of the phone drawers closes the drawer (the theme leaves it open).
  document.addEventListener("click", (event) => {
    const link = event.target.closest(".bd-sidebar-primary a[href], .bd-sidebar-secondary a[href]");
    if (!link) return;
    for (const id of ["pst-primary-sidebar-checkbox", "pst-secondary-sidebar-checkbox"]) {
      const box = document.getElementById(id);
      if (box && box.checked) box.checked = false;
    }
  });

  // Long identifiers (`convlab.lab.bench.check_threads(threads)`, a path) have no place
  // to wrap, so the browser would cut them anywhere: offer a break after ".", "/", "(",
  // "," and "=" instead (a <wbr>, which copies as nothing), and in a snake_case name
  // longer than LONG_WORD after its underscores. Never at the "." of a number or version
  // ("1.24", "SSE4.1", "2.11.0"): no break after a "." with a digit on either side.
  // Put a <wbr> between the parts of a text node (and after it, for a "tail").
  const replaceWithBreaks = (node, parts, tail) => {
    const fragment = document.createDocumentFragment();
    parts.forEach((part, i) => {
      if (i) fragment.append(document.createElement("wbr"));
      fragment.append(part);
    });
    if (tail) fragment.append(document.createElement("wbr"));
    node.replaceWith(fragment);
  };
  const BREAKABLE = ".bd-article :not(pre) > code, .bd-article dt.sig, .bd-article a, "
    + ".bd-article :is(h1, h2, h3, h4, h5, h6), .bd-sidebar-primary a, "
    + ".bd-sidebar-secondary a, .bd-article table td, .bd-article table th";
  const LONG_WORD = /[A-Za-z0-9_]{24,}/;
  const AFTER = /(?<=[/(,=]|(?<![0-9])\.(?![0-9]))(?=[^\s./(,=)])/;
  const AFTER_UNDERSCORE = /(?<=[/(,=]|(?<![0-9])\.(?![0-9])|[A-Za-z0-9]_)(?=[^\s./(,=)_])/;
  const addBreaks = (roots = document.querySelectorAll(BREAKABLE)) => {
    for (const root of roots) {
      if (root.closest("pre") || root.dataset.wbr) continue;
      root.dataset.wbr = "1";
      const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
      const nodes = [];
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        if (!n.parentElement.closest("pre, mjx-container")) nodes.push(n);
      }
      for (const node of nodes) {
        const text = node.textContent;
        // Headings use large type: there any snake_case name may break at underscores.
        const heading = node.parentElement.closest("h1, h2, h3, h4, h5, h6") !== null;
        const long = heading ? /[A-Za-z0-9]_[A-Za-z0-9]/.test(text) : LONG_WORD.test(text);
        const parts = text.split(long ? AFTER_UNDERSCORE : AFTER);
        // A signature is split over spans: "module." "name" "(" "arg": break after them.
        const tail = /[./(]$/.test(text);
        if (parts.length < 2 && !tail) continue;
        replaceWithBreaks(node, parts, tail);
      }
    }
  };

  // Code and printed output on a phone wrap (book.css) only at token boundaries: after ",",
  // an opening bracket, "=", "+", "." (not a number's), "/" and ":" (paths, operator
  // names, "jit:avx512_core"), and at spaces, never inside a name or a number (the browser
  // would otherwise cut `convolu|tion_backward` anywhere). A <wbr> marks each place: it copies as nothing and leaves the text as it
  // was. A run with no such place that is longer than the line scrolls in its box.
  const CODE_BREAK =
    /(?<=[,([{]|=(?!=)|(?<![0-9.])\.(?![0-9.])|[^/<]\/|:(?![:0-9])|\+(?![0-9]))(?=[^\s)\]},.:;=/+])/;
  const codeBreaks = (pre) => {
    if (pre.dataset.breaks) return;
    pre.dataset.breaks = "1";
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    const nodes = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode()) nodes.push(n);
    nodes.forEach((node, i) => {
      const parts = node.textContent.split(CODE_BREAK);
      // A token that ends in a break character (Pygments' "." or "(") breaks after itself
      // when the next piece of text starts a new token.
      const next = nodes[i + 1] ? nodes[i + 1].textContent : "";
      const tail = /(?:[,([{+:]|[^=!<>]=|(?<![0-9.])\.|[^/<]\/)$/.test(node.textContent)
        && /^[^\s)\]},.:;=/+0-9]/.test(next);
      if (parts.length < 2 && !tail) return;
      replaceWithBreaks(node, parts, tail);
    });
  };

  // Boxes that scroll sideways get the `scroll-x` cue (book.css), `scroll-end` at the end.
  const SCROLLERS = ".bd-article .pst-scrollable-table-container, .bd-article .table-wrapper, "
    + ".bd-article span.math, "
    + ".bd-article mjx-container[display='true'], .bd-article div.highlight pre, "
    + ".bd-article .cell_output .output pre";
  // How much of a box's content is out of view. Inline math is measured by its rendering
  // (mjx-container): MathJax's hidden assistive MathML adds 2-40 px to scrollWidth.
  const overflow = (box) => {
    if (!box.matches("span.math")) return box.scrollWidth - box.clientWidth;
    const jax = box.querySelector("mjx-container");
    return jax ? jax.getBoundingClientRect().width - box.clientWidth : 0;
  };
  const mark = (box) => {
    const wide = overflow(box) > 1;
    box.classList.toggle("scroll-x", wide);
    const end = box.scrollLeft > 0 && box.scrollLeft + box.clientWidth >= box.scrollWidth - 1;
    box.classList.toggle("scroll-end", wide && end);
  };
  const markAll = () => document.querySelectorAll(SCROLLERS).forEach(mark);
  document.addEventListener("scroll", (event) => {
    if (event.target instanceof Element && event.target.classList.contains("scroll-x")) {
      mark(event.target);
    }
  }, true);

  // Tables on a phone: a table that does not fit its column, squeezes a column below
  // MIN_COLUMN px or wraps a cell onto more than MAX_CELL_LINES lines is shown stacked
  // (book.css: one card per row, each cell under its column's name), so no column is a
  // sliver and nothing has to be scrolled to. Each cell gets its column's name once.
  const PHONE_TABLES = window.matchMedia("(max-width: 600px)");
  const MIN_COLUMN = 60;
  const MAX_CELL_LINES = 4;
  const TABLES = ".bd-article table:not(.indextable)";
  const labelCells = (table) => {
    if (table.dataset.labelled) return;
    table.dataset.labelled = "1";
    const head = table.tHead && table.tHead.rows[0];
    if (!head) return;
    const names = [...head.cells].map((th) => th.innerText.trim());
    for (const body of table.tBodies) {
      for (const row of body.rows) {
        [...row.cells].forEach((td, i) => {
          if (names[i]) td.dataset.label = names[i];
        });
      }
    }
  };
  const squeezed = (table) => {
    const box = table.closest(".pst-scrollable-table-container, .table-wrapper")
      || table.parentElement;
    if (table.getBoundingClientRect().width > box.clientWidth + 1) return true;
    for (const body of table.tBodies) {
      for (const row of body.rows) {
        for (const td of row.cells) {
          const line = parseFloat(getComputedStyle(td).lineHeight) || 24;
          const r = td.getBoundingClientRect();
          if (r.width < MIN_COLUMN || r.height > (MAX_CELL_LINES + 0.5) * line + 16) {
            return true;
          }
        }
      }
    }
    return false;
  };
  const stackTables = () => {
    for (const table of document.querySelectorAll(TABLES)) {
      if (table.closest(".sig, dl.field-list") || !table.tHead) continue;
      labelCells(table);
      table.classList.remove("stacked");
      if (PHONE_TABLES.matches && squeezed(table)) table.classList.add("stacked");
    }
  };

  // Code on a phone: each source line becomes a `code-line` span (its text unchanged, so
  // copying copies the same code) that book.css wraps below 600 px with a hanging indent:
  // a continuation starts four columns right of its line's own indentation, as a Python
  // continuation line would. Pygments' token spans can hold a newline (a docstring), so
  // the text is split node by node and each piece keeps copies of its token spans.
  const CODE = ".bd-article div.highlight pre";
  const splitLines = (pre) => {
    if (pre.dataset.lines || pre.closest(".cell_output")) return;
    pre.dataset.lines = "1";
    const lines = [[]];
    const walk = (node, chain) => {
      for (const child of node.childNodes) {
        if (child.nodeType === Node.ELEMENT_NODE) {
          walk(child, [...chain, child]);
        } else if (child.nodeType === Node.TEXT_NODE) {
          child.textContent.split("\n").forEach((part, i) => {
            if (i) {
              lines[lines.length - 1].push(["\n", chain]);
              lines.push([]);
            }
            if (part) lines[lines.length - 1].push([part, chain]);
          });
        }
      }
    };
    walk(pre, []);
    const fragment = document.createDocumentFragment();
    for (const pieces of lines) {
      if (!pieces.length) continue;
      const line = document.createElement("span");
      line.className = "code-line";
      const text = pieces.map(([part]) => part).join("");
      line.style.setProperty("--indent", String(text.length - text.trimStart().length));
      for (const [part, chain] of pieces) {
        let node = document.createTextNode(part);
        for (const outer of [...chain].reverse()) {
          const copy = outer.cloneNode(false);
          copy.append(node);
          node = copy;
        }
        line.append(node);
      }
      fragment.append(line);
    }
    pre.replaceChildren(fragment);
  };

  // Long outputs fold to their first lines, with a button to show all of them.
  const FOLD_LINES = 30;
  const fold = () => {
    for (const pre of document.querySelectorAll(".bd-article .cell_output .output pre")) {
      if (pre.dataset.foldable) continue;
      const lines = pre.textContent.replace(/\n$/, "").split("\n").length;
      if (lines <= FOLD_LINES) continue;
      pre.dataset.foldable = "1";
      const box = pre.closest("div.highlight") || pre;
      box.classList.add("output-folded");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "output-fold";
      const label = () => box.classList.contains("output-folded")
        ? `Show all ${lines} lines` : "Fold this output";
      button.textContent = label();
      button.setAttribute("aria-expanded", "false");
      button.addEventListener("click", () => {
        box.classList.toggle("output-folded");
        button.textContent = label();
        button.setAttribute("aria-expanded", String(!box.classList.contains("output-folded")));
        markAll();
      });
      box.after(button);
    }
  };

  const ready = () => {
    const results = document.getElementById("search-results");
    if (results) {
      new MutationObserver(() => tagResults(results)).observe(
        results, {childList: true, subtree: true});
    }
    addBreaks();
    document.querySelectorAll(CODE).forEach(splitLines);
    document.querySelectorAll(".bd-article div.highlight pre, .bd-article .cell_output pre")
      .forEach(codeBreaks);
    fold();
    stackTables();
    markAll();
    window.addEventListener("resize", () => {
      stackTables();
      markAll();
    });
    // Printing a page: folded content prints open (book.css hides the toggles in print).
    window.addEventListener("beforeprint", () => {
      document.querySelectorAll(".bd-article details").forEach((d) => { d.open = true; });
    });
  };
  // MathJax loads and typesets after the page: mark its equations once it is done.
  const afterMath = (tries) => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(markAll);
    } else if (tries > 0 && document.querySelector(".math")) {
      setTimeout(() => afterMath(tries - 1), 200);
    }
  };
  window.addEventListener("load", () => {
    stackTables();
    markAll();
    afterMath(75);
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
