"""The rendered site in a real browser: every page of ``_build/html`` in headless Chromium.

``make test`` builds the book first; these tests fail (they do not skip) when the build is
missing. They skip, with the reason, only where the browser itself is absent: without the
``playwright`` package or without ``/usr/bin/chromium`` (``make system-deps`` installs it).

Every page is opened once at 1366 px (a laptop) and once at 390 px (a phone) and checked
for console errors, broken images, math that MathJax did not typeset, raw TeX, dead
internal links and anchors, requests that leave 127.0.0.1, content wider than its column,
figures without caption or real alt text, and page weight. The navigation buttons, the
colour-mode button and the landing page's structure are tried as a reader would, and so are
the search (ten queries a reader typed), the folded exercise solutions and line breaks
(none inside a number, nor inside a name in code on a phone). Screenshots
of the landing page and the first chapter at both widths go to ``_build/screenshots/``.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -r requirements.txt)"
)
PlaywrightTimeout = sync_api.TimeoutError
sync_playwright = sync_api.sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from toc_notebooks import toc_files  # noqa: E402

pytestmark = pytest.mark.slow

# BOOK_HTML: check another build folder (e.g. one made with --path-output) than _build/html.
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html"))
SHOTS = HTML.parent / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # Nothing may leave the machine: every host but 127.0.0.1 fails to resolve, at once (a
    # stray CDN URL fails fast instead of hanging on a network that is not there; the
    # request is still recorded and reported by test_no_request_leaves_localhost).
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
WIDE, PHONE = 1366, 390
VIEWPORTS = {WIDE: {"width": WIDE, "height": 900}, PHONE: {"width": PHONE, "height": 844}}
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
# Folders of the build that hold assets and copies of sources, not pages.
NOT_PAGES = {"_static", "_sources", "_images", "_sphinx_design_static"}
# TeX left in the text after MathJax ran: display delimiters, \( \[, any \command, or
# $...$ that dollarmath never parsed.
RAW_TEX = re.compile(
    r"\$\$|\\\(|\\\[|\\[A-Za-z]{2,}|(?<![\w$])\$[^\s$][^$\n]{0,80}(?<=\S)\$(?![\w$])"
)
# An alt text that is only a file name (what Sphinx writes when a figure has none).
FILE_NAME_ALT = re.compile(r"(^|/)[\w.-]+\.(png|jpe?g|svg|gif|webp)$|^[0-9a-f]{16,}", re.I)
# A hand-written chapter number in front of a title: "3. ", "3 - ", "Chapter 3:".
HAND_NUMBER = re.compile(r"^\s*(chapter\s+)?\d+\s*[.:)\-–]\s", re.I)
# Page weight budget: MathJax (1.2 MB, on pages with math only) plus the theme's CSS, fonts
# and scripts (about 0.9 MB), then the page and its SVG figures (up to ~0.5 MB for the longest
# chapters: 0.3 MB of highlighted code and outputs in chapter 6). Before this budget, pages
# loaded 3.6-4 MB; with the SVG figures and captioned tables they weigh 2.48-2.60 MB. Round 4
# added a summary, exercises and download buttons to every chapter, a second Intel host's
# records to chapter 7's tables and the fast reference's C++ loop to chapter 5's listing:
# the two longest chapters weigh 2.72-2.73 MB, so the budget is 2.8 MB.
MAX_PAGE_BYTES = 2_800_000
# On a phone a table column narrower than this is a sliver (a few letters a line).
MIN_COLUMN_PX = 60
# jupyter-book writes a root index.html that only redirects to the landing page.
REDIRECT = re.compile(r'<meta[^>]+http-equiv="refresh"[^>]+url=([^"]+)"', re.I)


def colab_link(entry: str) -> str:
    """The Colab URL the launch button of notebook ``entry`` must carry: its clean copy
    ``colab/NAME.ipynb`` (scripts/colab_copies.py) in the repository of _config.yml."""
    repo = CONFIG["repository"]
    org_repo = urlsplit(repo["url"]).path.strip("/")
    prefix = repo.get("path_to_book", "").strip("/")
    name = f"colab/{Path(entry).name}.ipynb"
    path = f"{prefix}/{name}" if prefix else name
    colab = CONFIG["launch_buttons"]["colab_url"].rstrip("/")
    return f"{colab}/github/{org_repo}/blob/{repo['branch']}/{path}"


def chapters() -> list[str]:
    """Entries of the numbered part of ``_toc.yml`` (the chapters), in order."""
    numbered = [p for p in TOC.get("parts", []) if p.get("numbered")]
    assert numbered, "_toc.yml has no part with `numbered: true`"
    return [c["file"] for part in numbered for c in part["chapters"]]


class _IdCollector(HTMLParser):
    """Collects ``id`` and ``name`` attributes: the anchors a page offers."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("id", "name") and value:
                self.ids.add(value)


@functools.cache
def anchors_of(path: Path) -> frozenset[str]:
    """Anchors of an HTML file, read from disk (for link targets)."""
    parser = _IdCollector()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.ids)


@dataclass
class Visit:
    """What one page showed in the browser at one width."""

    page: str
    width: int
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)


