"""The notebook viewer at 1k and 10k ops: time to open its page and to expand everything,
in headless Chromium (Debian's chromium through Playwright) at a 1000x800 viewport.

The program is bench/build_scaling's fc/tanh chain with its backward pass, sized so that
it holds about N ops in all. Per size: the view model and the HTML (Python), opening the
saved page until its first nodes are drawn, and `expand all` (layout and drawing of every
group, then two animation frames so the browser has painted) timed in the page.
"""
import os
import tempfile
import time

from bench import build_scaling

EXPAND_ALL = """async () => {
  const v = Object.values(window.progdescViewers)[0];
  const frame = () => new Promise(r => requestAnimationFrame(() => r()));
  const t0 = performance.now();
  document.querySelector('.pdv-expand-all').click();
  await frame(); await frame();
  return {ms: performance.now() - t0, visible: v.visibleIds().length};
}"""


def _chromium():
    from shutil import which
    for name in (os.environ.get("PROGDESC_CHROMIUM"), "chromium", "chromium-browser"):
        if name and which(name):
            return which(name)
    return None


def measure(page, n_ops, folder):
    """One size: {"ops", "model_s", "html_s", "open_s", "expand_all_s", "visible"}."""
    import progdesc as pd
    from progdesc.display.viewer import Viewer
    main, _, loss = build_scaling.build_chain(max(4, n_ops // 3))   # a third are forward ops
    pd.append_backward(loss)
    t0 = time.perf_counter()
    viewer = Viewer(main)
    t1 = time.perf_counter()
    html = viewer.html()
    t2 = time.perf_counter()
    path = os.path.join(folder, f"viewer_{n_ops}.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)
    t3 = time.perf_counter()
    page.goto("file://" + path)
    page.wait_for_selector(".pdv-node")
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
    t4 = time.perf_counter()
    expanded = page.evaluate(EXPAND_ALL)
    return {"ops": len(main.global_block().ops), "model_s": t1 - t0, "html_s": t2 - t1,
            "open_s": t4 - t3, "expand_all_s": expanded["ms"] / 1e3,
            "visible": expanded["visible"], "html_bytes": len(html.encode())}


def run(sizes=(1000, 10000), log=print):
    """Rows per size, or {"skipped": why} without Playwright or Chromium."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        log("  skipped: playwright is not installed")
        return {"skipped": "playwright is not installed"}
    path = _chromium()
    if path is None:
        log("  skipped: no chromium found")
        return {"skipped": "no chromium found"}
    rows = []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as folder:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        for n in sizes:
            page = browser.new_page(viewport={"width": 1000, "height": 800})
            r = measure(page, n, folder)
            page.close()
            rows.append(r)
            log(f"  viewer, {r['ops']} ops: view model {r['model_s']:.2f} s, html "
                f"{r['html_s']:.2f} s ({r['html_bytes'] / 1e6:.1f} MB), open {r['open_s']:.2f} s, "
                f"expand all {r['expand_all_s']:.2f} s ({r['visible']} nodes laid out)")
        browser.close()
    return {"rows": rows, "chromium": path}
