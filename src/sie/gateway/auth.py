"""Gateway authentication. Not built in this version, so it fails closed: a deployment that asks for it
(SIE_AUTH_MODE=token, or SIE_AUTH_TOKENS) is refused at start-up instead of serving inference to anyone
while it believes it is protected.
"""

from __future__ import annotations

from sie.settings import AuthSettings


class GatewayAuthUnavailable(Exception):
    """The settings ask for gateway auth, which this version cannot enforce; the message names the variable."""


_REMEDY = (
    "Gateway auth is not built in this version, and the gateway will not serve unauthenticated while it is "
    "asked for. Unset it, or put the gateway behind a proxy that authenticates."
)


def refuse_unbuilt_auth(auth: AuthSettings) -> None:
    """Raise GatewayAuthUnavailable when any auth setting asks the gateway to authenticate requests."""
    if auth.mode != "none":
        raise GatewayAuthUnavailable(f"SIE_AUTH_MODE={auth.mode} asks for gateway auth. {_REMEDY}")
    if auth.tokens:
        raise GatewayAuthUnavailable(f"SIE_AUTH_TOKENS (or SIE_AUTH_TOKEN) asks for gateway auth. {_REMEDY}")