# Runs in the page once MathJax is done: everything the checks need, in one round trip.
COLLECT_JS = """
async () => {
  const imgs = [...document.images];
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => {
    i.addEventListener('load', r); i.addEventListener('error', r); setTimeout(r, 5000);
  })));
  const skip = 'pre, code, script, style, textarea, mjx-container, .highlight';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const prose = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(skip) || !el.checkVisibility()) continue;
    prose.push(n.textContent);
  }
  const article = document.querySelector('.bd-article');
  const container = document.querySelector('.bd-article-container');
  const cells = [...document.querySelectorAll('.bd-article div.cell')];
  const label = e => {
    // Where a box is: "cell K output" (K counts the page's rendered code cells from 1),
    // else the id of its section; then the start of its text, to find it in the source.
    const cell = e.closest('div.cell');
    const section = e.closest('section[id]');
    const where = cell
      ? `cell ${cells.indexOf(cell) + 1} ${e.closest('.cell_output') ? 'output' : 'input'}`
      : (section ? '#' + section.id : '');
    const text = (e.innerText || e.textContent || '').trim().replace(/\\s+/g, ' ');
    return `${e.tagName.toLowerCase()}.${[...e.classList].slice(0, 2).join('.')} ${where}`
      + ` "${text.slice(0, 50)}"`;
  };
  // Content wider than its column: boxes that scroll sideways, and boxes that stick out.
  const wide = [];
  if (article) {
    const right = article.getBoundingClientRect().right;
    const scrollers = 'pre, div.output, .cell_output > div, mjx-container[display="true"], '
      + 'div.math-wrapper, div.pst-scrollable-table-container, .table-wrapper';
    // Tables wider than the column scroll in their box, with the cue (checked apart).
    const tableBox = 'div.pst-scrollable-table-container, .table-wrapper';
    for (const e of article.querySelectorAll(scrollers)) {
      if (!e.checkVisibility() || e.matches(tableBox)) continue;
      if (e.scrollWidth > e.clientWidth + 1) {
        wide.push(`${label(e)} is ${e.scrollWidth} px wide in ${e.clientWidth} px`);
      }
    }
    for (const e of article.querySelectorAll('table, img, figure, mjx-container, dl')) {
      if (!e.checkVisibility() || (e.parentElement && e.parentElement.closest(tableBox))) {
        continue;
      }
      const r = e.getBoundingClientRect();
      if (r.right > right + 1) {
        wide.push(`${label(e)} sticks out ${Math.round(r.right - right)} px`);
      }
    }
  }
  if (container && container.scrollWidth > container.clientWidth + 1) {
    // Name the culprits: the innermost boxes past the edge that do not scroll themselves.
    const edge = container.getBoundingClientRect().right + 1;
    const boxes = 'pre, .highlight, div.output, mjx-container, .pst-scrollable-table-container';
    const out = [...article.querySelectorAll('*')].filter(e => {
      if (e.parentElement && e.parentElement.closest(boxes)) return false;
      return e.getBoundingClientRect().right > edge && ![...e.children].some(
        c => c.getBoundingClientRect().right > edge);
    });
    wide.push(`the article scrolls sideways: ${container.scrollWidth} px in `
      + `${container.clientWidth} px; past the edge: ${out.slice(0, 3).map(label).join('; ')}`);
  }
  const figures = [...(article ? article.querySelectorAll('img') : [])].map(i => {
    const fig = i.closest('figure');
    const cap = fig && fig.querySelector('figcaption');
    return {src: i.getAttribute('src'), alt: i.getAttribute('alt') || '',
            caption: cap ? cap.innerText.trim() : ''};
  });
  // Words broken across lines inside an identifier: a line break between two characters
  // of [A-Za-z0-9_#] (e.g. grad_inpu|t, #6521|9), except right after an underscore (a
  // word boundary of a snake_case name). Code blocks (pre) do not wrap.
  const splits = [];
  const wordChar = /[A-Za-z0-9_#]/;
  const roots = ['.bd-article', '.bd-sidebar-primary', '.bd-sidebar-secondary']
    .map(s => document.querySelector(s)).filter(Boolean);
  const range = document.createRange();
  for (const root of roots) {
    const texts = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = texts.nextNode(); n; n = texts.nextNode()) {
      const el = n.parentElement;
      if (!el || el.closest('pre, script, style, mjx-container, .MathJax')) continue;
      if (!el.checkVisibility()) continue;
      const text = n.textContent;
      for (const m of text.matchAll(/[A-Za-z0-9_#]{2,}/g)) {
        range.setStart(n, m.index);
        range.setEnd(n, m.index + m[0].length);
        const rects = [...range.getClientRects()].filter(r => r.width > 0);
        if (rects.length < 2 || new Set(rects.map(r => Math.round(r.top))).size < 2) continue;
        // Where the line breaks: after an underscore is a boundary of a snake_case word.
        const topAt = (k) => {
          range.setStart(n, m.index + k);
          range.setEnd(n, m.index + k + 1);
          return Math.round(range.getBoundingClientRect().top);
        };
        const first = topAt(0);
        let k = 1;
        while (k < m[0].length && Math.abs(topAt(k) - first) < 2) k++;
        if (k < m[0].length && m[0][k - 1] === '_') continue;
        splits.push(`${label(el)}: "${m[0].slice(0, k)}|${m[0].slice(k, 40)}"`);
      }
    }
  }
  // Display equations wider than their box (they scroll): the TeX, to find them.
  const texOf = new Map();
  if (window.MathJax && MathJax.startup && MathJax.startup.document) {
    for (const item of MathJax.startup.document.math) {
      if (item.typesetRoot) texOf.set(item.typesetRoot, item.math);
    }
  }
  const clippedMath = [...document.querySelectorAll('.bd-article mjx-container[display="true"]')]
    .filter(e => e.checkVisibility() && e.scrollWidth > e.clientWidth + 1)
    .map(e => `${e.scrollWidth} px in ${e.clientWidth} px: `
      + (texOf.get(e) || e.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 90));
  // Inline math wider than its box (span.math): cut if the box does not scroll (the theme
  // clips it: ch6 lost "+ gg_b" at 390 px), or sticking out of the column.
  const articleRight = article ? article.getBoundingClientRect().right : Infinity;
  const cutMath = [...document.querySelectorAll('.bd-article span.math')]
    .filter(e => e.checkVisibility())
    .map(e => {
      // The rendering's width (MathJax's hidden assistive MathML inflates scrollWidth).
      const jax = e.querySelector('mjx-container');
      const hidden = jax ? jax.getBoundingClientRect().width - e.clientWidth : 0;
      const scrolls = ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
      // In a table that scrolls in its box, the math scrolls with it.
      const inBox = e.parentElement.closest('div.pst-scrollable-table-container, .table-wrapper');
      const out = inBox ? 0 : e.getBoundingClientRect().right - articleRight;
      const tex = (texOf.get(jax) || e.textContent || '').trim().replace(/\\s+/g, ' ');
      return {hidden, scrolls, out, text: `${label(e)} ${tex.slice(0, 60)}`};
    })
    .filter(m => (m.hidden > 1 && !m.scrolls) || m.out > 1)
    .map(m => m.out > 1 ? `sticks out ${Math.round(m.out)} px: ${m.text}`
                        : `${Math.round(m.hidden)} px cut off: ${m.text}`);
  // Boxes that scroll sideways and whether they show the cue (book.css: a faded edge).
  const scrollers = [...document.querySelectorAll('.bd-article :is(.pst-scrollable-table-'
    + 'container, mjx-container[display="true"], div.highlight pre, .cell_output pre, '
    + 'span.math)')]
    .filter(e => e.checkVisibility() && (e.matches('span.math')
      ? (e.querySelector('mjx-container') || e).getBoundingClientRect().width > e.clientWidth + 1
      : e.scrollWidth > e.clientWidth + 1))
    .map(e => {
      const style = getComputedStyle(e);
      const mask = style.maskImage || style.webkitMaskImage || 'none';
      return {where: label(e), cue: e.classList.contains('scroll-x') && mask !== 'none',
              output: e.matches('.cell_output pre'),
              pre: e.matches('pre'),
              hidden: 1 - e.clientWidth / e.scrollWidth};
    });
  // Code boxes (book.js splits each into `code-line` spans that wrap on a phone): the
  // text, and so what the copy button copies, must be the page's own, character for
  // character; compared with the same boxes parsed from the served HTML.
  const isCode = e => !e.closest('.cell_output');
  const CODE = '.bd-article div.highlight pre';
  const served = new DOMParser().parseFromString(await (await fetch(location.href)).text(),
                                                 'text/html');
  const servedCode = [...served.querySelectorAll(CODE)].filter(isCode).map(e => e.textContent);
  const shownCode = [...document.querySelectorAll(CODE)].filter(isCode);
  const codeText = {
    boxes: servedCode.length,
    split: shownCode.filter(e => e.querySelector('.code-line')).length,
    changed: shownCode.length !== servedCode.length ? ['number of boxes']
      : shownCode.filter((e, i) => e.textContent !== servedCode[i]).map(label)};
  // Figures: SVG text size as rendered (matplotlib writes each text as glyph paths under
  // scale(s -s), s = font size in pt / 100, in a viewBox measured in pt; or as font-size).
  const svgFigures = [];
  for (const img of (article ? article.querySelectorAll('img') : [])) {
    const src = img.currentSrc || img.src;
    const r = img.getBoundingClientRect();
    if (!img.checkVisibility() || r.width < 50) continue;
    const entry = {where: label(img), src: src.split('/').pop(), width: r.width,
                   natural: img.naturalWidth, svg: /\\.svg(\\?|#|$)/i.test(src)};
    if (entry.svg) {
      const text = await (await fetch(src)).text();
      const box = text.match(/viewBox="\\s*[-\\d.]+[\\s,]+[-\\d.]+[\\s,]+([\\d.]+)/);
      const sizes = [...text.matchAll(/scale\\(([\\d.]+) -\\1\\)/g)].map(m => 100 * +m[1])
        .concat([...text.matchAll(/font(?:-size)?:\\s*([\\d.]+)px/g)].map(m => +m[1]));
      entry.viewWidth = box ? +box[1] : 0;
      entry.minFontPx = box && sizes.length ? Math.min(...sizes) * r.width / +box[1] : null;
      entry.intrinsic = box ? +box[1] * 4 / 3 : 0;  // pt -> CSS px
    }
    svgFigures.push(entry);
  }
  // Tables: the narrowest body cell (a column squeezed to a sliver) and how far the table
  // is wider than its box (the part a reader must scroll to); book.js stacks such tables
  // on a phone (`stacked`: one card per row, every cell full width).
  const tables = [...(article ? article.querySelectorAll('table') : [])]
    .filter(t => t.checkVisibility() && !t.closest('.sig, dl.field-list'))
    .map(t => {
      const box = t.closest('div.pst-scrollable-table-container, .table-wrapper')
        || t.parentElement;
      const widths = [...t.tBodies].flatMap(b => [...b.rows]).flatMap(r => [...r.cells])
        .filter(c => c.colSpan === 1 && c.checkVisibility())
        .map(c => c.getBoundingClientRect().width);
      return {where: label(t), caption: (t.querySelector('caption') || {innerText: ''})
        .innerText.trim(), stacked: t.classList.contains('stacked'),
        narrowest: widths.length ? Math.round(Math.min(...widths)) : null,
        hidden: Math.round(t.getBoundingClientRect().width - box.clientWidth)};
    });
  const math = [...document.querySelectorAll('.math')];
  const resources = performance.getEntriesByType('resource').map(r => r.name);
  return {
    images: imgs.map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0})),
    mathNodes: math.length,
    mathTypeset: math.filter(m => m.querySelector('mjx-container')).length,
    mathErrors: document.querySelectorAll('mjx-merror, [data-mjx-error]').length,
    mjx: document.querySelectorAll('mjx-container').length,
    prose: prose.join(' '),
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    colab: [...document.querySelectorAll('a[href*="colab.research.google.com"]')].map(a => a.href),
    functions: document.querySelectorAll('dl.py.function, dl.py.method').length,
    signatures: document.querySelectorAll('dt.sig').length,
    ids: [...document.querySelectorAll('[id], a[name]')].map(e => e.id || e.name),
    docWidth: document.documentElement.scrollWidth,
    // How long the article and its tallest table are, in px at this width.
    articleHeight: article ? article.scrollHeight : 0,
    tallestTable: Math.max(0, ...[...document.querySelectorAll('.bd-article table')]
      .filter(t => !t.closest('dl.py')).map(t => t.getBoundingClientRect().height)),
    viewWidth: window.innerWidth,
    wide: wide,
    figures: figures,
    resources: [location.href, ...resources],
    splitStreams: [...document.querySelectorAll('.bd-article .cell_output')].filter(
      o => o.querySelectorAll(':scope > .output.stream').length > 1).map(label),
    sidebar: [...document.querySelectorAll('nav.bd-docs-nav li.toctree-l1 > a')].map(a => ({
      href: a.href, text: a.innerText.trim()})),
    h1: (document.querySelector('.bd-article h1') || {innerText: ''}).innerText.trim(),
    splits: splits,
    clippedMath: clippedMath,
    cutMath: cutMath,
    // The labelled buttons under the title (_ext/book_actions.py).
    actions: [...document.querySelectorAll('.bd-article .book-actions a')].map(a => {
      const r = a.getBoundingClientRect();
      return {text: a.innerText.trim(), href: a.href, shown: a.checkVisibility(),
              w: r.width, h: r.height, inside: r.right <= articleRight + 1};
    }),
    scrollers: scrollers,
    codeText: codeText,
    svgFigures: svgFigures,
    tables: tables,
    folds: document.querySelectorAll('.bd-article button.output-fold').length,
    fullscreen: [...document.querySelectorAll('.btn-fullscreen-button')]
      .filter(b => b.checkVisibility()).length,
    headerButtons: [...document.querySelectorAll('.bd-header-article :is(.btn, .dropdown-'
      + 'toggle), .bd-header :is(.btn, .pst-navbar-icon)')]
      .filter(b => b.checkVisibility() && b.getBoundingClientRect().width > 0)
      .map(b => ({name: b.title || b.dataset.bsOriginalTitle || b.getAttribute('aria-label')
                    || b.className,
                  w: b.getBoundingClientRect().width, h: b.getBoundingClientRect().height})),
    // Bootstrap's tooltips move `title` to `data-bs-original-title`.
    buttons: [...document.querySelectorAll('a[href], button')].map(a => ({
      title: a.title || a.dataset.bsOriginalTitle || '', href: a.href || ''}))
      .filter(a => a.title),
  };
}
"""


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """``_build/html`` served on 127.0.0.1 from a thread; yields the base URL."""
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} has no index.html: run `make book` first", pytrace=False)
    missing = [e for e in toc_files() if not (HTML / f"{e}.html").exists()]
    if missing:
        pytest.fail(f"pages in _toc.yml but not built: {missing}: run `make book`", pytrace=False)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: one connection serves many files

        def log_message(self, *args: object) -> None:
            pass

        def end_headers(self) -> None:
            # The theme's CSS, scripts and fonts are cached across pages, as a reader's
            # browser would (without this, each page revalidates some 30 files).
            if "/_static/" in self.path:
                self.send_header("Cache-Control", "max-age=3600")
            super().end_headers()

    handler = functools.partial(Quiet, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Chromium (Debian's) for the whole module."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: run `make system-deps`")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        yield chromium
        chromium.close()


def pages() -> list[str]:
    """Every HTML page of the build, relative to ``_build/html``, landing page first."""
    found = sorted(
        p.relative_to(HTML).as_posix()
        for p in HTML.rglob("*.html")
        if not NOT_PAGES & set(p.relative_to(HTML).parts) and not REDIRECT.search(p.read_text())
    )
    landing = f"{toc_files()[0]}.html"
    return [landing] + [p for p in found if p != landing]


def new_context(browser: object, width: int) -> object:
    """A browser context at one width (other hosts do not resolve: CHROMIUM_FLAGS)."""
    return browser.new_context(viewport=VIEWPORTS[width])


def open_page(context: object, url: str, result: Visit) -> object:
    """Open ``url`` in a new tab, recording errors and requests, and wait for MathJax."""

    def on_console(message: object) -> None:
        if message.type == "error":
            result.errors.append(f"console: {message.text}")

    def on_response(response: object) -> None:
        if response.status >= 400:
            result.errors.append(f"HTTP {response.status}: {response.url}")

    tab = context.new_page()
    tab.on("console", on_console)
    tab.on("pageerror", lambda error: result.errors.append(f"pageerror: {error}"))
    tab.on("request", lambda request: result.requests.append(request.url))
    tab.on("requestfailed", lambda request: result.errors.append(f"failed: {request.url}"))
    tab.on("response", on_response)
    tab.goto(url, wait_until="load")
    if tab.evaluate("() => document.querySelector('.math') !== null"):
        try:
            tab.wait_for_function(
                "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                timeout=15_000,
            )
            tab.evaluate("() => MathJax.startup.promise")
        except PlaywrightTimeout:
            result.errors.append("MathJax never started on a page with math")
    return tab


def line_break_pages() -> set[str]:
    """The pages whose numbers and code names are checked for line breaks (TOKEN_SPLITS_JS):
    the landing page and the chapters."""
    return {pages()[0]} | {f"{c}.html" for c in chapters()}


def solution_toggles(tab: object) -> object:
    return tab.locator(".bd-article div.cell.solution details.hide > summary")


def click_all(locator: object) -> None:
    for i in range(locator.count()):
        locator.nth(i).click()


def visit(context: object, base: str, page: str, shots: str | None,
          line_breaks: bool = False, chapter: bool = False) -> list[Visit]:
    """Open one page, collect what the checks need at 1366 px, then again at 390 px.

    The phone width reuses the loaded page (the viewport is resized, so the theme's media
    queries apply as on a phone): one load per page keeps the whole module fast. On the
    pages of ``line_breaks`` the breaks inside numbers and code names are read at each
    width (TOKEN_SPLITS_JS). On a chapter also the print layout (at 1366 px, before the
    phone width; print media is emulated, then the screen's again) and the exercise
    solutions: folded as loaded at both widths, then opened by a click at 390 px (closed
    by a second click), and opened by a click at 1366 px; the clicks come after every
    other reading, which sees the page as loaded.
    """
    wide = Visit(page, WIDE)
    tab = open_page(context, base + page, wide)
    found = []
    try:
        for width in (WIDE, PHONE):
            result = wide if width == WIDE else Visit(page, width)
            if width != WIDE:
                tab.set_viewport_size(VIEWPORTS[width])
                tab.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
            result.data = tab.evaluate(COLLECT_JS)
            if line_breaks:
                result.data["tokenSplits"] = tab.evaluate(TOKEN_SPLITS_JS)
            if chapter:
                result.data["solutions"] = tab.evaluate(SOLUTIONS_JS)
            found.append(result)
            if shots is not None:
                SHOTS.mkdir(parents=True, exist_ok=True)
                tab.evaluate("() => window.scrollTo(0, 0)")
                tab.screenshot(path=str(SHOTS / f"{shots}-{width}.png"), full_page=False)
            if chapter and width == WIDE:
                result.data["print"] = print_view(tab)
                tab.emulate_media(media="null")  # the screen again
        if chapter:
            phone = found[1]
            toggles = solution_toggles(tab)
            click_all(toggles)
            tab.wait_for_timeout(200)
            phone.data["solutionsOpened"] = tab.evaluate(SOLUTIONS_JS)
            click_all(toggles)  # folded again, to open them at 1366 px
            tab.set_viewport_size(VIEWPORTS[WIDE])
            tab.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
            click_all(toggles)
            tab.wait_for_timeout(200)
            wide.data["solutionsOpened"] = tab.evaluate(SOLUTIONS_JS)
    finally:
        tab.close()
    return found


def visit_all(base: str, pages_: list[str], shots: dict[str, str]) -> list[Visit]:
    """Visit ``pages_`` in a Chromium of this thread's own (sync Playwright is per thread)."""
    line_breaks = line_break_pages()
    chapter_pages = {f"{c}.html" for c in chapters()}
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        try:
            context = new_context(chromium, WIDE)
            return [v for page in pages_
                    for v in visit(context, base, page, shots.get(page),
                                   line_breaks=page in line_breaks,
                                   chapter=page in chapter_pages)]
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def visits(site: str, browser: object) -> dict[tuple[str, int], Visit]:
    """Every page at both widths; screenshots of the landing page and chapter 1.

    Two browsers share the pages (every other one), so both CPU cores render.
    """
    shots = {pages()[0]: "landing", f"{chapters()[0]}.html": "chapter"}
    everything = pages()
    halves = [everything[0::2], everything[1::2]]
    with ThreadPoolExecutor(max_workers=len(halves)) as pool:
        done = list(pool.map(lambda half: visit_all(site, half, shots), halves))
    return {(v.page, v.width): v for found in done for v in found}


def at(visits: dict[tuple[str, int], Visit], width: int) -> list[Visit]:
    return [v for (_, w), v in visits.items() if w == width]


def report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n  " + "\n  ".join(problems[:60])


def test_root_redirects_to_the_landing_page() -> None:
    index = HTML / "index.html"
    assert index.is_file(), f"{index} is missing: run `make book`"
    match = REDIRECT.search(index.read_text())
    assert match, f"{index} is not a redirect to the landing page"
    target = unquote(urlsplit(match.group(1)).path)
    assert target == pages()[0], f"index.html redirects to {target}, not the toc root"


def test_every_toc_page_was_built_and_visited(visits: dict) -> None:
    missing = [e for e in toc_files() for w in VIEWPORTS if (f"{e}.html", w) not in visits]
    assert not missing, f"toc entries without a visited page: {missing}"


def test_no_console_errors(visits: dict) -> None:
    problems = [f"{v.page} @{v.width}: {e}" for v in visits.values() for e in v.errors]
    assert not problems, report(problems)


def test_no_request_leaves_localhost(visits: dict) -> None:
    problems = [
        f"{v.page}: {url}"
        for v in visits.values()
        for url in v.requests
        if urlsplit(url).scheme in ("http", "https", "ws", "wss")
        and urlsplit(url).hostname != "127.0.0.1"
    ]
    assert not problems, report(problems)


def test_every_image_loads(visits: dict) -> None:
    problems = [
        f"{v.page}: {img['src']}"
        for v in at(visits, WIDE)
        for img in v.data["images"]
        if not img["ok"]
    ]
    assert not problems, report(problems)


def test_math_is_typeset_and_no_raw_tex(visits: dict) -> None:
    problems = []
    for v in at(visits, WIDE):
        d = v.data
        if d["mathNodes"] and d["mathTypeset"] < d["mathNodes"]:
            problems.append(f"{v.page}: {d['mathTypeset']} of {d['mathNodes']} math nodes typeset")
        if d["mathErrors"]:
            problems.append(f"{v.page}: {d['mathErrors']} MathJax error node(s)")
        for raw in RAW_TEX.finditer(d["prose"]):
            start = max(raw.start() - 40, 0)
            problems.append(f"{v.page}: raw TeX: ...{d['prose'][start : raw.end() + 40]}")
    assert not problems, report(problems)


def test_some_page_has_math(visits: dict) -> None:
    """Guards the check above: a book about gradients without typeset math is broken."""
    assert any(v.data["mjx"] > 0 for v in at(visits, WIDE)), "no page has MathJax output"


def test_nothing_is_wider_than_its_column_at_1366(visits: dict) -> None:
    problems = [f"{v.page}: {w}" for v in at(visits, WIDE) for w in v.data["wide"]]
    assert not problems, report(problems)


def test_no_page_is_wider_than_a_phone(visits: dict) -> None:
    problems = []
    for v in at(visits, PHONE):
        d = v.data
        if d["docWidth"] > d["viewWidth"]:
            problems.append(f"{v.page}: the document is {d['docWidth']} px wide at {PHONE} px")
        problems += [f"{v.page}: {w}" for w in d["wide"] if w.startswith("the article")]
    assert not problems, report(problems)


def test_each_cell_prints_one_box(visits: dict) -> None:
    """A cell's printed output is one box (nb_merge_streams), not one box per print."""
    problems = [f"{v.page}: {c}" for v in at(visits, WIDE) for c in v.data["splitStreams"]]
    assert not problems, report(problems)


def test_markdown_tables_render_as_tables(visits: dict) -> None:
    """``Table`` outputs (Markdown) become HTML tables, not text with pipes and dashes."""
    problems = [
        f"{v.page}: ...{v.data['prose'][max(m.start() - 60, 0) : m.end()]}"
        for v in at(visits, WIDE)
        for m in re.finditer(r"\|\s*:?-{3,}:?\s*\|", v.data["prose"])
    ]
    assert not problems, report(problems)


def test_figures_have_numbered_captions_and_alt_text(visits: dict) -> None:
    problems = []
    for entry in chapters():
        for fig in visits[f"{entry}.html", WIDE].data["figures"]:
            name = Path(fig["src"] or "").name[:24]
            if not fig["alt"].strip() or FILE_NAME_ALT.search(fig["alt"].strip()):
                problems.append(f"{entry}: {name}: alt text is {fig['alt']!r}")
            if not re.match(r"Fig\. \d+\s*\S", fig["caption"]):
                problems.append(f"{entry}: {name}: no numbered caption ({fig['caption'][:40]!r})")
    assert not problems, report(problems)


def test_sidebar_numbers_the_chapters(visits: dict) -> None:
    entries = chapters()
    sidebar = visits[f"{entries[0]}.html", WIDE].data["sidebar"]
    by_page = {urlsplit(item["href"]).path.rsplit("/", 1)[-1]: item["text"] for item in sidebar}
    problems = []
    for number, entry in enumerate(entries, start=1):
        text = by_page.get(f"{Path(entry).name}.html")
        if text is None:
            problems.append(f"{entry}: not in the sidebar")
            continue
        if not text.startswith(f"{number}. "):
            problems.append(f"{entry}: sidebar reads {text!r}, expected '{number}. ...'")
        elif HAND_NUMBER.match(text[len(f"{number}. ") :]):
            problems.append(f"{entry}: hand-numbered title {text!r}")
    assert not problems, report(problems)


def test_chapters_link_the_glossary_and_the_api(visits: dict) -> None:
    problems = []
    for entry in chapters():
        links = [urlsplit(h) for h in visits[f"{entry}.html", WIDE].data["links"]]
        if not any(p.path.endswith("/glossary.html") and p.fragment.startswith("term-")
                   for p in links):
            problems.append(f"{entry}: no {{term}} link to the glossary")
        if not any("/book/api/" in p.path and p.fragment.startswith("convlab.") for p in links):
            problems.append(f"{entry}: no link to a convlab function on the API pages")
    assert not problems, report(problems)


def test_internal_links_resolve(site: str, visits: dict) -> None:
    problems = []
    wide = {v.page: v for v in at(visits, WIDE)}
    for v in wide.values():
        for href in set(v.data["links"]):
            parts = urlsplit(href)
            if not href.startswith(site) or parts.scheme not in ("http", "https"):
                continue
            rel = unquote(parts.path[len(urlsplit(site).path) :]) or "index.html"
            target = HTML / rel
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{v.page}: link to missing file {rel}")
                continue
            if parts.fragment and target.suffix == ".html":
                page = target.relative_to(HTML).as_posix()
                ids = set(wide[page].data["ids"]) if page in wide else anchors_of(target)
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{v.page}: link to missing anchor {rel}#{parts.fragment}")
    assert not problems, report(problems)


def test_notebook_pages_have_the_colab_link(visits: dict) -> None:
    notebooks = [e for e in toc_files() if (ROOT / f"{e}.ipynb").exists()]
    assert notebooks, "no notebook in _toc.yml"
    problems = []
    for entry in notebooks:
        want = colab_link(entry)
        found = visits[f"{entry}.html", WIDE].data["colab"]
        if want not in found:
            problems.append(f"{entry}: want {want}, found {found or 'no Colab link'}")
    assert not problems, report(problems)


def api_pages(visits: dict) -> list[Visit]:
    return [v for v in at(visits, WIDE) if v.page.startswith("book/api/")]


def test_api_pages_render_signatures(visits: dict) -> None:
    pages_ = api_pages(visits)
    assert pages_, "no book/api/*.html page was built (are they in _toc.yml?)"
    problems = []
    for v in pages_:
        if "automodule" in v.data["prose"]:
            problems.append(f"{v.page}: raw autodoc directive")
    assert sum(v.data["functions"] for v in pages_) > 0, "no rendered function entries"
    assert sum(v.data["signatures"] for v in pages_) > 0, "no rendered signatures (dt.sig)"
    assert not problems, report(problems)


def test_api_pages_document_every_module(visits: dict) -> None:
    package = ROOT / "convlab"
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in package.rglob("*.py")
        if p.name != "__main__.py" and (p.parent != package or p.name != "__init__.py")
    )
    modules = [m.removesuffix(".__init__") for m in modules]
    assert len(modules) > 30, f"found only {modules}: the module scan is broken"
    # The three parts' packages are documented on the API index, book/api.html.
    index = [v for v in at(visits, WIDE) if v.page == "book/api.html"]
    ids = {i for v in api_pages(visits) + index for i in v.data["ids"]}
    missing = [m for m in modules if f"module-{m}" not in ids]
    assert not missing, f"convlab modules without an API page: {missing}"


def test_no_fontawesome_script_and_mathjax_only_with_math(visits: dict) -> None:
    problems = []
    for v in at(visits, WIDE):
        loaded = [urlsplit(u).path for u in v.data["resources"]]
        if any("/fontawesome/" in p and p.endswith(".js") for p in loaded):
            problems.append(f"{v.page}: loads the 1.5 MB Font Awesome script")
        mathjax = any("/mathjax/" in p for p in loaded)
        if mathjax and not v.data["mathNodes"]:
            problems.append(f"{v.page}: loads MathJax but has no math")
    assert not problems, report(problems)


def page_bytes(site: str, resources: list[str]) -> int:
    """Bytes of the files a page loaded from the site (its HTML, CSS, JS, fonts, images)."""
    total = 0
    for url in set(resources):
        if not url.startswith(site):
            continue
        path = HTML / unquote(urlsplit(url).path[len(urlsplit(site).path) :])
        total += path.stat().st_size if path.is_file() else 0
    return total


def test_page_weight(site: str, visits: dict) -> None:
    weights = {v.page: page_bytes(site, v.data["resources"]) for v in at(visits, WIDE)}
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "page-weight.txt").write_text(
        "".join(f"{b:>9} {p}\n" for p, b in sorted(weights.items(), key=lambda x: -x[1]))
    )
    heavy = [f"{p}: {b / 1e6:.2f} MB" for p, b in weights.items() if b > MAX_PAGE_BYTES]
    assert not heavy, report(heavy)


