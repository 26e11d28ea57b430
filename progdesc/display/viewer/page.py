"""The viewer's page: a view model (model.py's JSON) with the script and style that draw it.

`viewer_html` inlines viewer.js, viewer.css and the model, so the page needs no network
and no server: a whole HTML document (standalone, for `Viewer.save`) or a fragment for a
notebook output, whose element id is unique per call so several viewers share a page.
"""
import hashlib
import html
import json
import uuid
from functools import lru_cache
from importlib import resources

FALLBACK = ("The program viewer needs JavaScript: trust the notebook (or open the saved "
            "HTML file in a browser) to see it.")


@lru_cache(maxsize=None)
def _asset(name):
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    if name == "viewer.js":   # its version: a notebook page keeps one copy per version
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        text = text.replace('"__PDV_VERSION__"', json.dumps(digest))
    return text


def _script_json(model):
    """The model as JSON safe inside a <script> element (no `</script>`, no `<!--`)."""
    text = json.dumps(model, separators=(",", ":"), ensure_ascii=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _check(model):
    if not isinstance(model, dict):
        raise TypeError(f"viewer_html expects the view model dict, got {type(model).__name__}")
    missing = [k for k in ("groups", "nodes", "edges", "vars") if k not in model]
    if missing:
        raise ValueError(f"view model lacks {', '.join(repr(k) for k in missing)} "
                         f"(has {sorted(model)})")


def viewer_html(model, *, standalone):
    """The viewer of `model` (a `view_model(...)` dict) as HTML: a whole `<!doctype html>`
    page when `standalone`, else a `<div class="pdv">` fragment with its style and script,
    for a notebook output. Everything is inline; nothing is fetched."""
    _check(model)
    uid = f"pdv-{uuid.uuid4().hex[:12]}"
    script = (f"{_asset('viewer.js')}\n"
              f"window.progdescViewer.init(document.getElementById({json.dumps(uid)}));")
    body = (f'<div class="pdv" id="{uid}"'
            + (' style="--pdv-height: calc(100vh - 62px)"' if standalone else "") + ">"
            f'<div class="pdv-fallback">{html.escape(FALLBACK)}</div>'
            f'<script type="application/json" class="pdv-data">{_script_json(model)}</script>'
            "</div>\n"
            f"<style>{_asset('viewer.css')}</style>\n"
            f"<script>\n{script}\n</script>")
    if not standalone:
        return body
    title = html.escape(str(model.get("title") or "program"))
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{title}</title>"
            "<style>html, body { margin: 0; padding: 0; } body { padding: 8px; }</style>"
            f"</head><body>\n{body}\n</body></html>\n")
