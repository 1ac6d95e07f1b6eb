"""The rendered site in a real browser: every page of ``_build/html`` in headless Chromium.

``make test`` builds the book first; these tests fail (they do not skip) when the build is
missing. Each page is opened once over a local HTTP server and checked for console errors,
broken images, untypeset math, dead internal links and anchors, requests that leave
127.0.0.1, and (on notebook pages) the Colab launch link. Screenshots of the landing page
and one chapter go to ``_build/screenshots/`` for a human look.
"""

from __future__ import annotations

import functools
import http.server
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from toc_notebooks import toc_files  # noqa: E402

pytestmark = pytest.mark.slow

HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
# Folders of the build that hold assets and copies of sources, not pages.
NOT_PAGES = {"_static", "_sources", "_images", "_sphinx_design_static"}
# TeX left in prose means MathJax did not run (or the markup never reached it).
RAW_TEX = re.compile(r"\$\$|\\\(|\\\[|\\(frac|sum|partial|begin|mathbf|mathrm|left|right)\b")
# jupyter-book writes a root index.html that only redirects to the landing page.
REDIRECT = re.compile(r'<meta[^>]+http-equiv="refresh"[^>]+url=([^"]+)"', re.I)


def colab_link(entry: str) -> str:
    """The Colab URL the launch button of notebook ``entry`` must carry, from _config.yml."""
    repo = CONFIG["repository"]
    org_repo = urlsplit(repo["url"]).path.strip("/")
    prefix = repo.get("path_to_book", "").strip("/")
    path = f"{prefix}/{entry}.ipynb" if prefix else f"{entry}.ipynb"
    colab = CONFIG["launch_buttons"]["colab_url"].rstrip("/")
    return f"{colab}/github/{org_repo}/blob/{repo['branch']}/{path}"


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
    """What one page showed in the browser."""

    page: str
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
  const math = [...document.querySelectorAll('.math')];
  return {
    images: imgs.map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0})),
    mathNodes: math.length,
    mathTypeset: math.filter(m => m.querySelector('mjx-container')).length,
    mjx: document.querySelectorAll('mjx-container').length,
    prose: prose.join(' '),
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    colab: [...document.querySelectorAll('a[href*="colab.research.google.com"]')].map(a => a.href),
    functions: document.querySelectorAll('dl.py.function, dl.py.method').length,
    signatures: document.querySelectorAll('dt.sig').length,
    ids: [...document.querySelectorAll('[id], a[name]')].map(e => e.id || e.name),
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
        def log_message(self, *args: object) -> None:
            pass

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
        pytest.fail(f"{CHROMIUM} is missing: run `make browser-deps`", pytrace=False)
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


def visit(context: object, base: str, page: str, shot: Path | None = None) -> Visit:
    """Open one page, wait for MathJax, and collect what the checks need."""
    result = Visit(page)

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
    try:
        tab.goto(base + page, wait_until="load")
        has_math = tab.evaluate("() => document.querySelector('.math') !== null")
        if has_math:
            try:
                tab.wait_for_function(
                    "() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                    timeout=15_000,
                )
                tab.evaluate("() => MathJax.startup.promise")
            except PlaywrightTimeout:
                result.errors.append("MathJax never started on a page with math")
        result.data = tab.evaluate(COLLECT_JS)
        if shot is not None:
            shot.parent.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(shot), full_page=False)
    finally:
        tab.close()
    return result


@pytest.fixture(scope="module")
def visits(site: str, browser: object) -> dict[str, Visit]:
    """Every page visited once; screenshots of the landing page and the first chapter."""
    entries = toc_files()
    chapter = f"{entries[1]}.html" if len(entries) > 1 else None
    shots = {pages()[0]: SHOTS / "landing.png"}
    if chapter:
        shots[chapter] = SHOTS / "chapter.png"
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    # Nothing may leave the machine: requests to any other host are recorded, then aborted
    # (so a stray CDN URL fails fast here instead of hanging on a network that is not there).
    context.route(re.compile(r"^(https?|wss?)://(?!127\.0\.0\.1[:/])"), lambda r: r.abort())
    try:
        return {p: visit(context, site, p, shots.get(p)) for p in pages()}
    finally:
        context.close()


def report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n  " + "\n  ".join(problems[:40])


