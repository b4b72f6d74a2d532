"""Credentials for `map/connect`: an API key or a bearer token (a JWT)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union

__all__ = ["Auth", "AuthLike"]


@dataclass(frozen=True)
class Auth:
    """A credential as `map/connect` carries it: `{"method": ..., "credential": ...}`.

    The router also takes API keys sent as `bearer` (docs/security.md).
    """

    method: str
    credential: str

    @classmethod
    def api_key(cls, key: str) -> Auth:
        return cls("api-key", key)

    @classmethod
    def bearer(cls, token: str) -> Auth:
        """A JWT (or an API key) sent as a bearer token."""
        return cls("bearer", token)

    def to_wire(self) -> dict[str, Any]:
        return {"method": self.method, "credential": self.credential}

    def __repr__(self) -> str:  # never print a secret
        return f"Auth(method={self.method!r}, credential=<{len(self.credential)} chars>)"


#: What `auth=` takes: an `Auth`, or a mapping in the TypeScript SDK's spelling
#: (`{"method": "api-key", "token": "..."}` or `{"method": ..., "credential": ...}`).
AuthLike = Union[Auth, Mapping[str, str]]


def to_auth(value: AuthLike | None) -> Auth | None:
    if value is None or isinstance(value, Auth):
        return value
    method = value.get("method", "bearer")
    credential = value.get("credential", value.get("token"))
    if not isinstance(credential, str):
        raise ValueError("auth needs a 'credential' (or 'token')")
    return Auth(method, credential)
