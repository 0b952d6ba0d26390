"""The HTML shells of the dashboard's pages: navigation, an empty frame per card, and the
scripts that fill them from the JSON API. No inline script or style (the pages are served
with a strict Content-Security-Policy)."""

from __future__ import annotations

from html import escape

from starlette.responses import HTMLResponse

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    # Not no-referrer: under that policy a browser sends `Origin: null` with a form POST,
    # and the login and logout forms are checked by their Origin (web/login.py).
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
}

# page name -> (title, nav label, the page's script)
PAGES = {
    "overview": ("Overview", "Overview", "overview.js"),
    "distribution": ("Cached-length distribution", "Distribution", "distribution.js"),
    "doctor": ("Doctor", "Doctor", "doctor.js"),
    "upstream": ("Upstream health", "Upstream", "upstream.js"),
    "requests": ("Request log", "Requests", "requests.js"),
    "usage": ("Usage and cost", "Usage", "usage.js"),
    "keys": ("Keys and budgets", "Keys", "keys.js"),
    "me": ("My usage", "My usage", "me.js"),
    "request": ("Request", None, "request.js"),
}
NAV = ("overview", "distribution", "doctor", "upstream", "requests", "usage", "keys")


def _nav(prefix: str, active: str) -> str:
    links = []
    for name in NAV if active != "me" else ("me",):  # a key holder sees only their own
        label = PAGES[name][1]
        href = prefix if name == "overview" else f"{prefix}/{name}"
        current = name == active or (active == "request" and name == "requests")
        attrs = ' class="active" aria-current="page"' if current else ""
        links.append(f'<a href="{href}" data-nav="{name}"{attrs}>{label}</a>')
    return "".join(links)


def html_response(
    body: str, status: int = 200, headers: dict[str, str] | None = None
) -> HTMLResponse:
    return HTMLResponse(
        body,
        status_code=status,
        headers={"cache-control": "no-store", **SECURITY_HEADERS, **(headers or {})},
    )


def render(prefix: str, name: str, *, request_id: str = "", logout: bool = False) -> str:
    """A page's shell; ``logout`` adds the button that ends the browser's session."""
    title, _, script = PAGES[name]
    p = escape(prefix)
    out = (
        f'<form method="post" action="{p}/logout" class="logout">'
        '<button type="submit">Log out</button></form>'
        if logout
        else ""
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · prefixgate</title>
<link rel="icon" href="{p}/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="{p}/static/dashboard.css">
</head>
<body data-page="{name}" data-base="{p}" data-request-id="{escape(request_id)}">
<header class="topbar">
  <a class="brand" href="{p}"><span class="brand-mark" aria-hidden="true"></span>prefixgate</a>
  <nav class="tabs">{_nav(p, name)}</nav>
  <span class="topbar-note" id="store-note"></span>
  {out}
</header>
<div class="filters" id="filters" aria-label="filters"></div>
<main id="main">
  <h1 class="page-title">{escape(title)}</h1>
  <div id="content" class="content"><p class="loading">Loading…</p></div>
</main>
<script src="{p}/static/app.js"></script>
<script src="{p}/static/charts.js"></script>
<script src="{p}/static/{script}"></script>
</body>
</html>
"""


def login(prefix: str, message: str, *, next_url: str = "", form: bool = True) -> str:
    """The login page, also shown in place of a page asked for without a session: a form
    that POSTs the admin key once to ``/login``, then returns to ``next_url``. Nothing the
    visitor typed is ever written back into it."""
    p = escape(prefix)
    hint = (
        "Enter the gateway's admin key, or your own API key to see your usage. It is sent "
        "once, in this form's body; the browser keeps only a session cookie."
        if form
        else "Configure an admin key (<code>admin_key_env</code> or "
        "<code>admin_key_sha256</code>) to use the dashboard."
    )
    body = (
        f'<form method="post" action="{p}/login" class="login-form">'
        f'<input type="hidden" name="next" value="{escape(next_url)}">'
        '<input type="password" name="key" placeholder="admin key" autocomplete="off" '
        'aria-label="admin key" required autofocus>'
        '<button type="submit">Log in</button></form>'
        if form
        else ""
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Log in · prefixgate</title>
<link rel="icon" href="{p}/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="{p}/static/dashboard.css">
</head>
<body class="login">
<main class="login-card">
  <div class="brand"><span class="brand-mark" aria-hidden="true"></span>prefixgate</div>
  <h1>{escape(message)}</h1>
  <p>{hint}</p>
  {body}
</main>
</body>
</html>
"""
