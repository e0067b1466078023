"""The page that `attn serve` ships at `/` works offline: it names no address but the server's own routes.

(tests/browser/test_page.py drives it in a browser and intercepts every request; this check runs
without a browser.)
"""

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "src/attn/app/serve/static/index.html"


def test_the_page_loads_nothing_from_outside_and_asks_only_the_api() -> None:
    html = PAGE.read_text(encoding="utf-8")
    assert re.findall(r"(?:https?:)?//[a-z0-9-]+(?:\.[a-z0-9-]+)+", html, flags=re.I) == []
    assert not re.search(r"<script[^>]+src=|<link[^>]+stylesheet|@import|url\(", html)
    asked = re.findall(r"""(?:fetch|post|postJson)\(\s*["'`]([^"'`]+)""", html)
    assert asked and all(path.startswith("/v1/") for path in asked), asked
