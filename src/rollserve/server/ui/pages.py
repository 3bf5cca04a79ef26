"""The pages the server writes itself: the viewer's sign-in form."""

from __future__ import annotations

import html


def sign_in_page(problem: str | None = None) -> str:
    """A form that takes the API token and keeps it in the viewer's cookie."""
    note = f'<p class="problem" role="alert">{html.escape(problem)}</p>' if problem else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rollserve · sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
body {{ font: 15px system-ui, sans-serif; background: #f5f6f8; color: #1d2330; }}
form {{ max-width: 360px; margin: 12vh auto; background: #fff; padding: 24px 28px;
        border: 1px solid #dde1e8; border-radius: 8px; }}
h1 {{ font-size: 18px; margin: 0 0 14px; }}
input {{ width: 100%; box-sizing: border-box; padding: 8px; margin: 6px 0 14px;
         font: 14px ui-monospace, monospace; border: 1px solid #c5cad3; border-radius: 4px; }}
button {{ padding: 8px 16px; border: 0; border-radius: 4px; background: #2f5fd0; color: #fff;
          font-weight: 600; cursor: pointer; }}
.problem {{ color: #b3261e; }}
</style></head>
<body><form method="post" action="/ui/login" data-testid="sign-in">
<h1>rollserve</h1>{note}
<label for="token">API token (a read-only token is enough)</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus>
<button type="submit">Sign in</button>
</form></body></html>
"""
