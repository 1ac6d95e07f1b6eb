/* Small reader fixes for the book's theme (see _ext/book_html.py). */
(() => {
  "use strict";

  // Search highlights belong to the page opened from the search results only: the search
  // page stores its terms for the next page, whichever it is, so drop them otherwise.
  try {
    const fromSearch = /\/search\.html/.test(document.referrer || "");
    const fromUrl = new URL(window.location).searchParams.has("highlight");
    if (!fromSearch && !fromUrl) localStorage.removeItem("sphinx_highlight_terms");
  } catch (e) { /* storage may be blocked: nothing to clear */ }

  // A tap on an entry of the phone drawers closes the drawer (the theme leaves it open).
  document.addEventListener("click", (event) => {
    const link = event.target.closest(".bd-sidebar-primary a[href], .bd-sidebar-secondary a[href]");
    if (!link) return;
    for (const id of ["pst-primary-sidebar-checkbox", "pst-secondary-sidebar-checkbox"]) {
      const box = document.getElementById(id);
      if (box && box.checked) box.checked = false;
    }
  });

  // Boxes that scroll sideways get the `scroll-x` cue (book.css), `scroll-end` at the end.
  const SCROLLERS = ".bd-article .pst-scrollable-table-container, .bd-article .table-wrapper, "
    + ".bd-article mjx-container[display='true'], .bd-article div.highlight pre, "
    + ".bd-article .cell_output .output pre";
  const mark = (box) => {
    const wide = box.scrollWidth > box.clientWidth + 1;
    box.classList.toggle("scroll-x", wide);
    box.classList.toggle("scroll-end", wide && box.scrollLeft + box.clientWidth >= box.scrollWidth - 2);
  };
  const markAll = () => document.querySelectorAll(SCROLLERS).forEach(mark);
  document.addEventListener("scroll", (event) => {
    if (event.target instanceof Element && event.target.classList.contains("scroll-x")) {
      mark(event.target);
    }
  }, true);

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
    fold();
    markAll();
    window.addEventListener("resize", markAll);
  };
  // MathJax typesets after the page loads: mark its equations once it is done.
  window.addEventListener("load", () => {
    markAll();
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(markAll);
    }
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
