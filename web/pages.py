"""Opaque page tokens: a key and an offset, base64url, for every paginated listing."""

from __future__ import annotations

import base64
import binascii

from web.problems import Problem

__all__ = ["token", "untoken"]


def token(key: str, offset: int) -> str:
    return base64.urlsafe_b64encode(f"{key}:{offset}".encode()).decode().rstrip("=")


def untoken(text: str) -> tuple[str, int]:
    """The key and offset of a token; a 400 if it is not one."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        key, offset = raw.rsplit(":", 1)
        if int(offset) >= 0:
            return key, int(offset)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise Problem(400, "invalid page token", f"{text!r} is not a page token")