def landing_structure(tab: object) -> dict:
    return tab.evaluate(
        """() => {
      const art = document.querySelector('.bd-article');
      const blocks = [...art.querySelectorAll('h2, h3, p, ol, ul, table, div.highlight')];
      const firstTable = blocks.findIndex(b => b.tagName === 'TABLE');
      const lists = [...art.querySelectorAll('ol')].map(ol => ({
        index: blocks.indexOf(ol),
        items: [...ol.children].map(li => [...li.querySelectorAll('a')].map(a => a.href)),
        lines: [...ol.children].map(li => li.getBoundingClientRect().height /
          parseFloat(getComputedStyle(li).lineHeight)),
      }));
      // The questions: headings ending in "?", each with an anchor in the page contents,
      // answered first by a paragraph that starts in bold.
      const toc = [...document.querySelectorAll('.bd-sidebar-secondary a[href^="#"]')]
        .filter(a => a.checkVisibility()).map(a => a.getAttribute('href').slice(1));
      const questions = blocks.map((b, i) => [b, i]).filter(([b]) =>
        /^H[23]$/.test(b.tagName) && b.innerText.replace(/#$/, '').trim().endsWith('?'));
      const answers = questions.map(([, i]) => i);
      const anchored = questions.map(([b]) => {
        const id = (b.closest('section[id]') || {}).id;
        return Boolean(id) && toc.includes(id);
      });
      const answeredFirst = questions.map(([, i]) => {
        const next = blocks[i + 1];
        return Boolean(next && next.tagName === 'P'
          && next.firstElementChild && next.firstElementChild.tagName === 'STRONG'
          && next.innerText.trim().startsWith(next.firstElementChild.innerText.trim()));
      });
      const third = questions[2] ? questions[2][0].closest('section') : null;
      const q3Code = third ? [...third.querySelectorAll('div.highlight')].some(
        d => d.querySelector('button.copybtn')) : false;
      // The opening: who the book is for and what to know first, as paragraphs.
      const opening = ['who it is for', 'what to know first'].map(words =>
        blocks.findIndex(b => b.tagName === 'P'
          && b.innerText.trim().toLowerCase().startsWith(words)));
      const start = [...art.querySelectorAll('a')].filter(a =>
        /start with chapter 1/i.test((a.closest('p, li, div') || a).innerText));
      return {answers, anchored, answeredFirst, q3Code, lists, firstTable, opening,
              start: start.map(a => a.href), n: blocks.length};
    }"""
    )