def test_root_redirects_to_the_landing_page() -> None:
    index = HTML / "index.html"
    assert index.is_file(), f"{index} is missing: run `make book`"
    match = REDIRECT.search(index.read_text())
    assert match, f"{index} is not a redirect to the landing page"
    target = unquote(urlsplit(match.group(1)).path)
    assert target == pages()[0], f"index.html redirects to {target}, not the toc root"


def test_every_toc_page_was_built_and_visited(visits: dict[str, Visit]) -> None:
    missing = [e for e in toc_files() if f"{e}.html" not in visits]
    assert not missing, f"toc entries without a visited page: {missing}"


def test_no_console_errors(visits: dict[str, Visit]) -> None:
    problems = [f"{v.page}: {e}" for v in visits.values() for e in v.errors]
    assert not problems, report(problems)


def test_no_request_leaves_localhost(visits: dict[str, Visit]) -> None:
    problems = [
        f"{v.page}: {url}"
        for v in visits.values()
        for url in v.requests
        if urlsplit(url).scheme in ("http", "https", "ws", "wss")
        and urlsplit(url).hostname != "127.0.0.1"
    ]
    assert not problems, report(problems)


def test_every_image_loads(visits: dict[str, Visit]) -> None:
    problems = [
        f"{v.page}: {img['src']}"
        for v in visits.values()
        for img in v.data["images"]
        if not img["ok"]
    ]
    assert not problems, report(problems)


def test_math_is_typeset(visits: dict[str, Visit]) -> None:
    problems = []
    for v in visits.values():
        d = v.data
        if d["mathNodes"] and d["mathTypeset"] < d["mathNodes"]:
            problems.append(f"{v.page}: {d['mathTypeset']} of {d['mathNodes']} math nodes typeset")
        raw = RAW_TEX.search(d["prose"])
        if raw:
            start = max(raw.start() - 40, 0)
            problems.append(
                f"{v.page}: raw TeX in the text: ...{d['prose'][start : raw.end() + 40]}"
            )
    assert not problems, report(problems)


def test_some_page_has_math(visits: dict[str, Visit]) -> None:
    """Guards the check above: a book about gradients without typeset math is broken."""
    assert any(v.data["mjx"] > 0 for v in visits.values()), "no page has MathJax output"


def test_internal_links_resolve(site: str, visits: dict[str, Visit]) -> None:
    problems = []
    for v in visits.values():
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
                ids = set(visits[page].data["ids"]) if page in visits else anchors_of(target)
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{v.page}: link to missing anchor {rel}#{parts.fragment}")
    assert not problems, report(problems)


def test_notebook_pages_have_the_colab_link(visits: dict[str, Visit]) -> None:
    notebooks = [e for e in toc_files() if (ROOT / f"{e}.ipynb").exists()]
    assert notebooks, "no notebook in _toc.yml"
    problems = []
    for entry in notebooks:
        want = colab_link(entry)
        found = visits[f"{entry}.html"].data["colab"]
        if want not in found:
            problems.append(f"{entry}: want {want}, found {found or 'no Colab link'}")
    assert not problems, report(problems)


def test_api_page_renders_signatures(visits: dict[str, Visit]) -> None:
    api = visits.get("book/api.html")
    assert api is not None, "book/api.html was not built (is book/api in _toc.yml?)"
    assert api.data["functions"] > 0, "no rendered function entries (dl.py.function)"
    assert api.data["signatures"] > 0, "no rendered signatures (dt.sig)"
    assert "automodule" not in api.data["prose"], "raw autodoc directives on the API page"


def test_api_page_documents_every_module(visits: dict[str, Visit]) -> None:
    modules = sorted(
        p.stem for p in (ROOT / "convlab").glob("*.py") if p.stem not in {"__init__", "__main__"}
    )
    api = visits.get("book/api.html")
    assert api is not None, "book/api.html was not built (is book/api in _toc.yml?)"
    ids = set(api.data["ids"])
    missing = [m for m in modules if f"module-convlab.{m}" not in ids]
    assert not missing, f"convlab modules without a section in book/api.md: {missing}"


def test_screenshots_were_saved(visits: dict[str, Visit]) -> None:
    for name in ("landing.png", "chapter.png"):
        shot = SHOTS / name
        assert shot.is_file() and shot.stat().st_size > 10_000, f"missing or blank {shot}"
