"""A keyless gateway against web pages: what a browser may not make it do.

Without keys anyone who can reach the port may use the gateway, which is why it listens
on loopback. A web page in the admin's browser can reach loopback too, in two ways, and
both are refused here, before any route runs:

- **Cross-origin requests.** A page on another site may send a CORS-simple request (a
  ``text/plain`` POST) without a preflight, and it would run inference. Browsers name the
  page's origin in ``Origin``; a request whose ``Origin`` is not the gateway's own (the
  scheme-less ``host:port`` of its ``Host``), ``Origin: null`` included, gets 403.
- **DNS rebinding.** A page on ``evil.example`` re-points its name at 127.0.0.1 and then
  reads the gateway as its own origin (``Host: evil.example:8787``). Only loopback names
  (``localhost``, ``*.localhost``), IP literals (a rebinding needs a name) and the name the
  gateway listens on are accepted as ``Host``; any other gets 403.

Clients that are not browsers send no ``Origin`` and a ``Host`` of the address they were
given, so an SDK, curl (with or without a content type) and the agents pass unchanged. A
gateway with keys needs neither rule (a page cannot know a key) and does not run them.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from prefixgate.errors import PermissionDenied

_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def host_name(host: str) -> str:
    """The name of a ``Host`` header value, without its port and brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() else host


def allowed_host(name: str, listen: str) -> bool:
    if name in _LOOPBACK_NAMES or name.endswith(".localhost") or name == listen.lower():
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def foreign_origin(origin: str, host: str) -> bool:
    """Whether ``Origin`` names another site than this ``Host``."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not host:
        return True  # ``Origin: null`` (a sandboxed frame, a file) included
    netloc = parts.netloc.lower()
    default = ":443" if parts.scheme == "https" else ":80"
    host = host.lower()
    return host not in (netloc, netloc + default)


class BrowserGuard:
    """ASGI middleware: the two rules above, answered 403 in the route's error shape."""

    def __init__(self, app, listen: str, shape_of) -> None:
        self.app = app
        self.listen = listen
        self.shape_of = shape_of

    def __getattr__(self, name: str):
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            err = self.refusal(scope["headers"])
            if err is not None:
                from prefixgate.pipeline import error_response

                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
                shape = self.shape_of(headers, scope["path"])
                await error_response(err, shape)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, raw_headers) -> PermissionDenied | None:
        named = dict(raw_headers)  # the last of a name, as a walk keeping each would
        raw_host, raw_origin = named.get(b"host"), named.get(b"origin")
        host = None if raw_host is None else raw_host.decode("latin-1")
        origin = None if raw_origin is None else raw_origin.decode("latin-1")
        if host is not None and not allowed_host(host_name(host), self.listen):
            return _refused(
                "this keyless gateway answers only to its loopback names and listen address "
                "(a foreign Host header is how a DNS-rebinding page reaches it)",
                "host_not_allowed",
            )
        if origin is not None and foreign_origin(origin, host or ""):
            return _refused(
                "a request from another site is refused by this keyless gateway",
                "origin_not_allowed",
            )
        return None


def _refused(message: str, code: str) -> PermissionDenied:
    err = PermissionDenied(message)
    err.code = code  # OpenAI's error.code (not the kind's default, model_not_allowed)
    return err