def test_landing_page_starts_with_answers_then_chapters(site: str, browser: object) -> None:
    """A newcomer's opening first: who the book is for, what to know first, the three
    questions answered in short (one list item each, linking to its detailed answer) and
    the numbered chapter list, "start with chapter 1". Then the detailed answers: headings
    in the page contents, a bold one-sentence answer each, a code block for the third."""
    context = new_context(browser, WIDE)
    try:
        result = Visit(pages()[0], WIDE)
        tab = open_page(context, site + pages()[0], result)
        d = landing_structure(tab)
    finally:
        context.close()
    entries = [f"{e}.html" for e in chapters()]

    def links_to(href: str, entry: str) -> bool:
        return urlsplit(href).path.endswith("/" + entry)

    chapter_lists = [
        ol for ol in d["lists"]
        if len(ol["items"]) == len(entries)
        and all(
            any(links_to(h, e) for h in item)
            for item, e in zip(ol["items"], entries, strict=True)
        )
    ]
    assert len(d["answers"]) >= 3, "fewer than three question headings (ending in '?')"
    assert all(d["anchored"][:3]), f"a question is not in the page contents: {d['anchored']}"
    assert all(d["answeredFirst"][:3]), (
        f"a question is not answered first by a bold sentence: {d['answeredFirst']}"
    )
    assert d["q3Code"], "question 3's section has no code block"
    assert chapter_lists, f"no numbered list linking the {len(entries)} chapters in order"
    first_list = chapter_lists[0]
    assert 0 <= d["opening"][0] < d["opening"][1] < first_list["index"], (
        f"no 'Who it is for' then 'What to know first' paragraph before the chapters: "
        f"{d['opening']}"
    )
    anchors = [urlsplit(h).fragment for ol in d["lists"] for item in ol["items"] for h in item]
    questions = ["q-which-functions", "q-why-no-single", "q-how-to-call"]
    short = [
        ol for ol in d["lists"]
        if len(ol["items"]) == 3 and ol["index"] < first_list["index"]
        and all(any(urlsplit(h).fragment == q for h in item)
                for item, q in zip(ol["items"], questions, strict=True))
    ]
    assert short, (
        f"no 3-item list of short answers linking {questions} before the chapter list "
        f"(list links: {sorted(set(anchors))})"
    )
    assert first_list["index"] < d["answers"][0], (
        "the chapter list does not come before the detailed answers"
    )
    assert d["firstTable"] < 0 or d["firstTable"] > first_list["index"], (
        "a table comes before the chapter list"
    )
    assert max(first_list["lines"]) < 2.6, "a chapter-list item takes more than two lines"
    assert any(links_to(h, entries[0]) for h in d["start"]), (
        "no 'start with chapter 1' sentence linking chapter 1"
    )


