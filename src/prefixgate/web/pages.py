"""The HTML shells of the dashboard's pages: navigation, an empty frame per card, and the
scripts that fill them from the JSON API. No inline script or style (the pages are served
with a strict Content-Security-Policy)."""

from __future__ import annotations

from html import escape

# page name -> (title, nav label, the page's script)
PAGES = {
    "overview": ("Overview", "Overview", "overview.js"),
    "distribution": ("Cached-length distribution", "Distribution", "distribution.js"),
    "doctor": ("Doctor", "Doctor", "doctor.js"),
    "upstream": ("Upstream health", "Upstream", "upstream.js"),
    "requests": ("Request log", "Requests", "requests.js"),
    "request": ("Request", None, "request.js"),
}
NAV = ("overview", "distribution", "doctor", "upstream", "requests")


def _nav(prefix: str, active: str) -> str:
    links = []
    for name in NAV:
        label = PAGES[name][1]
        href = prefix if name == "overview" else f"{prefix}/{name}"
        current = name == active or (active == "request" and name == "requests")
        attrs = ' class="active" aria-current="page"' if current else ""
        links.append(f'<a href="{href}" data-nav="{name}"{attrs}>{label}</a>')
    return "".join(links)


def render(prefix: str, name: str, *, request_id: str = "") -> str:
    title, _, script = PAGES[name]
    p = escape(prefix)
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


def login(prefix: str, status: int, message: str, keep: list[tuple[str, str]] = ()) -> str:
    """The page shown without a valid admin key; its form sends the key once with the
    query parameters in ``keep``."""
    p = escape(prefix)
    hidden = "".join(
        f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">'
        for k, v in keep
        if k != "key"
    )
    hint = (
        "Enter the gateway's admin key. It is kept in an HttpOnly cookie for this browser session."
        if status == 401
        else "Configure an admin key (<code>admin_key_env</code> or "
        "<code>admin_key_sha256</code>) to use the dashboard."
    )
    form = (
        f'<form method="get" action="" class="login-form">{hidden}'
        f'<input type="password" name="key" placeholder="admin key" autocomplete="off" required>'
        f'<button type="submit">Open dashboard</button></form>'
        if status == 401
        else ""
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Admin key required · prefixgate</title>
<link rel="icon" href="{p}/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="{p}/static/dashboard.css">
</head>
<body class="login">
<main class="login-card">
  <div class="brand"><span class="brand-mark" aria-hidden="true"></span>prefixgate</div>
  <h1>{escape(message)}</h1>
  <p>{hint}</p>
  {form}
</main>
</body>
</html>
"""
