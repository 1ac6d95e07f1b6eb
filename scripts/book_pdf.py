"""Print the whole book to one PDF with the system Chromium (``make pdf``).

Builds the book as a single HTML page (Sphinx's ``singlehtml`` builder keeps the chapter
and figure numbers), serves it on 127.0.0.1, waits for MathJax, and prints it with
Playwright's ``page.pdf`` driving ``/usr/bin/chromium`` (``playwright install`` is not
needed). The print stylesheet (``_ext/static/book.css``) wraps long code lines instead of
cutting them, leaves out the web controls ("Show code cell source" toggles, buttons) and
keeps each figure on one page with its caption. Folded content prints open; each chapter's
exercise solutions print at the chapter's end (``SOLUTIONS_JS``). The API
reference is left out of the reader's PDF (it was 35 % of the pages): one paragraph points
to it on the site, and links into it go there (``--with-api`` keeps it, after the chapters).
Writes ``_build/pdf/book.pdf`` and refuses one with a near-blank page (a code box or
table kept whole and moved to the next page); the next ``make book`` links it from every page.
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
# The singlehtml marker of the API reference's first page (``_toc.yml``: book/api).
API_DOC = "book/api"
# Texts of web controls that must not print.
WEB_CONTROLS = ("Show code cell", "Hide code cell", "Hide the solution", "Copy to clipboard")
# Runs in the page before printing: folded content opens (sphinx-togglebutton's admonitions
# and <details>); the API reference goes, its links pointing to the site; links to anchors
# of this document become links inside the PDF.
PREPARE_JS = """
([apiDoc, site, dropApi]) => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  const moved = new Map();
  let removed = 0;
  const start = document.getElementById('document-' + apiDoc);
  if (dropApi && start) {
    const block = [start];
    for (let n = start.nextElementSibling; n; n = n.nextElementSibling) {
      if (n.matches('span[id^="document-"]') && !n.id.startsWith('document-' + apiDoc)) break;
      block.push(n);
    }
    let doc = apiDoc;
    for (const root of block) {
      for (const e of [root, ...root.querySelectorAll('[id]')]) {
        if (e.id.startsWith('document-')) doc = e.id.slice('document-'.length);
        if (e.id) moved.set(e.id, e.id.startsWith('document-') ? site + doc + '.html'
                                                                : site + doc + '.html#' + e.id);
      }
    }
    const note = document.createElement('section');
    note.id = 'api-reference-online';
    note.innerHTML = '<h1>API reference</h1><p>The API reference of convlab (every module, '
      + 'function and class) is on the web site: <a href="' + site + apiDoc + '.html">'
      + site + apiDoc + '.html</a>.</p>';
    start.before(note);
    block.forEach(n => n.remove());
    removed = block.length;
  }
  let retargeted = 0;
  for (const a of document.querySelectorAll('a[href]')) {
    const url = new URL(a.href, location.href);
    const id = decodeURIComponent(url.hash.slice(1));
    if (!id || url.origin !== location.origin) continue;
    if (moved.has(id)) { a.href = moved.get(id); retargeted++; }
    else if (document.getElementById(id)) a.setAttribute('href', '#' + id);
  }
  return {removed, retargeted};
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
    const end = document.createElement('section');
    end.className = 'print-solutions';
    const title = document.createElement('h2');
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
      const label = document.createElement('h3');
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
# Visible texts of web controls in the print layout (must be none).
CONTROLS_JS = """
(texts) => [...document.querySelectorAll('body *')].filter(e =>
  e.children.length === 0 && e.checkVisibility()
  && texts.some(t => (e.textContent || '').trim().startsWith(t))).length
"""
# A page of the printed book holds 2,000-4,000 characters; one with under this many (and
# no figure) is mostly blank paper.
NEAR_BLANK_CHARS = 300
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


def landing(single: Path) -> str:
    """The page to print: singlehtml writes the book to the root document's path
    (``book/intro.html``, which index.html redirects to) but links its assets as if it
    sat in the top folder (``_static/``), so a copy there is what renders completely."""
    redirect = re.search(r'url=([^"]+)"', (single / "index.html").read_text())
    page = single / (redirect.group(1) if redirect else "index.html")
    (single / "_print.html").write_text(page.read_text(encoding="utf-8"), encoding="utf-8")
    return "_print.html"


def site_url() -> str:
    """The published site (``html: baseurl`` in ``_config.yml``), ending in "/"."""
    import yaml

    return yaml.safe_load(CONFIG.read_text())["html"]["baseurl"].rstrip("/") + "/"


def print_pdf(url: str, out: Path, single: Path, with_api: bool = False) -> None:
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
            done = page.evaluate(PREPARE_JS, [API_DOC, site_url(), not with_api])
            page.evaluate(SOLUTIONS_JS)
            if not with_api and not done["removed"]:
                raise SystemExit(f"no #document-{API_DOC} in the single page: API not found")
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
            page.pdf(
                path=str(out), format="A4", print_background=True,
                margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"},
                display_header_footer=True, header_template="<div></div>",
                footer_template=FOOTER, outline=True, tagged=True,
            )
        finally:
            browser.close()


def near_blank_pages(pdf: Path, min_chars: int = NEAR_BLANK_CHARS) -> list[int]:
    """Pages (1-based) with under ``min_chars`` characters of text and no figure caption,
    the last page excepted: what a box kept whole (break-inside: avoid) leaves behind when
    it moves to the next page. A figure is drawn, not text, so its page is kept by its
    caption ("Fig. 3.1")."""
    from pypdf import PdfReader

    pages = PdfReader(str(pdf)).pages
    blank = []
    for number, page in enumerate(pages[:-1], start=1):
        text = (page.extract_text() or "").strip()
        if len(text) < min_chars and not re.search(r"\bFig\. \d+\.\d+", text):
            blank.append(number)
    return blank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--no-build", action="store_true",
                        help="print the existing _build/singlehtml")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--with-api", action="store_true",
                        help="keep the API reference (after the chapters)")
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
        print_pdf(url, args.out, single, with_api=args.with_api)
    finally:
        server.shutdown()
        server.server_close()
    blank = near_blank_pages(args.out)
    if blank:
        raise SystemExit(f"near-blank pages (under {NEAR_BLANK_CHARS} characters of text): "
                         f"{blank[:10]} (book.css @media print)")
    size = args.out.stat().st_size / 1e6
    print(f"wrote {args.out} ({size:.1f} MB, printed in "
          f"{time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