def visible(tab: object, selector: str) -> bool:
    """Whether an element is on screen (inside the viewport, not hidden)."""
    return tab.evaluate(
        """(sel) => {
      const e = document.querySelector(sel);
      if (!e || !e.checkVisibility({visibilityProperty: true, opacityProperty: true})) {
        return false;
      }
      const r = e.getBoundingClientRect();
      return r.width > 50 && r.right > 10 && r.left < innerWidth - 10;
    }""",
        selector,
    )


@pytest.mark.parametrize("width", [PHONE, WIDE])
def test_navigation_buttons_open_and_close_the_sidebars(
    site: str, browser: object, width: int
) -> None:
    """Tap the chapter-list button (and the contents button), as a reader would."""
    page = f"{chapters()[0]}.html"
    context = new_context(browser, width)
    problems = []
    try:
        result = Visit(page, width)
        tab = open_page(context, site + page, result)
        for name, button, panel in (
            ("chapter list", ".primary-toggle", ".bd-sidebar-primary"),
            ("contents", ".secondary-toggle", ".bd-sidebar-secondary"),
        ):
            buttons = tab.locator(button)
            shown = [i for i in range(buttons.count()) if buttons.nth(i).is_visible()]
            if width == WIDE and name == "contents" and not shown:
                # At 1366 px the contents panel is always shown, without a button.
                if not visible(tab, panel):
                    problems.append(f"{width}: no contents panel and no button")
                continue
            if len(shown) != 1:
                problems.append(f"{width}: {len(shown)} visible {name} buttons, want 1")
                continue
            before = visible(tab, panel)
            buttons.nth(shown[0]).click()
            tab.wait_for_timeout(400)
            after = visible(tab, panel)
            if after == before:
                problems.append(f"{width}: the {name} button left the panel "
                                f"{'shown' if after else 'hidden'}")
            if width == PHONE and not after:
                problems.append(f"{width}: the {name} did not open")
            tab.keyboard.press("Escape")
            if width == PHONE and visible(tab, panel):
                tab.mouse.click(width - 5, 400)  # tap the dimmed page beside the panel
            tab.wait_for_timeout(300)
        problems += result.errors
    finally:
        context.close()
    assert not problems, report(problems)


def test_colour_mode_button_changes_the_mode_on_the_first_click(
    site: str, browser: object
) -> None:
    context = new_context(browser, WIDE)
    try:
        tab = open_page(context, site + pages()[0], Visit(pages()[0], WIDE))
        before = tab.evaluate("() => document.documentElement.dataset.theme")
        tab.locator(".theme-switch-button").first.click()
        tab.wait_for_timeout(200)
        after = tab.evaluate("() => document.documentElement.dataset.theme")
    finally:
        context.close()
    assert before in ("light", "dark"), f"no colour mode on the page ({before!r})"
    assert after != before, f"one click left the page {before}"


def test_screenshots_were_saved(visits: dict) -> None:
    for name in ("landing", "chapter"):
        for width in VIEWPORTS:
            shot = SHOTS / f"{name}-{width}.png"
            assert shot.is_file() and shot.stat().st_size > 10_000, f"missing or blank {shot}"


# ---- Reading on a phone and on a laptop (both widths, every page) ----

MIN_FIGURE_TEXT_PX = 12
MIN_TAP_PX = 40
SEARCHES = ("convolution_backward", "thnn_conv2d_backward", "finput")


def test_no_word_is_split_mid_identifier(visits: dict) -> None:
    problems = [f"{v.page} @{v.width}: {s}" for v in visits.values() for s in v.data["splits"]]
    assert not problems, report(problems)


# ---- Line breaks inside numbers and code names (both widths, the chapters and landing) ----

# Breaks inside a token, read from the layout: a token's characters on two lines. Text is
# joined across inline elements (a <wbr> or a highlighting span splits a text node) within
# one block. Everywhere: a number or version with its dots ("x1.15", "1.24", "SSE4.1",
# "2.11.0", "Fig. 1.2"'s "1.2"). In code and output boxes also any name or number
# ([A-Za-z0-9_]: "convolution_backward" must not wrap as "convolu|tion_backward", nor at its
# underscores; a break before or after ".", "(", "," or a space is a token boundary).
TOKEN_SPLITS_JS = """
() => {
  const NUMBER = /(?<![A-Za-z0-9_.])[A-Za-z_]*[0-9]+(?:\\.[0-9]+)+/g;
  const NAME = /[A-Za-z0-9_]{2,}(?:\\.[0-9]+)*/g;
  const inline = new Map();
  const isInline = (e) => {
    if (!inline.has(e)) inline.set(e, getComputedStyle(e).display === 'inline');
    return inline.get(e);
  };
  const blockOf = (e) => { while (e.parentElement && isInline(e)) e = e.parentElement; return e; };
  const groups = [];
  for (const sel of ['.bd-article']) {
    const root = document.querySelector(sel);
    if (!root) continue;
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    let last = null;
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const el = n.parentElement;
      if (!el || el.closest('script, style, mjx-container, .MathJax')) { last = null; continue; }
      const block = blockOf(el);
      if (!last || last.block !== block) {
        if (!block.checkVisibility()) { last = null; continue; }
        last = {block, nodes: [], starts: [], text: '', code: !!el.closest('pre')};
        groups.push(last);
      }
      last.starts.push(last.text.length);
      last.nodes.push(n);
      last.text += n.textContent;
    }
  }
  const range = document.createRange();
  const at = (g, i) => {  // the text node and offset of character i of a group
    let k = g.starts.length - 1;
    while (g.starts[k] > i) k--;
    return [g.nodes[k], i - g.starts[k]];
  };
  const top = (g, i) => {
    range.setStart(...at(g, i));
    range.setEnd(...at(g, i + 1));
    const r = [...range.getClientRects()].filter(r => r.width > 0);
    return r.length ? Math.round(r[0].top) : null;
  };
  const splits = [];
  for (const g of groups) {
    const seen = new Set();
    for (const pattern of g.code ? [NUMBER, NAME] : [NUMBER]) {
      for (const m of g.text.matchAll(pattern)) {
        if (seen.has(m.index)) continue;
        seen.add(m.index);
        const end = m.index + m[0].length;
        const [lastNode, lastOffset] = at(g, end - 1);
        range.setStart(...at(g, m.index));
        range.setEnd(lastNode, lastOffset + 1);
        const rects = [...range.getClientRects()].filter(r => r.width > 0);
        if (new Set(rects.map(r => Math.round(r.top))).size < 2) continue;
        const first = top(g, m.index);
        let k = 1;
        while (k < m[0].length && (top(g, m.index + k) ?? first) - first < 2) k++;
        if (k >= m[0].length) continue;
        const where = g.block.closest('div.cell') ? (g.code ? 'code' : 'cell') : 'text';
        splits.push(`${where}: "${m[0].slice(0, k)}|${m[0].slice(k, 40)}"`);
      }
    }
  }
  return splits;
}
"""


@pytest.mark.parametrize("width", [PHONE, WIDE])
def test_no_line_break_inside_a_number_or_a_code_name(visits: dict, width: int) -> None:
    """A number never wraps at its decimal point ("1.|24", "SSE4.|1"), and on a phone code
    wraps at token boundaries (after ",", "(", "." or a space), never inside a name
    ("convolu|tion_backward"); an unbreakable name longer than the line scrolls instead.
    On the landing page and each chapter (read during the `visits` fixture's visit)."""
    found = {page: visits[page, width].data["tokenSplits"] for page in line_break_pages()}
    total = sum(len(s) for s in found.values())
    problems = [f"{page} @{width}: {s}" for page, splits in found.items() for s in splits]
    print(f"@{width}: {total} splits; per page:",
          {p: len(s) for p, s in found.items() if s})
    assert not problems, report(problems)


