"""Who may see the dashboard: an admin session (browsers) or the admin key in a header
(scripts), never the key in a URL.

- ``GET /dashboard/login`` shows a form; ``POST /dashboard/login`` takes the admin key in
  the form's body, opens a session (web/sessions.py) and sets its token in an HttpOnly,
  SameSite=Strict cookie (Secure over TLS, or always with ``dashboard.secure_cookie``).
  Attempts are counted per client address in the store: past
  ``dashboard.login_attempts_per_minute``, 429 without looking at the key.
- ``POST /dashboard/logout`` ends the session and clears the cookie.
- Both POSTs must come from the dashboard's own origin (``Origin``, else ``Referer``,
  against ``Host``); with the cookie's SameSite=Strict, another site can neither log a
  browser in nor out. A client that sends neither header is no browser, so no CSRF target.
- ``x-api-key`` / ``Authorization: Bearer`` with the admin key still opens the JSON API.
- A ``?key=`` query holding a credential is refused (400): the key would sit in history
  and logs. A key *name* there is the dashboard's filter (``?key=alice``) and passes.
- Without an admin key configured there are no sessions: ``check_admin`` decides alone
  (open on an open loopback gateway, 403 otherwise).

Neither the key nor a token reaches a log line, an error body or a page.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from prefixgate.admin_attempts import client_address
from prefixgate.auth import Principal, presented_key
from prefixgate.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidRequest,
    PermissionDenied,
    RateLimited,
    RequestTooLarge,
)
from prefixgate.store import StoreError
from prefixgate.web import pages
from prefixgate.web.sessions import ATTEMPT_WINDOW, Sessions, holder_mark, holder_name

log = logging.getLogger("prefixgate")

COOKIE = "prefixgate_session"
MAX_FORM_BYTES = 8 * 1024
KEY_IN_URL = (
    "the admin key is never accepted in a URL (it would stay in the browser's history and "
    "in access logs): log in with the form, or send it in an Authorization: Bearer header"
)


class StoreUnavailable(GatewayError):
    status = 503
    kind = "api_error"


class AdminGate:
    def __init__(self, gateway: Any, dsn: str, prefix: str) -> None:
        self.gateway = gateway  # its authenticator is the current config's (reload)
        self.prefix = prefix
        config = gateway.config
        self.secure = config.dashboard.secure_cookie
        admin = config.admin_digest()
        self.sessions = Sessions(dsn, admin, config.dashboard) if admin else None

    # -- the check in front of every page and API call ----------------------------------
    async def denied(self, request: Request) -> GatewayError | None:
        """Why ``request`` may not see the dashboard, or None when it may."""
        if self.key_in_url(request.query_params.getlist("key")):
            return InvalidRequest(KEY_IN_URL)
        headers = request.headers
        token = request.cookies.get(COOKIE)
        try:
            if "x-api-key" in headers or "authorization" in headers or self.sessions is None:
                await self.gateway.auth.check_admin(headers, request.scope)
                return None
            if token:
                owner = await self._owner(token)
                if owner == self.sessions.admin:
                    return None
                if owner is not None and holder_name(owner) is not None:
                    return PermissionDenied(
                        f"this is the admin's; your own view is at {self.prefix}/me"
                    )
            await self.gateway.auth.check_admin({})
        except GatewayError as err:
            if token and isinstance(err, AuthenticationFailed):
                return AuthenticationFailed("your session has ended: log in again")
            return err
        return None

    def key_in_url(self, values: list[str]) -> bool:
        """Whether a ``?key=`` value is a credential (the admin key, an API key, or what has
        the shape of a key the gateway issues) rather than the key name the filter bar
        sends (``?key=alice``)."""
        return any(self.gateway.auth.is_credential(v) for v in values)

    def has_session(self, request: Request) -> bool:
        return self.sessions is not None and COOKIE in request.cookies

    async def _owner(self, token: str) -> str | None:
        try:
            return await asyncio.to_thread(self.sessions.owner, token)
        except StoreError as exc:
            raise StoreUnavailable(f"the store keeping sessions is unavailable: {exc}") from exc

    async def holder(self, request: Request) -> Principal | None:
        """The key holder a request speaks for: the key in its headers (scripts), else
        the key holder's session in its cookie, checked against the key's current digest
        (a rotated or revoked key ends its sessions); None when neither."""
        auth = self.gateway.auth
        key = presented_key(request.headers)
        if key:
            return auth.principal_of(key)
        token = request.cookies.get(COOKIE)
        if not token or self.sessions is None:
            return None
        owner = await self._owner(token)
        name = holder_name(owner) if owner else None
        found = auth.named(name) if name else None
        if found is None or owner != holder_mark(name, found[0]):
            return None
        return found[1]

    def refusal(self, request: Request, err: GatewayError) -> Response:
        """The login page in place of a page refused with ``err``, returning here after."""
        rest = [
            (k, v)
            for k, v in request.query_params.multi_items()
            if not (k == "key" and self.gateway.auth.is_credential(v))
        ]
        return self._page(err, request.url.path + ("?" + urlencode(rest) if rest else ""))

    def _page(self, err: GatewayError, next_url: str) -> Response:
        form = self.sessions is not None  # no form without an admin key to log in with
        headers = {"retry-after": f"{ATTEMPT_WINDOW:.0f}"} if err.status == 429 else None
        body = pages.login(self.prefix, str(err), next_url=next_url, form=form)
        return pages.html_response(body, err.status, headers)

    # -- the login and logout routes ------------------------------------------------------
    async def login_page(self, request: Request) -> Response:
        next_url = self._next(request.query_params.get("next"))
        if "key" in request.query_params:
            return self._page(InvalidRequest(KEY_IN_URL), next_url)
        err = await self.denied(request)
        if err is None:
            return RedirectResponse(next_url, 303, headers=pages.SECURITY_HEADERS)
        if self.sessions is None:
            return self._page(err, next_url)
        return pages.html_response(pages.login(self.prefix, "Log in", next_url=next_url))

    async def login(self, request: Request) -> Response:
        if self.sessions is None:  # open, or no admin key to log in with
            return await self.login_page(request)
        if not same_origin(request):
            return self._page(PermissionDenied("a login from another site is refused"), "")
        if "key" in request.query_params:
            return self._page(InvalidRequest(KEY_IN_URL), self.prefix)
        try:
            form = await read_form(request)
        except GatewayError as err:
            return self._page(err, self.prefix)
        next_url = self._next(form.get("next"))
        address = client_address(request.scope, self.gateway.auth.trusted_proxies)
        try:
            if not await asyncio.to_thread(self.sessions.attempt, address):
                return self._page(
                    RateLimited("too many login attempts from this address: wait a minute"),
                    next_url,
                )
            key = form.get("key", "")
            # A key holder's own view: their API key, never counted as a wrong admin key.
            holder = self.gateway.auth.principal_of(key) if key else None
            if holder is None:
                await self.gateway.auth.check_admin({"x-api-key": key}, request.scope)
            else:
                digest = hashlib.sha256(key.encode()).hexdigest()
                next_url = f"{self.prefix}/me"
            mark = holder_mark(holder.name, digest) if holder is not None else None
            token = await asyncio.to_thread(self.sessions.open, mark)
        except AuthenticationFailed:
            log.warning("dashboard: a login from %s with a wrong admin key", address)
            return self._page(
                AuthenticationFailed("wrong admin key (and no API key of this gateway)"), next_url
            )
        except RateLimited as err:
            return self._page(err, next_url)
        except StoreError as exc:
            err = StoreUnavailable(f"the store keeping sessions is unavailable: {exc}")
            return self._page(err, next_url)
        log.info("dashboard: a login from %s", address)
        resp = RedirectResponse(next_url, 303, headers=pages.SECURITY_HEADERS)
        resp.set_cookie(
            COOKIE,
            token,
            path=self.prefix,
            httponly=True,
            samesite="strict",
            secure=self.secure if self.secure is not None else request.url.scheme == "https",
        )
        return resp

    async def logout(self, request: Request) -> Response:
        if not same_origin(request):
            return self._page(PermissionDenied("a logout from another site is refused"), "")
        token = request.cookies.get(COOKIE)
        if token and self.sessions is not None:
            try:
                await asyncio.to_thread(self.sessions.close, token)
            except StoreError as exc:
                err = StoreUnavailable(f"the store keeping sessions is unavailable: {exc}")
                return self._page(err, self.prefix)
        resp = RedirectResponse(f"{self.prefix}/login", 303, headers=pages.SECURITY_HEADERS)
        resp.delete_cookie(COOKIE, path=self.prefix, httponly=True, samesite="strict")
        return resp

    def _next(self, value: str | None) -> str:
        """Where to go after the login: a dashboard page of this gateway, nothing else (no
        open redirect)."""
        p = self.prefix
        if not value or "\\" in value or any(ord(c) < 0x20 for c in value):
            return p
        parts = urlsplit(value)
        if parts.scheme or parts.netloc or not (parts.path == p or parts.path.startswith(p + "/")):
            return p
        if parts.path.rstrip("/") == p + "/login":
            return p
        query = [
            (k, v)
            for k, v in parse_qsl(parts.query)
            if not (k == "key" and self.gateway.auth.is_credential(v))
        ]
        return parts.path + ("?" + urlencode(query) if query else "")


def same_origin(request: Request) -> bool:
    """Whether a POST comes from a page of this host (``Origin``, else ``Referer``)."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if source is None:
        return True  # no browser: nothing to forge
    host = request.headers.get("host", "").lower()
    parts = urlsplit(source)
    if parts.scheme not in ("http", "https") or not host:
        return False  # `Origin: null` included
    netloc = parts.netloc.lower()
    default = ":443" if parts.scheme == "https" else ":80"
    return host in (netloc, netloc + default)


async def read_form(request: Request) -> dict[str, str]:
    """The urlencoded body of a small form, bounded (no multipart parser needed)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise InvalidRequest("send the form as application/x-www-form-urlencoded")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise RequestTooLarge(f"the form is larger than {MAX_FORM_BYTES} bytes")
    try:
        return dict(parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=8))
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("the form is not valid urlencoded UTF-8") from None
