"""How much of the built site a phone reader has to scroll sideways to see.

Opens every page of ``_build/html`` (or ``--html DIR``) in headless Chromium at 390 x 844
(a phone) and counts, per page, the code and output boxes that hide more than
``--hidden`` (15 %) of their width (``1 - clientWidth / scrollWidth``), split into code
(inputs and code blocks) and outputs, and the tables that are wider than their box.

Usage: python scripts/phone_audit.py [--html DIR] [--hidden 0.15] [--json FILE]

Needs the ``playwright`` package and ``/usr/bin/chromium`` (no browser download).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
PHONE = {"width": 390, "height": 844}
NOT_PAGES = {"_static", "_sources", "_images", "_sphinx_design_static"}
# A page that only redirects (jupyter-book's root index.html).
REDIRECT = re.compile(r'<meta[^>]+http-equiv="refresh"', re.I)
MEASURE_JS = """
(hidden) => {
  const article = document.querySelector('.bd-article');
  if (!article) return null;
  const boxes = [...article.querySelectorAll('div.highlight pre')]
    .filter(e => e.checkVisibility() && e.scrollWidth > 0);
  const share = e => 1 - e.clientWidth / e.scrollWidth;
  const isOutput = e => e.closest('.cell_output') !== null;
  const cut = boxes.filter(e => share(e) > hidden);
  const tables = [...article.querySelectorAll('table')]
    .filter(t => t.checkVisibility() && !t.closest('.sig, dl.field-list'));
  const box = t => t.closest('.pst-scrollable-table-container, .table-wrapper')
    || t.parentElement;
  return {
    code: boxes.filter(e => !isOutput(e)).length,
    outputs: boxes.filter(isOutput).length,
    code_cut: cut.filter(e => !isOutput(e)).length,
    outputs_cut: cut.filter(isOutput).length,
    tables: tables.length,
    tables_wide: tables.filter(t => t.getBoundingClientRect().width
      > box(t).clientWidth + 1).length,
    tables_stacked: tables.filter(t => t.classList.contains('stacked')).length,
    median_hidden: (() => {
      const s = cut.map(share).sort((a, b) => a - b);
      return s.length ? s[Math.floor(s.length / 2)] : 0;
    })(),
  };
}
"""


def pages(html: Path) -> list[str]:
    """Every HTML page of the build, relative to it, without asset folders or redirects."""
    found = []
    for path in sorted(html.rglob("*.html")):
        rel = path.relative_to(html)
        if NOT_PAGES & set(rel.parts) or REDIRECT.search(path.read_text(errors="replace")):
            continue
        found.append(rel.as_posix())
    return found


def serve(html: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """The build served on 127.0.0.1 from a daemon thread, and its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def audit(html: Path, hidden: float) -> dict[str, dict]:
    """Per page: the counts of :data:`MEASURE_JS` at phone width."""
    from playwright.sync_api import sync_playwright

    server, base = serve(html)
    results: dict[str, dict] = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--disable-gpu"])
            context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True,
                                          device_scale_factor=1)
            # Nothing but the local server: a stray CDN request fails at once.
            context.route("**/*", lambda route: route.continue_()
                          if route.request.url.startswith(base) else route.abort())
            tab = context.new_page()
            for page in pages(html):
                tab.goto(base + page, wait_until="load")
                if tab.url != base + page:
                    continue
                tab.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
                found = tab.evaluate(MEASURE_JS, hidden)
                if found is not None:
                    results[page] = found
            browser.close()
    finally:
        server.shutdown()
    return results


def table(results: dict[str, dict], hidden: float) -> str:
    """The per-page counts as text, pages with any box or table first, then a total."""
    keys = ["code_cut", "code", "outputs_cut", "outputs", "tables_wide", "tables"]
    head = (f"{'page':<34} code>{hidden:.0%} /all  out>{hidden:.0%} /all"
            "  tables wide/all")
    lines = [head]
    total = dict.fromkeys(keys, 0)
    for page, r in results.items():
        for k in keys:
            total[k] += r[k]
        if r["code"] + r["outputs"] + r["tables"]:
            lines.append(f"{page:<34} {r['code_cut']:>8} {r['code']:>4} {r['outputs_cut']:>8}"
                         f" {r['outputs']:>4} {r['tables_wide']:>8} {r['tables']:>3}")
    lines.append(f"{'total':<34} {total['code_cut']:>8} {total['code']:>4}"
                 f" {total['outputs_cut']:>8} {total['outputs']:>4}"
                 f" {total['tables_wide']:>8} {total['tables']:>3}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    parser.add_argument("--hidden", type=float, default=0.15,
                        help="count a box that hides more than this share of its width")
    parser.add_argument("--json", type=Path, help="also write the per-page counts here")
    args = parser.parse_args(argv)
    if not 0 <= args.hidden < 1:
        parser.error(f"--hidden must be in [0, 1), got {args.hidden}")
    if not (args.html / "index.html").exists():
        parser.error(f"--html {args.html} has no index.html: run `make book` first")
    results = audit(args.html, args.hidden)
    print(table(results, args.hidden))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
