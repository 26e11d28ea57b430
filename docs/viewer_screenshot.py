"""`python docs/viewer_screenshot.py docs/viewer.png` (`make screenshot`): the README's picture
of the program viewer.

Builds a transformer encoder layer with its backward pass and Adam, opens its viewer page
in headless Chromium (Playwright driving Debian's `chromium`; `pip install playwright`),
opens the layer and its attention, selects the attention op so that its panel shows, and
saves a PNG of the page.
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZE = {"width": 1000, "height": 720}


def build():
    """A 1-layer transformer encoder over [None, 16, 64] with a loss, backward and Adam."""
    import progdesc as pd
    from progdesc import layers, ops
    from progdesc.optimizer import Adam
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 16, 64])
        h = layers.transformer_encoder_layer(x, 4, 128, dropout_rate=0.0)
        loss = ops.mean(ops.square(h))
        Adam(1e-3).minimize(loss)
    return main


def screenshot(out, chromium=None):
    """Write the picture to `out` (PNG); returns `out`."""
    from playwright.sync_api import sync_playwright
    from progdesc.display.viewer import Viewer
    chromium = chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("no chromium on PATH (apt-get install chromium, or pass --chromium)")
    program = build()
    attention = next(i for i, op in enumerate(program.global_block().ops)
                     if op.type == "scaled_dot_product_attention")
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as p:
        page_path = Viewer(program, title="transformer encoder layer, backward and Adam").save(
            os.path.join(folder, "viewer.html"))
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport=SIZE)
        page.goto("file://" + os.path.abspath(page_path))
        page.click('.pdv-node[data-id="g:forward/transformer_encoder_0"]')
        page.click('.pdv-node[data-id="g:forward/transformer_encoder_0.attn"]')
        page.click(f'.pdv-node[data-id="op:0:{attention}"]')
        page.screenshot(path=out)
        browser.close()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python docs/viewer_screenshot.py",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the PNG to write (e.g. docs/viewer.png)")
    ap.add_argument("--chromium", help="the Chromium executable (default: chromium on PATH)")
    args = ap.parse_args(argv)
    print(screenshot(args.out, args.chromium))
    return 0


if __name__ == "__main__":
    sys.exit(main())
