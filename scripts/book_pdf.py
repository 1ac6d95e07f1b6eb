"""Print the whole book to one PDF with the system Chromium (``make pdf``).

Builds the book as a single HTML page (Sphinx's ``singlehtml`` builder keeps the chapter
and figure numbers), serves it on 127.0.0.1, waits for MathJax, and prints it with
Playwright's ``page.pdf`` driving ``/usr/bin/chromium`` (``playwright install`` is not
needed). The print stylesheet (``_ext/static/book.css``) wraps long code lines instead of
cutting them. Writes ``_build/pdf/book.pdf``; the next ``make book`` links it from every
page's download menu.
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


def print_pdf(url: str, out: Path, single: Path) -> None:
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
            page.emulate_media(media="print")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--no-build", action="store_true",
                        help="print the existing _build/singlehtml")
    parser.add_argument("--out", type=Path, default=OUT)
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
        print_pdf(url, args.out, single)
    finally:
        server.shutdown()
        server.server_close()
    size = args.out.stat().st_size / 1e6
    print(f"wrote {args.out} ({size:.1f} MB, printed in "
          f"{time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