def test_no_display_equation_is_wider_than_the_column(visits: dict) -> None:
    """At 390 px too: a long equation is split over lines (``aligned``), not cut off."""
    problems = [
        f"{v.page} @{v.width}: {m}" for v in visits.values() for m in v.data["clippedMath"]
    ]
    assert not problems, report(problems)


def test_no_inline_math_is_cut_off(visits: dict) -> None:
    """Inline math at 390 px too: a formula wider than its line scrolls in its box (with
    the cue, checked below), it is not clipped and does not stick out of the column."""
    problems = [f"{v.page} @{v.width}: {m}" for v in visits.values() for m in v.data["cutMath"]]
    assert not problems, report(problems)


def test_boxes_that_scroll_sideways_show_a_cue(visits: dict) -> None:
    problems = [
        f"{v.page} @{v.width}: {b['where']} scrolls with no cue"
        for v in visits.values()
        for b in v.data["scrollers"]
        if not b["cue"]
    ]
    assert not problems, report(problems)


def test_phone_boxes_show_their_lines(visits: dict) -> None:
    """At 390 px printed results and code wrap instead of hiding their lines off-screen:
    no output or code box hides more than 15% of its width (book.css, book.js)."""
    problems = [
        f"{v.page}: {b['where']} ({'output' if b['output'] else 'code'}) hides "
        f"{b['hidden']:.0%} of its width"
        for v in visits.values() if v.width < 600
        for b in v.data["scrollers"]
        if b["pre"] and b["hidden"] > 0.15
    ]
    assert not problems, report(problems)


def test_code_lines_keep_the_code_text(visits: dict) -> None:
    """book.js splits every code box into lines (so a phone can wrap them with a hanging
    indent); the text, which the copy button copies, stays the served page's exactly."""
    boxes = sum(v.data["codeText"]["boxes"] for v in at(visits, WIDE))
    split = sum(v.data["codeText"]["split"] for v in at(visits, WIDE))
    assert boxes > 100 and split == boxes, f"{split} of {boxes} code boxes split into lines"
    problems = [f"{v.page}: {where}" for v in at(visits, WIDE)
                for where in v.data["codeText"]["changed"]]
    assert not problems, report(problems)


def test_figures_are_svg_with_text_of_at_least_12_px(visits: dict) -> None:
    """Figure text renders >= 12 px at both widths; figures are never drawn larger than made."""
    problems = []
    for v in visits.values():
        for fig in v.data["svgFigures"]:
            where = f"{v.page} @{v.width}: {fig['where']} ({fig['src'][:20]})"
            if not fig["svg"]:
                problems.append(f"{where}: not SVG (re-run the chapter: setup() makes SVG)")
                continue
            if fig["minFontPx"] is None:
                problems.append(f"{where}: no text size found in the SVG")
            # 0.05 px: a 9 pt font drawn 1:1 is 12 px, but the SVG's glyph scale is
            # rounded (scale(0.09 -0.09) of a viewBox in pt), so it measures 11.99.
            elif fig["minFontPx"] < MIN_FIGURE_TEXT_PX - 0.05:
                problems.append(
                    f"{where}: smallest text {fig['minFontPx']:.1f} px "
                    f"(figure {fig['width']:.0f} px wide)"
                )
            if fig["intrinsic"] and fig["width"] > fig["intrinsic"] + 1:
                problems.append(f"{where}: stretched to {fig['width']:.0f} px from "
                                f"{fig['intrinsic']:.0f} px")
    assert not problems, report(problems)


def test_chapter_tables_have_captions(visits: dict) -> None:
    """Every table in a chapter has a numbered caption (``Table(..., caption=...)``)."""
    problems = [
        f"{entry}: {t['where']}"
        for entry in chapters()
        for t in visits[f"{entry}.html", WIDE].data["tables"]
        if not re.match(r"Table \d+\s*\S", t["caption"])
    ]
    assert not problems, report(problems)


def test_phone_tables_keep_every_column_readable(visits: dict) -> None:
    """At 390 px every table shows all its columns without scrolling: each column at
    least MIN_COLUMN_PX wide, or the table stacked (one card per row), and no table wider
    than its box. Before, the landing page's "Backward kernel and file" column was a
    sliver and Tables 3.1/3.3 hid their last column off-screen."""
    problems = []
    for v in at(visits, PHONE):
        for t in v.data["tables"]:
            name = t["caption"][:40] or t["where"]
            if t["hidden"] > 1:
                problems.append(f"{v.page}: {name}: {t['hidden']} px off-screen")
            if not t["stacked"] and t["narrowest"] is not None and (
                t["narrowest"] < MIN_COLUMN_PX
            ):
                problems.append(f"{v.page}: {name}: a column {t['narrowest']} px wide")
    tables = sum(len(v.data["tables"]) for v in at(visits, PHONE))
    assert tables, "no table on any page: the check saw nothing"
    assert not problems, report(problems)


def test_no_fullscreen_button_on_a_phone_and_40_px_tap_targets(visits: dict) -> None:
    problems = []
    for v in at(visits, PHONE):
        if v.data["fullscreen"]:
            problems.append(f"{v.page}: a fullscreen button")
        for b in v.data["headerButtons"]:
            if min(b["w"], b["h"]) < MIN_TAP_PX - 0.5:
                problems.append(f"{v.page}: {b['name'][:30]} is {b['w']:.0f}x{b['h']:.0f} px")
    assert not problems, report(problems)


def test_chapters_have_edit_and_issue_buttons(visits: dict) -> None:
    repo = CONFIG["repository"]["url"].rstrip("/")
    problems = []
    for entry in chapters():
        for width in VIEWPORTS:
            buttons = visits[f"{entry}.html", width].data["buttons"]
            hrefs = {b["title"]: b["href"] for b in buttons}
            edit, issue = hrefs.get("Suggest edit", ""), hrefs.get("Open an issue", "")
            if not edit.startswith(f"{repo}/edit/") or not edit.endswith(f"{entry}.ipynb"):
                problems.append(f"{entry} @{width}: edit button {edit or 'missing'}")
            if not issue.startswith(f"{repo}/issues/new"):
                problems.append(f"{entry} @{width}: issue button {issue or 'missing'}")
    assert not problems, report(problems)


def test_book_pdf_is_linked_only_when_it_exists(visits: dict) -> None:
    """``make pdf``'s book is in every page's download menu, and only if it was built."""
    linked = [
        v.page for v in at(visits, WIDE)
        if any(urlsplit(h).path.endswith("/book.pdf") for h in v.data["links"])
    ]
    with_menu = [
        v.page for v in at(visits, WIDE)
        if any(b["title"] == "Print this page" for b in v.data["buttons"])
    ]
    if (HTML / "book.pdf").is_file():
        assert with_menu, "no page has the download menu"
        missing = sorted(set(with_menu) - set(linked))
        assert not missing, f"pages whose download menu lacks book.pdf: {missing[:5]}"
    else:
        assert not linked, f"book.pdf is linked but not built (make pdf): {linked[:3]}"


ACTION_LABELS = ("Run on Colab", "Download notebook", "Download .py", "All notebooks (.zip)")
BOOK_PDF_LABEL = "Whole book (PDF)"


def local_file(site: str, href: str) -> Path | None:
    """The file under _build/html a link of the served site points to (None if off-site)."""
    if not href.startswith(site):
        return None
    return HTML / unquote(urlsplit(href).path[len(urlsplit(site).path) :])


def test_chapters_have_labelled_run_and_download_buttons(site: str, visits: dict) -> None:
    """Under each chapter's title, at both widths: "Run on Colab" (the chapter's Colab
    copy), "Download notebook", "Download .py" and the zip of all notebooks, each shown,
    labelled, inside the column, >= 40 px tall, its file present; "Whole book (PDF)" too
    when ``make pdf`` built it. The theme's print button says it prints this page."""
    with_pdf = (HTML / "book.pdf").is_file()
    problems = []
    for entry in chapters():
        for width in VIEWPORTS:
            d = visits[f"{entry}.html", width].data
            by_label = {a["text"]: a for a in d["actions"]}
            wanted = ACTION_LABELS + ((BOOK_PDF_LABEL,) if with_pdf else ())
            for label in wanted:
                a = by_label.get(label)
                if a is None:
                    problems.append(f"{entry} @{width}: no {label!r} button ({list(by_label)})")
                    continue
                if not a["shown"] or not a["inside"] or a["h"] < MIN_TAP_PX - 0.5:
                    problems.append(f"{entry} @{width}: {label!r} shown={a['shown']} "
                                    f"inside={a['inside']} {a['w']:.0f}x{a['h']:.0f} px")
                if label == "Run on Colab":
                    if a["href"] != colab_link(entry):
                        problems.append(f"{entry}: Colab button goes to {a['href']}")
                    continue
                target = local_file(site, a["href"])
                if target is None or not target.is_file() or target.stat().st_size == 0:
                    problems.append(f"{entry} @{width}: {label!r} -> missing {a['href']}")
            if not with_pdf and BOOK_PDF_LABEL in by_label:
                problems.append(f"{entry}: {BOOK_PDF_LABEL!r} without a built book.pdf")
            titles = [b["title"] for b in d["buttons"]]
            if "Print to PDF" in titles or "Print this page" not in titles:
                problems.append(f"{entry} @{width}: print button titles {titles}")
    assert not problems, report(problems)


def test_landing_page_offers_the_whole_book_downloads(site: str, visits: dict) -> None:
    d = visits[pages()[0], PHONE].data
    by_label = {a["text"]: a for a in d["actions"]}
    wanted = ["All notebooks (.zip)"] + ([BOOK_PDF_LABEL] if (HTML / "book.pdf").is_file() else [])
    for label in wanted:
        assert label in by_label, f"landing page: no {label!r} button ({list(by_label)})"
        target = local_file(site, by_label[label]["href"])
        assert target is not None and target.is_file(), f"{label}: missing target"


