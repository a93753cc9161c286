"""Gateway authentication (seed 000 §13; contracts Part B §1.10): which routes need which bearer token, the
tokens (SIE_AUTH_TOKENS, SIE_AUTH_TOKENS_FILE re-read when it changes, SIE_ADMIN_TOKEN), the start-up check, and
the pure ASGI middleware that refuses a request before any handler runs. Refusals are answered through
replies.py (the native or the OpenAI envelope, by path); no web framework here.

    /healthz, /readyz                             always open: kubelet probes never fail for want of a token
    /, /health, /metrics, /docs, /ws/*,           operational: open with SIE_AUTH_EXEMPT_OPERATIONAL, else inference
      /v1/scaling/*, …
    /v1/dlq/*; POST, PUT, PATCH, DELETE under     admin: SIE_ADMIN_TOKEN only; 401 without a token, 403 with
      /v1/configs (not …/resolve), /v1/pools,       another; in token mode, closed (403) while SIE_ADMIN_TOKEN is unset
      /v1/admin, /v1/placement
    everything else                               inference: an inference token or the admin token; 401 otherwise

SIE_AUTH_MODE=none checks the admin routes only, and only while SIE_ADMIN_TOKEN is set (as the dead letters did
before gateway auth existed, and as the config service treats writes).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from pathlib import Path
from typing import Final

from sie.gateway.errors import ForbiddenError, UnauthorizedError
from sie.gateway.http.replies import send_error_reply
from sie.gateway.http.shutdown import ASGIApp, Receive, Scope, Send
from sie.http.bearer import bearer_token, token_in
from sie.runtime.periodic import Outage, PeriodicTask
from sie.settings import AuthSettings

logger = logging.getLogger(__name__)

TOKEN_MODE: Final = "token"
PROBE_PATHS: Final = frozenset({"/healthz", "/readyz"})
OPERATIONAL_PATHS: Final = frozenset({"/", "/health", "/metrics", "/docs", "/openapi.json"})
OPERATIONAL_PREFIXES: Final = ("/ws/", "/docs/", "/v1/scaling/")
ADMIN_PREFIXES: Final = ("/v1/dlq",)  # every method: dead letters hold users' inputs
ADMIN_MUTATION_PREFIXES: Final = ("/v1/configs", "/v1/pools", "/v1/admin", "/v1/placement")
READ_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
READ_POSTS: Final = frozenset({"/v1/configs/resolve"})  # a POST that only reads (seed 000 §14)
# How often the tokens file is looked at; a changed file is re-read whole.
TOKENS_FILE_POLL_S: Final = 1.0
# An unauthenticated websocket is closed before it is accepted: servers answer the handshake with 403.
WEBSOCKET_POLICY_VIOLATION: Final = 1008

MISSING_TOKEN: Final = "Missing Authorization header: send Authorization: Bearer <token>"
INVALID_TOKEN: Final = "Invalid token"
ADMIN_MISSING: Final = "This route needs the admin token: send Authorization: Bearer <SIE_ADMIN_TOKEN>"
ADMIN_REQUIRED: Final = "This route needs the admin token (SIE_ADMIN_TOKEN); this token is not it"
ADMIN_CLOSED: Final = "Admin routes are closed: SIE_ADMIN_TOKEN is not set on this gateway"


class RouteKind(enum.Enum):
    """What a request needs, from its method and path alone."""

    PROBE = "probe"
    OPERATIONAL = "operational"
    ADMIN = "admin"
    INFERENCE = "inference"


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def route_kind(method: str, path: str) -> RouteKind:
    """The kind of route a request targets (the table in the module docstring); unknown paths are inference."""
    if path in PROBE_PATHS:
        return RouteKind.PROBE
    if path in OPERATIONAL_PATHS or path.startswith(OPERATIONAL_PREFIXES):
        return RouteKind.OPERATIONAL
    if any(_under(path, prefix) for prefix in ADMIN_PREFIXES):
        return RouteKind.ADMIN
    mutation = method not in READ_METHODS and path not in READ_POSTS
    if mutation and any(_under(path, prefix) for prefix in ADMIN_MUTATION_PREFIXES):
        return RouteKind.ADMIN
    return RouteKind.INFERENCE


class AuthSettingsError(Exception):
    """The auth settings cannot be served as given; the message names the setting and the fix."""


def parse_tokens(text: str) -> tuple[str, ...]:
    """The tokens of a tokens file: one a line, trimmed; blank lines and `#` comments skipped."""
    lines = (line.strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


class TokensFile:
    """SIE_AUTH_TOKENS_FILE, read again only when its identity, size or modification time changed (a mounted
    Kubernetes secret is swapped by a symlink, which `stat` follows). Blocking: call it in a thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None

    def read_if_changed(self) -> tuple[str, ...] | None:
        """The file's tokens when it changed since the last read, else None; raises OSError or ValueError."""
        stat = self.path.stat()
        stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if stamp == self._stamp:
            return None
        tokens = parse_tokens(self.path.read_text(encoding="utf-8"))
        self._stamp = stamp
        return tokens


