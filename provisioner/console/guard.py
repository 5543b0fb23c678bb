"""Who may act in the console, and proof that an action came from the console's own page.

The console is read-only unless the operator sets ``PROVISIONER_CONSOLE_TOKEN``. Then:

* **The token, once.** The operator types it into the login form; the console answers with a
  session cookie (``HttpOnly``: no script reads it; ``SameSite=Strict``: no other site's page
  sends it) that holds a random session id and its signature, an HMAC keyed by the token.
  The token itself is never stored in the browser, and changing it ends every session.
* **A per-session CSRF token** in every action's form: an HMAC of the session id, checked in
  constant time; a page on another site cannot read it.
* **The Origin check**: a POST whose ``Origin`` (or, without one, ``Referer``) is not the
  console's own address is refused before anything else, the login form's included.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

SESSION_COOKIE = "provisioner_console"
#: How long a session lasts (seconds): a working day.
SESSION_SECONDS = 12 * 3600


@dataclass(frozen=True)
class Refusal:
    """Why an action was refused, and its HTTP status."""

    status: int
    message: str


class Guard:
    """Signs and checks the session cookie and the CSRF tokens with a key made from the
    operator's token."""

    def __init__(self, token: str | None) -> None:
        self._token = token
        self._key = (
            hashlib.sha256(b"provisioner console\0" + token.encode()).digest() if token else b""
        )

    @property
    def writable(self) -> bool:
        """Whether the console takes actions at all (a token is set)."""
        return self._token is not None

    def _sign(self, purpose: str, value: str) -> str:
        message = f"{purpose}\0{value}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        if self._token is None:
            return False
        return hmac.compare_digest(given.encode(), self._token.encode())

    def new_session(self) -> str:
        """A cookie value: a random session id and its signature."""
        sid = secrets.token_urlsafe(18)
        return f"{sid}.{self._sign('session', sid)}"

    def session_id(self, request: Request) -> str | None:
        """The session id of a request's valid cookie (None: not logged in)."""
        if not self.writable:
            return None
        sid, _, signature = request.cookies.get(SESSION_COOKIE, "").partition(".")
        if not sid or not hmac.compare_digest(signature, self._sign("session", sid)):
            return None
        return sid

    def csrf_token(self, request: Request) -> str | None:
        """The token the session's forms carry (None: not logged in)."""
        sid = self.session_id(request)
        return self._sign("csrf", sid) if sid else None

    @staticmethod
    def same_origin(request: Request) -> bool:
        """Whether the request's ``Origin`` (or ``Referer``) is the console's own address."""
        origin = request.headers.get("origin")
        if origin is None:
            referer = urlsplit(request.headers.get("referer", ""))
            origin = f"{referer.scheme}://{referer.netloc}" if referer.netloc else None
        host = request.headers.get("host")
        return (
            origin is not None and host is not None and origin == f"{request.url.scheme}://{host}"
        )

    def refuse(self, request: Request, form: dict[str, str]) -> Refusal | None:
        """Why this action may not run (None: it may)."""
        if not self.same_origin(request):
            return Refusal(403, "refused: this request did not come from the console's own page")
        if not self.writable:
            return Refusal(
                403, "the console is read-only: set PROVISIONER_CONSOLE_TOKEN to allow actions"
            )
        expected = self.csrf_token(request)
        if expected is None:
            return Refusal(403, "log in with the console token first")
        if not hmac.compare_digest(form.get("csrf", ""), expected):
            return Refusal(403, "refused: the form's CSRF token is missing or wrong; reload")
        return None
