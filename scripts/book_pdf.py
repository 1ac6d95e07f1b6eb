"""Print the whole book to one PDF with the system Chromium (``make pdf``).

Builds the book as a single HTML page (Sphinx's ``singlehtml`` builder keeps the chapter
and figure numbers), serves it on 127.0.0.1, waits for MathJax, and prints it with
Playwright's ``page.pdf`` driving ``/usr/bin/chromium`` (``playwright install`` is not
needed). The print stylesheet (``_ext/static/book.css``) wraps long code lines instead of
cutting them, leaves out the web controls ("Show code cell source" toggles, buttons) and
keeps each figure on one page with its caption. Folded content prints open; each chapter's
exercise solutions print at the chapter's end (``SOLUTIONS_JS``). The API
reference and the Records appendix are left out of the reader's PDF (``ONLINE_ONLY``): one
paragraph points to each on the site, and links into them go there (``--with-appendices``
keeps them, after the chapters).
Each chapter opens a page; the outline (bookmarks) has the book's title, the chapters and
the appendices at its top level; no link points to the print server or a local file (a
figure's link to its own image goes, a page of the book becomes its anchor, other files of
the build their page on the site); SVG figure text prints at 8 pt or more.
Writes ``_build/pdf/book.pdf`` and refuses one with a near-blank page (a code box or
table kept whole and moved to the next page), a figure text under 8 pt, a local link, a
chapter that starts below a page's top or an outline that is not the chapters
(:func:`check_pdf`); the next ``make book`` links it from every page.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
OUT = ROOT / "_build" / "pdf" / "book.pdf"
CONFIG = ROOT / "_config.yml"
# The parts of the book that stay on the site (``_toc.yml`` docs, with their sub-pages):
# the singlehtml marker of each first page, the title its one-paragraph note keeps in the
# outline, and what the note says is there. The API reference was 35 % of the pages and
# the Records appendix (every record's every table) about 130 more.
ONLINE_ONLY = (
    ("book/api", "API reference",
     "The API reference of convlab (every module, function and class)"),
    ("book/records", "Records",
     "Every measurement record (a page per machine, every section of each record)"),
)
# Texts of web controls that must not print.
WEB_CONTROLS = ("Show code cell", "Hide code cell", "Hide the solution", "Copy to clipboard")
# Runs in the page before printing: folded content opens (sphinx-togglebutton's admonitions
# and <details>); each online-only part goes, a note with its title and its address taking
# its place and its links pointing to the site; links to anchors of this document become
# links inside the PDF.
PREPARE_JS = """
([parts, site, rootPage]) => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  const moved = new Map();
  const removed = {};
  for (const [first, title, what] of parts) {
    const start = document.getElementById('document-' + first);
    if (!start) { removed[first] = 0; continue; }
    const block = [start];
    for (let n = start.nextElementSibling; n; n = n.nextElementSibling) {
      if (n.matches('span[id^="document-"]') && n.id !== 'document-' + first
          && !n.id.startsWith('document-' + first + '/')) break;
      block.push(n);
    }
    let doc = first;
    for (const root of block) {
      for (const e of [root, ...root.querySelectorAll('[id]')]) {
        if (e.id.startsWith('document-')) doc = e.id.slice('document-'.length);
        if (e.id) moved.set(e.id, e.id.startsWith('document-') ? site + doc + '.html'
                                                                : site + doc + '.html#' + e.id);
      }
    }
    const note = document.createElement('section');
    note.id = first.replace(/\\W/g, '-') + '-online';
    note.className = 'online-only';
    // An h2 (the theme hides the first h1 of a section in print), at the outline's top.
    note.innerHTML = '<h2 aria-level="1">' + title + '</h2><p>' + what
      + ' is on the web site: <a href="' + site + first + '.html">' + site + first
      + '.html</a>.</p>';
    // A marker of its own, so the chapter before it ends there (its solutions, the
    // page break of book.css) and no link to the part finds it.
    const marker = document.createElement('span');
    marker.id = 'document-online/' + first;
    start.before(marker, note);
    block.forEach(n => n.remove());
    removed[first] = block.length;
  }
  let retargeted = 0;
  for (const a of document.querySelectorAll('a[href]')) {
    const url = new URL(a.href, location.href);
    const id = decodeURIComponent(url.hash.slice(1));
    if (!id || url.origin !== location.origin) continue;
    if (moved.has(id)) { a.href = moved.get(id); retargeted++; }
    else if (document.getElementById(id)) a.setAttribute('href', '#' + id);
  }
  // No link may point at the print server (127.0.0.1, dead in the file) or a local file.
  // A figure's link to its own image goes (the image is on the page); a page of the book
  // becomes its anchor here; anything else of the build points to the site.
  let unwrapped = 0, toSite = 0;
  for (const a of [...document.querySelectorAll('a[href]')]) {
    if (a.getAttribute('href').startsWith('#')) continue;
    const url = new URL(a.href, location.href);
    const local = url.origin === location.origin || !/^(https?|mailto):$/.test(url.protocol);
    if (!local) continue;
    const path = decodeURIComponent(url.pathname.replace(/^\\/+/, ''));
    const marker = path === rootPage ? document.querySelector('.bd-article section[id]')
      : document.getElementById('document-' + path.replace(/\\.html$/, ''));
    if (url.origin === location.origin && marker && !url.hash) {
      const target = marker.matches('span') && marker.nextElementSibling
        && marker.nextElementSibling.id ? marker.nextElementSibling : marker;
      a.setAttribute('href', '#' + target.id);
    } else if (url.origin === location.origin && !a.matches('a.image-reference')
               && !path.startsWith('_images/') && path !== location.pathname.slice(1)) {
      a.href = site + path + url.hash;
      toSite++;
    } else {
      a.replaceWith(...a.childNodes);
      unwrapped++;
    }
  }
  return {removed, retargeted, unwrapped, toSite};
}
"""
# Runs in the page before printing: each chapter's exercise solutions (the cells that
# _ext/book_solutions.py folds, class "solution") move, opened, to a "Solutions" section
# at the chapter's end, each under its exercise's title; a line under the question points
# there. A chapter is what follows a singlehtml "document-" marker (the whole article when
# there is none). Returns how many solutions moved.
SOLUTIONS_JS = """
() => {
  const markers = [...document.querySelectorAll('span[id^="document-"]')];
  const chapters = markers.length
    ? markers.map(m => m.nextElementSibling).filter(e => e && e.matches('section'))
    : [...document.querySelectorAll('.bd-article > section, article > section')].slice(0, 1);
  let moved = 0;
  for (const chapter of chapters) {
    const cells = [...chapter.querySelectorAll('div.cell.solution')];
    if (!cells.length) continue;
    // One level below the chapter's title (h2 in the single page: h3, then h4).
    const top = chapter.querySelector(':scope > :is(h1, h2, h3, h4)');
    const level = Math.min(top ? +top.tagName[1] + 1 : 2, 5);
    const end = document.createElement('section');
    end.className = 'print-solutions';
    const title = document.createElement('h' + level);
    title.textContent = 'Solutions';
    end.append(title);
    for (const cell of cells) {
      const section = cell.closest('section');
      const heading = section && section.querySelector(':scope > :is(h2, h3, h4)');
      const name = heading ? heading.textContent.replace(/#$/, '').trim() : 'Exercise';
      const note = document.createElement('p');
      note.className = 'print-solution-note';
      note.textContent = `The solution is at the end of the chapter (Solutions, ${name}).`;
      cell.before(note);
      const label = document.createElement('h' + (level + 1));
      label.textContent = name;
      end.append(label, cell);
      cell.querySelectorAll('details').forEach(d => { d.open = true; });
      moved++;
    }
    chapter.append(end);
  }
  return moved;
}
"""
# Runs in the print layout, before printing: a chapter's last boxes (those ending within
# 48 px of its end) lose their bottom padding, border and margin. Each chapter opens a page,
# so a chapter whose text just filled its last page sent the bottom padding of its last
# code box or solution over, alone, to an empty page. Returns how many boxes it trimmed.
CHAPTER_END_JS = """
() => {
  const ends = [];
  for (const marker of document.querySelectorAll('span[id^="document-"]')) {
    const section = marker.nextElementSibling;
    if (!section || !section.matches('section')) continue;
    const bottom = section.getBoundingClientRect().bottom;
    for (const e of [section, ...section.querySelectorAll('*')]) {
      const r = e.getBoundingClientRect();
      if (r.height > 0 && bottom - r.bottom < 48) ends.push(e);
    }
  }
  for (const e of ends) {
    for (const side of ['padding-bottom', 'border-bottom-width', 'margin-bottom']) {
      e.style.setProperty(side, '0', 'important');
    }
  }
  return ends.length;
}
"""
# Visible texts of web controls in the print layout (must be none).
CONTROLS_JS = """
(texts) => [...document.querySelectorAll('body *')].filter(e =>
  e.children.length === 0 && e.checkVisibility()
  && texts.some(t => (e.textContent || '').trim().startsWith(t))).length
"""
# Runs in the page before printing: the PDF's outline (Chromium builds it from the
# headings) has the book's title and the chapters at its top level. The single page nests
# every included document under the landing page's title (a chapter's title is an h2), so
# headings inside a document are raised one level for the outline (aria-level; the type
# keeps its size); the toctree's captions ("Chapters") are not headings of the book. A
# heading's text is the outline entry, where Chromium drops the space at each line wrap
# ("inPyTorch"): headings keep their spaces (white-space-collapse: preserve, after runs of
# white space became one). Returns the titles of the top-level entries.
OUTLINE_JS = """
() => {
  document.querySelectorAll('[role="heading"]:not(h1, h2, h3, h4, h5, h6)').forEach(e => {
    e.removeAttribute('role');
    e.removeAttribute('aria-level');
  });
  const HEADINGS = '.bd-content :is(h1, h2, h3, h4, h5, h6)';
  for (const h of document.querySelectorAll(HEADINGS)) {
    const level = +h.tagName[1];
    const inDocument = h.closest('span[id^="document-"] + section');
    if (inDocument && level > 1 && !h.hasAttribute('aria-level')) {
      h.setAttribute('aria-level', String(level - 1));
    }
    const walker = document.createTreeWalker(h, NodeFilter.SHOW_TEXT);
    const texts = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode()) texts.push(n);
    texts.forEach((n, i) => {
      let text = n.textContent.replace(/\\s+/g, ' ');
      if (i === 0) text = text.trimStart();
      if (i === texts.length - 1) text = text.trimEnd();
      n.textContent = text;
    });
  }
  const style = document.createElement('style');
  style.textContent = `@media print { ${HEADINGS}, ${HEADINGS} * {
    white-space-collapse: preserve; } }`;
  document.head.append(style);
  const level = h => +(h.getAttribute('aria-level') || h.tagName[1]);
  return [...document.querySelectorAll(HEADINGS)]
    .filter(h => h.checkVisibility() && level(h) === 1)
    .map(h => h.textContent.replace(/#$/, '').replace(/\\s+/g, ' ').trim());
}
"""
# The smallest text of each SVG figure as printed, in pt (1 CSS px prints as 0.75 pt):
# matplotlib draws a text as glyph paths under scale(s -s), s = its size in pt / 100, in a
# viewBox measured in pt (or writes font-size); the image is scaled to its printed width.
FIGURE_TEXT_JS = """
async () => {
  const out = [];
  for (const img of document.querySelectorAll('.bd-article img')) {
    const src = img.currentSrc || img.src;
    const r = img.getBoundingClientRect();
    if (!img.checkVisibility() || !/\\.svg([?#]|$)|^data:image\\/svg\\+xml/i.test(src)) continue;
    const text = await (await fetch(src)).text();
    const box = text.match(/viewBox="\\s*[-\\d.]+[\\s,]+[-\\d.]+[\\s,]+([\\d.]+)/);
    const sizes = [...text.matchAll(/scale\\(([\\d.]+) -\\1\\)/g)].map(m => 100 * +m[1])
      .concat([...text.matchAll(/font(?:-size)?:\\s*([\\d.]+)px/g)].map(m => +m[1]));
    if (!box || !sizes.length) continue;
    const figure = img.closest('figure');
    const caption = figure && figure.querySelector('.caption-number');
    out.push({figure: caption ? caption.textContent.trim() : src.split('/').pop(),
              pt: 0.75 * Math.min(...sizes) * r.width / +box[1],
              heightMm: r.height * 25.4 / 96});
  }
  return out;
}
"""
# Figure text in print: at least this size (U6: tall figures shrunk to 170 mm printed
# their labels at 5-6.6 pt).
MIN_FIGURE_PT = 8.0
# Where a page's text starts (A4, 16 mm top margin), in PDF points from the bottom; a
# chapter whose outline destination is within START_SLACK of it opens its page.
PAGE_TOP_PT = 841.89 - 16 / 25.4 * 72
START_SLACK_PT = 60
# A page of the printed book holds 2,000-4,000 characters; one with under this many (and
# no figure) is mostly blank paper.
NEAR_BLANK_CHARS = 300
# The page number the footer prints at the end of each page's text ("37 / 581").
FOOTER_TEXT = re.compile(r"\s*\d+ / \d+\s*$")
FOOTER = (
    '<div style="font-size:8px;width:100%;text-align:center;color:#555">'
    '<span class="pageNumber"></span> / <span class="totalPages"></span></div>'
)


def build_single_html(base: Path) -> Path:
    """``jupyter-book build --builder singlehtml`` into ``base/_build/singlehtml``."""
    jb = Path(sys.executable).with_name("jupyter-book")
    command = [str(jb), "build", str(ROOT), "--builder", "singlehtml"]
    if base != ROOT:
        command += ["--path-output", str(base)]
    subprocess.run(command, check=True)
    single = base / "_build" / "singlehtml"
    if not (single / "index.html").is_file():
        raise SystemExit(f"{single}/index.html was not written")
    return single


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def root_page(single: Path) -> str:
    """The root document's page in the single-page build (``book/intro.html``, which
    index.html redirects to)."""
    redirect = re.search(r'url=([^"]+)"', (single / "index.html").read_text())
    return redirect.group(1) if redirect else "index.html"


def landing(single: Path) -> str:
    """The page to print: singlehtml writes the book to the root document's path
    (:func:`root_page`) but links its assets as if it sat in the top folder
    (``_static/``), so a copy there is what renders completely."""
    page = single / root_page(single)
    (single / "_print.html").write_text(page.read_text(encoding="utf-8"), encoding="utf-8")
    return "_print.html"


def site_url() -> str:
    """The published site (``html: baseurl`` in ``_config.yml``), ending in "/"."""
    import yaml

    return yaml.safe_load(CONFIG.read_text())["html"]["baseurl"].rstrip("/") + "/"


def print_pdf(url: str, out: Path, single: Path, with_appendices: bool = False) -> dict:
    """Print the single page to ``out``; refuses web controls that would print, code cut
    at the page edge and figure text under MIN_FIGURE_PT. Returns what was measured: the
    links rewritten, each SVG figure's smallest text in pt, and the titles the outline
    must have at its top level."""
    from playwright.sync_api import sync_playwright

    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True,
            args=["--no-sandbox", "--disable-gpu",
                  "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"],
        )
        try:
            page = browser.new_page(viewport={"width": 688, "height": 1000})
            page.goto(url + landing(single), wait_until="load", timeout=120_000)
            if page.evaluate("() => document.querySelector('.math') !== null"):
                page.wait_for_function(
                    "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                    timeout=60_000,
                )
                page.evaluate("() => MathJax.startup.promise")
            parts = [] if with_appendices else [list(p) for p in ONLINE_ONLY]
            done = page.evaluate(PREPARE_JS, [parts, site_url(), root_page(single)])
            page.evaluate(SOLUTIONS_JS)
            done["top_level"] = page.evaluate(OUTLINE_JS)
            missing = [doc for doc, count in done["removed"].items() if not count]
            if missing:
                raise SystemExit(f"not in the single page: {', '.join(missing)} (_toc.yml)")
            page.emulate_media(media="print")
            shown = page.evaluate(CONTROLS_JS, list(WEB_CONTROLS))
            if shown:
                raise SystemExit(f"{shown} web controls would print (book.css @media print)")
            # A4 less the margins is about 688 CSS px: no code box may be cut at that width.
            page.set_viewport_size({"width": 688, "height": 1000})
            cut = page.evaluate(
                "() => [...document.querySelectorAll('pre')]"
                ".filter(p => p.scrollWidth > p.clientWidth + 1).length"
            )
            if cut:
                raise SystemExit(f"{cut} code boxes would be cut in print (book.css @media print)")
            done["trimmed"] = page.evaluate(CHAPTER_END_JS)
            done["figures"] = page.evaluate(FIGURE_TEXT_JS)
            small = [f for f in done["figures"] if f["pt"] < MIN_FIGURE_PT - 0.05]
            if small:
                raise SystemExit("figure text under {} pt in print: {} (book.css @media print)"
                                 .format(MIN_FIGURE_PT, ", ".join(
                                     f"{f['figure']} {f['pt']:.1f} pt" for f in small)))
            page.pdf(
                path=str(out), format="A4", print_background=True,
                margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"},
                display_header_footer=True, header_template="<div></div>",
                footer_template=FOOTER, outline=True, tagged=True,
            )
        finally:
            browser.close()
    return done


def outline(pdf: Path) -> list[tuple[int, str, int, float]]:
    """The PDF's bookmarks: (depth, title, 1-based page, top of the destination in PDF
    points from the page's bottom), depth 0 for the top level."""
    from pypdf import PdfReader

    reader = PdfReader(str(pdf))
    entries: list[tuple[int, str, int, float]] = []

    def walk(items: list, depth: int) -> None:
        for item in items:
            if isinstance(item, list):
                walk(item, depth + 1)
            else:
                top = item.get("/Top")
                entries.append((depth, str(item.title),
                                reader.get_destination_page_number(item) + 1,
                                float(top) if top is not None else float("nan")))

    walk(reader.outline, 0)
    return entries


def local_links(pdf: Path) -> list[tuple[int, str]]:
    """Links (1-based page, URI) that lead nowhere outside the file: to 127.0.0.1,
    localhost or a local file."""
    from pypdf import PdfReader

    found = []
    for number, page in enumerate(PdfReader(str(pdf)).pages, start=1):
        for annot in page.get("/Annots") or []:
            action = annot.get_object().get("/A")
            uri = str(action.get("/URI", "")) if action is not None else ""
            if re.match(r"(?i)(https?://(127\.0\.0\.1|localhost|\[::1\])\b|file:)", uri):
                found.append((number, uri))
    return found


def late_starts(pdf: Path) -> list[tuple[str, int]]:
    """Top-level outline entries after the first (chapters, appendices) that do not open
    their page: (title, page) of each whose heading is more than START_SLACK_PT below the
    page's first line."""
    entries = [e for e in outline(pdf) if e[0] == 0][1:]
    return [(title, page) for _, title, page, top in entries
            if not top >= PAGE_TOP_PT - START_SLACK_PT]


def check_pdf(pdf: Path, top_level: list[str]) -> list[str]:
    """What is wrong with the printed book's structure: links to the print server or
    local files, chapters that do not open a page, and an outline whose top level is not
    ``top_level`` (the book's title, the chapters, the appendices) word for word."""
    problems = []
    links = local_links(pdf)
    if links:
        problems.append(f"{len(links)} links to the print server or local files, e.g. "
                        f"{links[:3]}")
    late = late_starts(pdf)
    if late:
        problems.append(f"chapters that start below a page's top: {late[:5]}")
    titles = [title for depth, title, _, _ in outline(pdf) if depth == 0]
    if titles != top_level:
        problems.append(f"outline's top level {titles[:6]}... is not {top_level[:6]}...")
    return problems


def near_blank_pages(pdf: Path, min_chars: int = NEAR_BLANK_CHARS) -> list[int]:
    """Pages (1-based) with under ``min_chars`` characters of text and no figure caption,
    the last page excepted: what a box kept whole (break-inside: avoid) leaves behind when
    it moves to the next page. A figure is drawn, not text, so its page is kept by its
    caption ("Fig. 3.1"); so is the page before one that starts with a figure (a figure
    stays whole, with its caption), and a chapter's last page, which may be short (each
    chapter opens a page: the top level of the outline), but not an empty one."""
    from pypdf import PdfReader

    pages = PdfReader(str(pdf)).pages
    texts = [FOOTER_TEXT.sub("", page.extract_text() or "").strip() for page in pages]
    starts = {page for depth, _, page, _ in outline(pdf) if depth == 0}
    blank = []
    for number, text in enumerate(texts[:-1], start=1):
        if len(text) >= min_chars or re.search(r"\bFig\. \d+\.\d+", text):
            continue
        if texts[number].startswith("Fig. ") or (text and number + 1 in starts):
            continue
        blank.append(number)
    return blank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--no-build", action="store_true",
                        help="print the existing _build/singlehtml")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--with-appendices", action="store_true",
                        help="keep the API reference and the Records appendix")
    parser.add_argument("--path-output", type=Path, default=ROOT,
                        help="build under this folder's _build/ (default: the book's)")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: run `make system-deps`")
    single = args.path_output.resolve() / "_build" / "singlehtml"
    if not args.no_build:
        single = build_single_html(args.path_output.resolve())
    start = time.perf_counter()
    server, url = serve(single)
    try:
        done = print_pdf(url, args.out, single, with_appendices=args.with_appendices)
    finally:
        server.shutdown()
        server.server_close()
    blank = near_blank_pages(args.out)
    if blank:
        raise SystemExit(f"near-blank pages (under {NEAR_BLANK_CHARS} characters of text): "
                         f"{blank[:10]} (book.css @media print)")
    problems = check_pdf(args.out, done["top_level"])
    if problems:
        raise SystemExit("; ".join(problems))
    from pypdf import PdfReader

    pages = len(PdfReader(str(args.out)).pages)
    size = args.out.stat().st_size / 1e6
    smallest = min((f["pt"] for f in done["figures"]), default=float("nan"))
    print(f"wrote {args.out}: {pages} pages, {size:.1f} MB, printed in "
          f"{time.perf_counter() - start:.0f} s; {len(done['figures'])} figures, smallest "
          f"text {smallest:.1f} pt; {done['unwrapped']} image links dropped, "
          f"{done['toSite']} links to the site")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
