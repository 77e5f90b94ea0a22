"""The page at ``/``: a translation box, the n best and the cross-attention
heat map, for people rather than programs.

One HTML file with its script and styles inline (``page/index.html``),
shipped in the wheel: no build step, and nothing fetched from the internet
when it runs, so it works on a machine without a network and shows nothing
to a third party. It speaks the server's own API (``GET /health``, ``POST
/explain``), as any client would.
"""

import functools
import importlib.resources


@functools.cache
def page_html():
    """The page's HTML (read once)."""
    return (
        importlib.resources.files("keras_transformer.serving")
        .joinpath("page", "index.html")
        .read_text(encoding="utf-8")
    )