def print_view(tab: object) -> dict:
    """What the print layout shows: web-control texts, figure breaks, buttons."""
    tab.emulate_media(media="print")
    return tab.evaluate(
        """() => {
      const shown = e => e.checkVisibility();
      const controls = [...document.querySelectorAll('body *')].filter(e =>
        e.children.length === 0 && shown(e)
        && /^((Show|Hide) code cell|Hide the solution)/.test((e.textContent || "").trim()));
      const figures = [...document.querySelectorAll('.bd-article figure')].filter(shown);
      return {
        toggles: document.querySelectorAll('details.hide summary').length,
        controls: controls.map(e => e.textContent.trim()),
        figures: figures.length,
        split: figures.filter(f => getComputedStyle(f).breakInside !== 'avoid').length,
        figcaptions: figures.filter(f => f.querySelector('figcaption')).length,
        actions: [...document.querySelectorAll('.book-actions')].filter(shown).length,
      };
    }"""
    )


def test_print_layout_has_no_web_controls_and_keeps_figures_whole(visits: dict) -> None:
    """``make pdf`` prints this layout: no "Show code cell source" toggle, no buttons, and
    every figure kept on one page with its caption (break-inside: avoid). Read at 1366 px
    with print media emulated, during the `visits` fixture's visit."""
    folded = [e for e in chapters() if '"hide-input"' in (ROOT / f"{e}.ipynb").read_text()]
    assert folded, "no chapter has a folded (hide-input) code cell to check"
    problems = []
    for entry in folded:
        d = visits[f"{entry}.html", WIDE].data["print"]
        if not d["toggles"]:
            problems.append(f"{entry}: no folded cell found on the page")
        if d["controls"] or d["actions"]:
            problems.append(f"{entry}: prints {d['controls'][:3]} and {d['actions']} "
                            "button rows")
        if d["split"]:
            problems.append(f"{entry}: {d['split']} of {d['figures']} figures may split")
    assert not problems, report(problems)


SOLUTIONS_JS = """
() => [...document.querySelectorAll('.bd-article div.cell.solution')].map(cell => {
  const fold = cell.querySelector('details.hide');
  const label = fold && [...fold.querySelectorAll(':scope > summary p')]
    .filter(p => p.checkVisibility()).map(p => p.textContent.trim()).join(' ');
  return {
    folded: !!fold && !fold.open,
    label,
    inputInside: !!(fold && fold.querySelector('.cell_input')),
    outputInside: !cell.querySelector('.cell_output')
      || !!(fold && fold.querySelector('.cell_output')),
    shown: [...cell.querySelectorAll('.cell_input, .cell_output')]
      .filter(e => e.checkVisibility()).length,
  };
})
"""


@pytest.mark.parametrize("width", [WIDE, PHONE])
def test_exercise_solutions_fold_code_and_output_under_solution(
    visits: dict, width: int
) -> None:
    """Each chapter's three solutions fold whole (code and printed answer) under a toggle
    labelled "Solution" (_ext/book_solutions.py); opened, both show. Read and clicked at
    this width during the `visits` fixture's visit."""
    problems, total = [], 0
    for entry in chapters():
        d = visits[f"{entry}.html", width].data
        closed = d["solutions"]
        total += len(closed)
        if len(closed) != 3:
            problems.append(f"{entry}: {len(closed)} folded solutions, not 3")
        for i, cell in enumerate(closed, 1):
            if not (cell["folded"] and cell["inputInside"] and cell["outputInside"]):
                problems.append(f"{entry} solution {i}: code and output not both folded")
            if cell["label"] != "Solution" or cell["shown"]:
                problems.append(f"{entry} solution {i}: toggle {cell['label']!r}, "
                                f"{cell['shown']} parts shown while folded")
        for i, cell in enumerate(d["solutionsOpened"], 1):
            if not cell["shown"] or cell["label"] != "Hide the solution":
                problems.append(f"{entry} solution {i}: opened, shows {cell['shown']} "
                                f"parts under {cell['label']!r}")
    assert total == 3 * len(chapters()), f"{total} solutions on {len(chapters())} chapters"
    assert not problems, report(problems)


def first_page_with(visits: dict, key: str) -> str | None:
    return next((v.page for v in at(visits, WIDE) if v.data[key]), None)


@pytest.mark.parametrize("width", [WIDE, PHONE])
def test_long_outputs_fold_and_unfold(site: str, browser: object, visits: dict,
                                      width: int) -> None:
    page = first_page_with(visits, "folds")
    assert page, "no page has a folded long output (book.js folds outputs over 30 lines)"
    context = new_context(browser, width)
    try:
        result = Visit(page, width)
        tab = open_page(context, site + page, result)
        button = tab.locator("button.output-fold").first
        box = button.locator("xpath=preceding-sibling::*[1]")
        folded = box.bounding_box()["height"]
        button.click()
        opened = box.bounding_box()["height"]
        button.click()
        again = box.bounding_box()["height"]
    finally:
        context.close()
    assert opened > folded * 1.3, f"{page}: unfolding grew the output {folded} -> {opened} px"
    assert abs(again - folded) < 2, f"{page}: folding again gave {again} px, not {folded}"
    assert not result.errors, report(result.errors)


def drawer_open(tab: object, panel: str) -> bool:
    return visible(tab, panel)


def test_phone_drawers_close_after_tapping_an_entry(site: str, browser: object) -> None:
    """Contents drawer: tap an entry, the page scrolls there and the drawer closes; the
    chapter drawer closes too; drawer entries are >= 40 px tall."""
    page = f"{chapters()[0]}.html"
    context = new_context(browser, PHONE)
    problems = []
    try:
        result = Visit(page, PHONE)
        tab = open_page(context, site + page, result)
        for name, button, panel, link in (
            ("contents", ".secondary-toggle", ".bd-sidebar-secondary", "nav a[href^='#']"),
            ("chapter list", ".primary-toggle", ".bd-sidebar-primary",
             "nav.bd-docs-nav a.current, nav.bd-docs-nav li.current > a"),
        ):
            tab.locator(button).first.click()
            tab.wait_for_timeout(400)
            if not drawer_open(tab, panel):
                problems.append(f"the {name} drawer did not open")
                continue
            heights = tab.evaluate(
                "(sel) => [...document.querySelectorAll(sel + ' nav a')]"
                ".filter(a => a.checkVisibility()).map(a => a.getBoundingClientRect().height)",
                panel,
            )
            if heights and min(heights) < MIN_TAP_PX - 0.5:
                problems.append(f"{name} entries are {min(heights):.0f} px tall")
            entries = tab.locator(f"{panel} {link}")
            if entries.count() == 0:
                problems.append(f"no entry to tap in the {name} drawer")
                continue
            entries.nth(min(1, entries.count() - 1)).click()
            tab.wait_for_timeout(500)
            if drawer_open(tab, panel):
                problems.append(f"the {name} drawer stayed open after a tap")
        problems += result.errors
    finally:
        context.close()
    assert not problems, report(problems)


def search_results(tab: object, site: str, query: str) -> list[str]:
    tab.goto(f"{site}search.html?q={query}", wait_until="load")
    # Sphinx shows results one by one, then "Search finished, found N pages ...".
    tab.wait_for_function(
        "() => { const s = document.querySelector('#search-results .search-summary');"
        " return s && /found|did not match/i.test(s.innerText); }",
        timeout=20_000,
    )
    return tab.evaluate(
        "() => [...document.querySelectorAll('#search-results li > a')].map(a => a.href)"
    )


# Result titles split inside a word (the same rule as the page check: a break right after
# "_" is a word boundary; the titles are long dotted API names).
RESULT_SPLITS_JS = """
() => {
  const splits = [];
  const range = document.createRange();
  for (const a of document.querySelectorAll('#search-results li > a')) {
    const texts = document.createTreeWalker(a, NodeFilter.SHOW_TEXT);
    for (let n = texts.nextNode(); n; n = texts.nextNode()) {
      for (const m of n.textContent.matchAll(/[A-Za-z0-9_]{2,}/g)) {
        const tops = [];
        for (let k = 0; k < m[0].length; k++) {
          range.setStart(n, m.index + k);
          range.setEnd(n, m.index + k + 1);
          tops.push(Math.round(range.getBoundingClientRect().top));
        }
        const k = tops.findIndex(t => Math.abs(t - tops[0]) >= 2);
        if (k > 0 && m[0][k - 1] !== '_') {
          splits.push(`${m[0].slice(0, k)}|${m[0].slice(k)}`);
        }
      }
    }
  }
  return splits;
}
"""


def result_target(href: str) -> str:
    """A search result's page and anchor, without book.js's ?highlight= query."""
    parts = urlsplit(href)
    return parts.path.rsplit("/", 1)[-1] + (f"#{parts.fragment}" if parts.fragment else "")


@pytest.mark.parametrize("width", [WIDE, PHONE])
def test_search_shows_one_glossary_entry_then_the_chapters(searches: dict, width: int) -> None:
    """For a name the book explains: its glossary entry first and only once in the top 5,
    then a chapter; no result twice; no result title broken inside a word."""
    chapter_pages = {f"{Path(e).name}.html" for e in chapters()}
    problems = []
    for query in SEARCHES:
        found = searches[query, width]
        hits = [result_target(h) for h in found["hits"]]
        top = hits[:5]
        glossary = [h for h in top if h.startswith("glossary.html")]
        if not hits or hits[0] != f"glossary.html#term-{query}":
            problems.append(f"{query}: first hit {hits[:1]}, not its glossary entry")
        if len(glossary) != 1:
            problems.append(f"{query}: {len(glossary)} glossary hits in the top 5: {top}")
        if len(hits) < 2 or hits[1].split("#")[0] not in chapter_pages:
            problems.append(f"{query}: second hit {hits[1:2]} is not a chapter")
        if len(set(top)) < len(top):
            problems.append(f"{query}: a result twice in the top 5: {top}")
        if found["titleSplits"]:
            problems.append(f"{query}: result titles split mid-word: {found['titleSplits'][:3]}")
    assert not problems, report(problems)


