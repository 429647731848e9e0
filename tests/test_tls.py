"""TLS on real broker processes: wss:// clients and links, https:// for the web API, and
certificates that do not verify refused."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from padres.client.connection import Client, Delivery
from padres.errors import ConnectError, TLSError
from padres.model.protocol import Notify
from padres.security.tls import ServerTLS, client_context
from padres.testing.processes import BrokerProcess
from tests.support import eventually

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="the test certificates are made with openssl"
)


def _certificate(directory: Path, name: str, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate for ``host`` and its key (EC P-256: quick to make)."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec"),
            *("-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}"),
            *("-addext", f"subjectAltName=IP:{host}"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``cert``/``key`` for 127.0.0.1; ``other``: a certificate nobody trusts here;
    ``misnamed``: one for another address."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = _certificate(directory, "broker")
    other, _ = _certificate(directory, "other")
    misnamed, misnamed_key = _certificate(directory, "misnamed", host="10.9.8.7")
    return {"cert": cert, "key": key, "other": other, "misnamed": misnamed, "mkey": misnamed_key}


def _tls_broker(
    brokers: dict[str, BrokerProcess],
    name: str,
    cert: Path,
    key: Path,
    neighbours: list[str] | None = None,
    ca: Path | None = None,
) -> str:
    options = ["--heartbeat", "1", "--tls-cert", str(cert), "--tls-key", str(key)]
    if ca is not None:
        options += ["--tls-ca", str(ca)]
    proc = BrokerProcess(name, neighbours=neighbours or [], options=options)
    brokers[name] = proc
    return proc.start()


def _collect() -> tuple[list[str], Callable[[Delivery], None]]:
    got: list[str] = []

    def take(delivery: Delivery) -> None:
        if isinstance(delivery, Notify):
            got.append(delivery.publication.id)

    return got, take


async def test_clients_and_links_speak_tls_and_the_web_api_serves_https(
    brokers: dict[str, BrokerProcess], certs: dict[str, Path]
) -> None:
    b1 = _tls_broker(brokers, "B1", certs["cert"], certs["key"])
    assert b1.startswith("wss://")
    b2 = _tls_broker(brokers, "B2", certs["cert"], certs["key"], [b1], ca=certs["cert"])
    ca = str(certs["cert"])
    got, take = _collect()
    async with Client(b2, "sub", tls_ca=ca) as sub, Client(b1, "pub", tls_ca=ca) as pub:
        await pub.advertise("[class,eq,'T']")
        await sub.subscribe("[class,eq,'T']", take)
        await pub.publish("[class,'T'],[x,1]", id="p1")
        await eventually(lambda: got == ["p1"])
    https = b1.replace("wss://", "https://").removesuffix("/ws")
    health = httpx.get(f"{https}/health", verify=client_context(ca), timeout=10).json()
    assert health["broker"] == "B1" and health["neighbours"] == ["B2"]
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{https}/health", verify=client_context(certs["other"]), timeout=10)


async def test_a_certificate_that_does_not_verify_is_refused(
    brokers: dict[str, BrokerProcess], certs: dict[str, Path]
) -> None:
    url = _tls_broker(brokers, "B1", certs["cert"], certs["key"])
    misnamed = _tls_broker(brokers, "B2", certs["misnamed"], certs["mkey"])
    for target, ca, why in [
        (url, certs["other"], "self-signed certificate"),
        (url, None, "self-signed certificate"),  # the system's authorities do not know it
        (misnamed, certs["misnamed"], "IP address mismatch"),
    ]:
        with pytest.raises(ConnectError, match=why):
            await Client(target, "c", tls_ca=None if ca is None else str(ca)).connect()
    with pytest.raises(ConnectError):  # plain ws:// to a TLS port
        await Client(url.replace("wss://", "ws://"), "c", timeout=3).connect()


async def test_a_link_to_a_neighbour_whose_certificate_does_not_verify_is_not_made(
    brokers: dict[str, BrokerProcess], certs: dict[str, Path]
) -> None:
    b1 = _tls_broker(brokers, "B1", certs["cert"], certs["key"])
    b2 = _tls_broker(brokers, "B2", certs["cert"], certs["key"], [b1], ca=certs["other"])
    _tls_broker(brokers, "B3", certs["cert"], certs["key"], [b1], ca=certs["cert"])
    https = b1.replace("wss://", "https://").removesuffix("/ws")
    verify = client_context(certs["cert"])

    def neighbours() -> list[str]:
        return list(httpx.get(f"{https}/health", verify=verify, timeout=10).json()["neighbours"])

    await eventually(lambda: neighbours() == ["B3"])
    await asyncio.sleep(2)  # B2 keeps dialling, and keeps being refused
    assert neighbours() == ["B3"]
    assert b2.startswith("wss://")


def test_unusable_files_are_clear_errors(tmp_path: Path, certs: dict[str, Path]) -> None:
    with pytest.raises(TLSError, match="no such file"):
        client_context(tmp_path / "missing.pem")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(TLSError, match="not a PEM file"):
        client_context(tmp_path / "junk.pem")
    with pytest.raises(TLSError, match="cannot be used"):
        ServerTLS(str(certs["cert"]), str(certs["other"])).context()  # a certificate, no key
    ssl_context = ServerTLS(str(certs["cert"]), str(certs["key"])).context()
    assert isinstance(ssl_context, ssl.SSLContext)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "padres.cli",
            "broker",
            "--id",
            "B",
            "--port",
            "0",
            "--tls-cert",
            str(certs["cert"]),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "--tls-cert and --tls-key go together" in done.stderr
    assert "Traceback" not in done.stderr
