"""Browser fixtures (a pytest plugin loaded by conftest.py): headless Chromium through Playwright.

`browser` is one Chromium for the session (Debian's `chromium`: Playwright's own download is
not used); `page` is a fresh 1000x800 page whose JavaScript errors are collected in
`page.errors`. Where Playwright or Chromium is missing, or Chromium does not start, the
tests that use them are skipped with the reason; they never fail for it.
"""
import os
import shutil

import pytest

VIEWPORT = {"width": 1000, "height": 800}
CANDIDATES = ("chromium", "chromium-browser", "/usr/bin/chromium", "/usr/lib/chromium/chromium")


LEGIBLE_PX = 9   # the smallest rendered text size the viewer may open at
# What a person sees of a viewer on the page: the page's scroll width, the canvas's edges,
# the smallest rendered font, and the nodes in view horizontally inside or outside the canvas.
SEEN = """() => {
  const svg = document.querySelector('.pdv-canvas').getBoundingClientRect();
  let font = Infinity, inside = 0, outside = [];
  document.querySelectorAll('.pdv-canvas text').forEach(t => {
    font = Math.min(font, parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a); });
  document.querySelectorAll('.pdv-node').forEach(n => {
    const r = n.getBoundingClientRect();
    if (r.bottom < svg.top || r.top > svg.bottom) return;          // below the fold: panned to
    if (r.left >= svg.left && r.right <= svg.right) inside++; else outside.push(n.dataset.id);
  });
  return {scrollWidth: document.documentElement.scrollWidth, svgLeft: svg.left, svgRight: svg.right,
          font: font, inside: inside, outside: outside};
}"""


def find_chromium():
    """The path of a Chromium executable (PROGDESC_CHROMIUM, then `chromium` on PATH), or None."""
    for name in (os.environ.get("PROGDESC_CHROMIUM"),) + CANDIDATES:
        path = name and shutil.which(name)
        if path:
            return path
    return None


def new_page(browser):
    """A 1000x800 page of `browser` whose page errors and console errors gather in `.errors`."""
    page = browser.new_page(viewport=VIEWPORT)
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(f"pageerror: {exc}"))
    page.on("console", lambda msg: msg.type == "error" and page.errors.append(f"console: {msg.text}"))
    return page


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium driven by Playwright, shared by the session (skips when unavailable)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    path = find_chromium()
    if path is None:
        pytest.skip("no chromium found (install Debian's chromium: apt-get install chromium, "
                    "or set PROGDESC_CHROMIUM)")
    manager = sync_playwright().start()
    try:
        chromium = manager.chromium.launch(executable_path=path, args=["--no-sandbox"])
    except Exception as exc:  # any launch failure is an environment problem: skip, with it
        manager.stop()
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        pytest.skip(f"chromium at {path} failed to launch: {first}")
    yield chromium
    chromium.close()
    manager.stop()


@pytest.fixture
def page(browser):
    """A fresh 1000x800 page; its JavaScript errors are in `page.errors`."""
    page = new_page(browser)
    yield page
    page.close()