# The ten queries a reader tried (round 5 of the reader test) and the chapters that teach
# each: the title, a section title or the glossary entry names it. One of them must be in
# the top 3 (the glossary entry of the term is usually first).
QUERY_CHAPTERS = {
    "finput": ("02_from_scratch",),
    "convolution_backward": ("04_derivatives_yaml", "05_calling_native"),
    "output_mask": ("11_calling_contract", "04_derivatives_yaml"),
    "cudnn": ("03_dispatch", "07_backends_performance"),
    "double backward": ("06_double_backward",),
    "thnn_conv2d_backward": ("12_migration_cookbook", "08_then_and_now", "02_from_scratch"),
    "mkldnn": ("03_dispatch",),
    "per-sample": ("09_beyond",),
    "deterministic": ("10_determinism_accuracy",),
    "derivatives.yaml": ("04_derivatives_yaml",),
}
SNIPPETS_JS = """
() => [...document.querySelectorAll('#search-results li')].map(li => ({
  href: (li.querySelector('a') || {}).href || '',
  context: (li.querySelector('.context') || {textContent: ''}).textContent,
  // Highlights inside a longer word ("per" in "property"): a letter or digit beside it.
  highlights: [...li.querySelectorAll('.highlighted')].map(e => ({
    text: e.textContent.toLowerCase(),
    inside: /[A-Za-z0-9]/.test((e.previousSibling && e.previousSibling.textContent || '')
      .slice(-1) + (e.nextSibling && e.nextSibling.textContent || '').slice(0, 1)),
  })),
}))
"""


# Each result's snippet is fetched after the list is shown ("Search finished"): done when
# each of the first five results has its snippet (p.context) or a description instead.
SNIPPETS_DONE_JS = """
() => [...document.querySelectorAll('#search-results li')].slice(0, 5).every(
  li => li.querySelector('.context') || li.querySelector(':scope > span'))
"""


@pytest.fixture(scope="module")
def searches(site: str, browser: object) -> dict[tuple[str, int], dict]:
    """Every query of QUERY_CHAPTERS and SEARCHES at both widths, typed into the search
    page one after the other in one tab per width: the result links, the snippets and
    the result titles split inside a word."""
    found = {}
    for width in VIEWPORTS:
        context = new_context(browser, width)
        try:
            tab = context.new_page()
            for query in dict.fromkeys([*QUERY_CHAPTERS, *SEARCHES]):
                hits = search_results(tab, site, query)
                try:
                    tab.wait_for_function(SNIPPETS_DONE_JS, timeout=10_000)
                except PlaywrightTimeout:
                    pass  # read what is there: a missing snippet is the checks' to report
                tab.wait_for_timeout(100)  # book.js's breaks in the last titles
                found[query, width] = {"hits": hits, "shown": tab.evaluate(SNIPPETS_JS),
                                       "titleSplits": tab.evaluate(RESULT_SPLITS_JS)}
        finally:
            context.close()
    return found


@pytest.mark.parametrize("width", [WIDE, PHONE])
@pytest.mark.parametrize("query", list(QUERY_CHAPTERS))
def test_search_ranks_the_chapter_about_the_query_in_the_top_3(
    searches: dict, query: str, width: int
) -> None:
    """A chapter that teaches the query is in the top 3; no page twice; the snippets come
    from the text around the query (no print-only contents list, no raw TeX) and the
    query is highlighted as typed ("per-sample", not "per" in "property")."""
    wanted = QUERY_CHAPTERS[query]
    problems = []
    hits = [result_target(h) for h in searches[query, width]["hits"]]
    shown = searches[query, width]["shown"]
    pages_ = [h.split("#")[0] for h in hits]
    targets = [f"{Path(w).name}.html" for w in wanted]
    rank = next((i + 1 for i, p in enumerate(pages_) if p in targets), None)
    print(f"{query!r} @{width}: rank {rank}")
    if rank is None or rank > 3:
        problems.append(f"{wanted} at rank {rank}; top 3: {hits[:3]}")
    twice = sorted({p for p in pages_ if pages_.count(p) > 1})
    if twice:
        problems.append(f"pages listed twice: {twice}")
    words = re.findall(r"\w+", query.lower())
    typed = set(query.lower().split())
    for item in shown[:5]:
        where = result_target(item["href"])
        text = " ".join(item["context"].split())
        if text and RAW_TEX.search(text):
            problems.append(f"raw TeX in the snippet of {where}: {text[:80]}")
        if text and not any(w in text.lower() for w in words):
            problems.append(f"the snippet of {where} lacks the query: {text[:80]}")
        partial = [h["text"] for h in item["highlights"] if h["inside"] and h["text"] not in typed]
        if partial:
            problems.append(f"{where} highlights parts of words: {partial[:3]}")
    assert not problems, f"{query!r}: " + report(problems)


@pytest.mark.parametrize("width", [WIDE, PHONE])
def test_search_highlights_only_the_result_page(site: str, browser: object, width: int) -> None:
    """A result opened from the search shows the matches; the next page shows none."""
    context = new_context(browser, width)
    try:
        tab = context.new_page()
        hits = search_results(tab, site, "finput")
        assert hits, "no result for finput"
        tab.locator("#search-results li > a").first.click()
        tab.wait_for_load_state("load")
        tab.wait_for_timeout(300)
        on_result = tab.evaluate("() => document.querySelectorAll('span.highlighted').length")
        tab.goto(site + f"{chapters()[-1]}.html", wait_until="load")
        tab.wait_for_timeout(300)
        after = tab.evaluate("() => document.querySelectorAll('span.highlighted').length")
    finally:
        context.close()
    assert on_result > 0, "the result page shows no highlighted match"
    assert after == 0, f"{after} stale highlights on the next page"


@pytest.mark.parametrize("width", [WIDE, PHONE])
def test_search_icon_does_not_cover_the_query(site: str, browser: object, width: int) -> None:
    page = f"{chapters()[0]}.html"
    context = new_context(browser, width)
    try:
        tab = open_page(context, site + page, Visit(page, width))
        tab.locator(".search-button__button:visible").first.click()
        tab.wait_for_timeout(300)
        tab.keyboard.type("convolution_backward")
        box = tab.evaluate(
            """() => {
          const form = [...document.querySelectorAll('form.bd-search')]
            .find(f => f.checkVisibility());
          if (!form) return null;
          const input = form.querySelector('input');
          const icon = form.querySelector('i, svg, .fa-magnifying-glass');
          const r = input.getBoundingClientRect();
          const textStart = r.left + parseFloat(getComputedStyle(input).paddingLeft);
          const i = icon ? icon.getBoundingClientRect() : null;
          return {textStart, iconLeft: i && i.left, iconRight: i && i.right,
                  iconShown: !!(icon && icon.checkVisibility()), value: input.value};
        }"""
        )
    finally:
        context.close()
    assert box, "no visible search form after tapping the search button"
    assert box["value"] == "convolution_backward", f"typing went elsewhere: {box['value']!r}"
    if box["iconShown"]:
        overlaps = box["iconLeft"] < box["textStart"] and box["iconRight"] > box["textStart"]
        assert not overlaps, f"the search icon covers the query: {box}"


def prompt_page() -> str:
    """A page with a doctest (``>>>``) block that has a copy button."""
    for path in sorted(HTML.rglob("*.html")):
        rel = path.relative_to(HTML).as_posix()
        if NOT_PAGES & set(path.relative_to(HTML).parts):
            continue
        if '<span class="gp">&gt;&gt;&gt; </span>' in path.read_text(errors="replace"):
            return rel
    pytest.fail("no page has a >>> prompt (the API pages' doctests)")


@pytest.mark.parametrize("width", [WIDE, PHONE])
def test_copy_button_copies_code_without_prompts(site: str, browser: object, width: int) -> None:
    page = prompt_page()
    context = browser.new_context(
        viewport=VIEWPORTS[width], permissions=["clipboard-read", "clipboard-write"]
    )
    try:
        tab = open_page(context, site + page, Visit(page, width))
        block = tab.locator("div.highlight:has(span.gp)").first
        block.hover()
        block.locator("button.copybtn").click(force=True)
        tab.wait_for_timeout(200)
        copied = tab.evaluate("() => navigator.clipboard.readText()")
        shown = block.inner_text()
    finally:
        context.close()
    assert ">>>" in shown, "the block has no prompt to skip"
    assert copied.strip(), "the copy button copied nothing"
    bad = [line for line in copied.splitlines() if re.match(r"\s*(>>>|\.\.\.)( |$)", line)]
    assert not bad, f"{page}: copied prompts: {bad[:3]}"


# A phone screen (the 390 x 844 viewport) and the longest a chapter and one table may be.
PHONE_SCREEN = VIEWPORTS[PHONE]["height"]
MAX_CHAPTER_SCREENS, MAX_TABLE_SCREENS = 80, 10


def test_chapters_and_tables_fit_a_phone_reader(visits: dict) -> None:
    """At 390 px no chapter is longer than 80 screens and no table longer than 10: the
    records' tables live in the Records appendix; a chapter shows verdicts."""
    problems = []
    for v in at(visits, PHONE):
        if v.page.removesuffix(".html") not in chapters():
            continue
        page = v.data["articleHeight"] / PHONE_SCREEN
        table = v.data["tallestTable"] / PHONE_SCREEN
        if page > MAX_CHAPTER_SCREENS:
            problems.append(f"{v.page}: {page:.0f} screens (at most {MAX_CHAPTER_SCREENS})")
        if table > MAX_TABLE_SCREENS:
            problems.append(f"{v.page}: a table of {table:.1f} screens "
                            f"(at most {MAX_TABLE_SCREENS})")
    assert not problems, report(problems)
