"""TLS: a broker serving ``wss://`` (and ``https://`` for the web API on the same port), and
what a dialler verifies a ``wss://`` broker against.

A broker given a certificate and its key serves TLS only. Whoever dials a ``wss://`` URL, a
client or a broker linking to a neighbour, checks the peer's certificate and host name against
the system's trusted authorities, or against a CA file (a private authority, or a self-signed
certificate); a peer whose certificate does not verify is refused before anything is sent.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from padres.errors import TLSError

__all__ = ["ServerTLS", "client_context", "secure"]


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """The certificate (PEM, chain included) and private key a broker serves TLS with."""

    cert: str
    key: str

    def context(self) -> ssl.SSLContext:
        """The server's context; ``TLSError`` if the files do not make one."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert, self.key)
        except FileNotFoundError as exc:
            raise TLSError(f"{exc.filename}: no such file") from None
        except (OSError, ssl.SSLError) as exc:
            raise TLSError(
                f"certificate {self.cert} with key {self.key} cannot be used: {exc}"
            ) from None
        return context


def secure(url: str) -> bool:
    """Whether ``url`` asks for TLS (``wss://`` or ``https://``)."""
    return url.startswith(("wss://", "https://"))


def client_context(ca: str | Path | None = None) -> ssl.SSLContext:
    """What a dialler checks a ``wss://`` peer against: the certificates of ``ca`` (a PEM
    file) if given, else the system's trusted authorities; host names are checked too."""
    try:
        return ssl.create_default_context(cafile=None if ca is None else str(ca))
    except FileNotFoundError:
        raise TLSError(f"{ca}: no such file") from None
    except (OSError, ssl.SSLError) as exc:
        raise TLSError(f"{ca}: not a PEM file of CA certificates ({exc})") from None
