"""Who may call the config service (seed 000 §3.1, §13; contracts Part A §2.4). Writes need SIE_ADMIN_TOKEN;
reads accept the admin token, SIE_CONFIG_READ_TOKEN or SIE_AUTH_TOKEN(S); export accepts admin or config-read
tokens only. No tokens at all → open (dev). Tokens are read and compared as `sie.http.bearer` says, which the
gateway shares. Pure: no HTTP types.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final

from sie.control.errors import AuthError
from sie.http.bearer import bearer_token, token_in

MISSING_HEADER: Final = "Missing Authorization header"
INVALID_TOKEN: Final = "Invalid token"
ADMIN_REQUIRED: Final = "Admin token required for config mutations"
WRITES_NEED_ADMIN: Final = "Write operations require SIE_ADMIN_TOKEN (read tokens are not sufficient)."
PROD_NEEDS_TOKENS: Final = "Authentication is required in production: set SIE_ADMIN_TOKEN."


class Access(enum.Enum):
    """What a route needs."""

    READ = "read"
    EXPORT = "export"
    WRITE = "write"


class AccessPolicy:
    """The token sets and the rule for each Access level."""

    def __init__(
        self,
        *,
        admin_token: str | None = None,
        read_tokens: Iterable[str] = (),
        auth_tokens: Iterable[str] = (),
        production: bool = False,
    ) -> None:
        self._admin = (admin_token,) if admin_token else ()
        self._read = tuple(token for token in read_tokens if token)
        self._auth = tuple(token for token in auth_tokens if token)
        self._production = production

    @property
    def open(self) -> bool:
        return not (self._admin or self._read or self._auth)

    def check(self, header: str | None, access: Access) -> None:
        """Return when the Authorization header grants `access`, else raise AuthError (401 or 403)."""
        if self.open:
            if self._production:
                raise AuthError(PROD_NEEDS_TOKENS)
            return
        if access is Access.WRITE and not self._admin:
            raise AuthError(WRITES_NEED_ADMIN)
        token = bearer_token(header)
        if token is None:
            raise AuthError(MISSING_HEADER, unauthenticated=True)
        if token_in(token, self._accepted(access)):
            return
        known = token_in(token, self._admin + self._read + self._auth)
        raise AuthError(ADMIN_REQUIRED if access is Access.WRITE and known else INVALID_TOKEN)

    def _accepted(self, access: Access) -> tuple[str, ...]:
        if access is Access.WRITE:
            return self._admin
        if access is Access.EXPORT:
            return self._admin + self._read
        return self._admin + self._read + self._auth