def check_auth_settings(auth: AuthSettings) -> None:
    """Raise AuthSettingsError when token mode has no inference token to accept, or the tokens file cannot be
    read. Reads the file: call it before the event loop starts."""
    file_tokens: tuple[str, ...] = ()
    if auth.tokens_file is not None:
        try:
            file_tokens = parse_tokens(auth.tokens_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise AuthSettingsError(f"SIE_AUTH_TOKENS_FILE={auth.tokens_file} cannot be read: {exc}") from exc
    if auth.mode == TOKEN_MODE and not auth.tokens and not file_tokens:
        source = f"; SIE_AUTH_TOKENS_FILE={auth.tokens_file} holds none" if auth.tokens_file is not None else ""
        raise AuthSettingsError(
            f"SIE_AUTH_MODE=token needs at least one inference token{source}. Set SIE_AUTH_TOKENS (comma-separated) "
            "or SIE_AUTH_TOKENS_FILE (one a line); SIE_ADMIN_TOKEN guards the admin routes only. Or set "
            "SIE_AUTH_MODE=none to serve without auth."
        )


class GatewayAuth:
    """Decides each request against the current tokens; entered (an async context manager), it re-reads the
    tokens file while the gateway serves, so inference tokens rotate without a restart."""

    def __init__(
        self,
        *,
        mode: str = "none",
        tokens: tuple[str, ...] = (),
        admin_token: str | None = None,
        exempt_operational: bool = False,
        tokens_file: Path | None = None,
    ) -> None:
        self.token_mode = mode == TOKEN_MODE
        self._tokens = tokens
        self._admin = (admin_token,) if admin_token else ()
        self._exempt_operational = exempt_operational
        self._file = TokensFile(tokens_file) if tokens_file is not None else None
        self._file_tokens: tuple[str, ...] = ()
        self._watch: PeriodicTask | None = None
        if tokens_file is not None:  # a file that cannot be read keeps its last tokens: it must not open the gateway
            outage = Outage(
                f"re-reading {tokens_file}", logger, (OSError, ValueError), meanwhile="keeping its last tokens"
            )
            self._watch = PeriodicTask(self._reread_file, TOKENS_FILE_POLL_S, outage)

    @classmethod
    def from_settings(cls, auth: AuthSettings) -> GatewayAuth:
        if auth.mode != TOKEN_MODE and (auth.tokens or auth.tokens_file is not None):
            logger.warning(
                "inference tokens are set but SIE_AUTH_MODE=none: the gateway serves without auth "
                "(set SIE_AUTH_MODE=token to require them)"
            )
        return cls(mode=auth.mode, tokens=auth.tokens, admin_token=auth.admin_token,
                   exempt_operational=auth.exempt_operational, tokens_file=auth.tokens_file)  # fmt: skip

    @property
    def enforcing(self) -> bool:
        """Whether any request can be refused (else the middleware passes everything straight through)."""
        return self.token_mode or bool(self._admin)

    async def __aenter__(self) -> GatewayAuth:
        if self._file is not None and self._watch is not None:
            try:
                self._file_tokens = await asyncio.to_thread(self._file.read_if_changed) or ()
            except (OSError, ValueError) as exc:
                raise AuthSettingsError(f"SIE_AUTH_TOKENS_FILE={self._file.path} cannot be read: {exc}") from exc
            await self._watch.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._watch is not None:
            await self._watch.__aexit__(*exc_info)

    async def _reread_file(self) -> None:
        """Take the tokens file's tokens when it changed; OSError or ValueError when it cannot be read."""
        if self._file is None:
            return
        tokens = await asyncio.to_thread(self._file.read_if_changed)
        if tokens is not None:
            self._file_tokens = tokens
            logger.info("re-read %s: %d inference tokens", self._file.path, len(tokens))

    def authorize(self, method: str, path: str, authorization: str | None) -> None:
        """Return when the request may proceed; else raise UnauthorizedError (401) or ForbiddenError (403)."""
        kind = route_kind(method, path)
        if kind is RouteKind.PROBE:
            return
        if kind is RouteKind.ADMIN:
            self._authorize_admin(authorization)
            return
        if not self.token_mode or (kind is RouteKind.OPERATIONAL and self._exempt_operational):
            return
        token = bearer_token(authorization)
        if token is None:
            raise UnauthorizedError(MISSING_TOKEN)
        if not token_in(token, (*self._tokens, *self._file_tokens, *self._admin)):
            raise UnauthorizedError(INVALID_TOKEN)

    def _authorize_admin(self, authorization: str | None) -> None:
        if not self._admin:
            if self.token_mode:
                raise ForbiddenError(ADMIN_CLOSED)
            return
        token = bearer_token(authorization)
        if token is None:
            raise UnauthorizedError(ADMIN_MISSING)
        if not token_in(token, self._admin):
            raise ForbiddenError(ADMIN_REQUIRED)


def _authorization(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value.decode("latin-1")
    return None


class AuthMiddleware:
    """Pure ASGI: refuses HTTP requests and websocket handshakes that `auth` does not authorize."""

    def __init__(self, app: ASGIApp, auth: GatewayAuth) -> None:
        self.app = app
        self._auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self._auth.enforcing:
            await self.app(scope, receive, send)
            return
        try:
            self._auth.authorize(scope.get("method", "GET"), scope["path"], _authorization(scope))
        except (UnauthorizedError, ForbiddenError) as exc:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": WEBSOCKET_POLICY_VIOLATION, "reason": exc.message})
            else:
                await send_error_reply(exc, scope["path"], send)
            return
        await self.app(scope, receive, send)
