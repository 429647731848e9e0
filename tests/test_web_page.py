"""The monitor page in a headless Chromium (Playwright), against a real overlay: the topology,
a trace, the routing tables, the history console, connections and durable subscriptions with
their actions, and a broker that stops.

Chromium is Debian's ``chromium`` package, launched by its path (``PADRES_CHROMIUM`` overrides
it); the tests are skipped, saying why, where there is none. Screenshots are saved in
``PADRES_SCREENSHOTS`` when it is set (docs/images has the README's), else in a temporary
directory.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from padres import BlockingClient
from padres.model.protocol import Notify
from tests.test_web_api import ORDERS, WebOverlay, eventually, web_overlay

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

CHROMIUM = os.environ.get("PADRES_CHROMIUM") or shutil.which("chromium") or ""
pytestmark = pytest.mark.skipif(
    not CHROMIUM, reason="no Chromium: install Debian's chromium package (.ci/run does)"
)
WAIT_MS = 15_000


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebOverlay]:
    with web_overlay(tmp_path_factory.mktemp("page")) as started:
        yield started


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("PADRES_SCREENSHOTS")
    if chosen:
        Path(chosen).mkdir(parents=True, exist_ok=True)
        return Path(chosen)
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for the module (Playwright's sync API runs one at a time)."""
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def page(overlay: WebOverlay, browser: Any) -> Iterator[Any]:
    """The monitor page of broker B2."""
    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(f"{overlay.http('B2')}/")
    yield tab
    assert errors == []


def _counts_are(page: Any, brokers: int, links: int) -> None:
    page.wait_for_function(
        "([b, l]) => document.getElementById('broker-count').textContent == b"
        " && document.getElementById('link-count').textContent == l",
        arg=[brokers, links],
        timeout=WAIT_MS,
    )


def _graph(page: Any) -> dict[str, list[str]]:
    """The elements Cytoscape draws, by kind."""
    found: dict[str, list[str]] = page.evaluate(
        """() => {
            const out = {};
            for (const e of window.monitor.cy.elements()) {
                (out[e.data('kind')] ||= []).push(e.id());
            }
            return out;
        }"""
    )
    return {kind: sorted(ids) for kind, ids in found.items()}


def test_the_page_draws_the_overlay(overlay: WebOverlay, page: Any, shots: Path) -> None:
    _counts_are(page, 3, 2)
    page.wait_for_function("window.monitor.cy.nodes('[kind=\"database\"]').length == 1")
    graph = _graph(page)
    assert graph["broker"] == ["b:B1", "b:B2", "b:B3"]
    assert graph["link"] == ["l:B1|B2", "l:B2|B3"]
    assert graph["database"] == ["c:DB1@B2"]
    assert page.inner_text("#served-by") == "served by B2"
    page.wait_for_timeout(2500)  # the rate charts fill
    page.screenshot(path=str(shots / "overlay.png"), full_page=True)


def test_a_trace_shows_the_path_and_the_matched_subscriptions(
    overlay: WebOverlay, page: Any, shots: Path
) -> None:
    b1, b3 = overlay.http("B1"), overlay.http("B3")
    r = httpx.post(
        f"{b1}/api/v1/advertisements",
        json={"filter": "[class,eq,'Parcel'],[to,isPresent,'']", "client": "post"},
    )
    assert r.status_code == 201
    sub = httpx.post(f"{b3}/api/v1/subscriptions", json={"filter": "[class,eq,'Parcel']"}).json()
    page.fill("#trace-filter", "[class,eq,'Parcel']")
    page.click("#trace-form button")
    page.wait_for_function(
        "document.getElementById('trace-summary').textContent.startsWith('waiting')",
        timeout=WAIT_MS,
    )
    time.sleep(0.3)  # the trace request reaches every broker
    httpx.post(f"{b1}/api/v1/publications?client=post", json={"class": "Parcel", "to": "x"})
    page.wait_for_function(
        "document.querySelectorAll('#trace-hops li').length == 3", timeout=WAIT_MS
    )
    hops = page.locator("#trace-hops li").all_inner_texts()
    assert hops[0].startswith("B1: from post@B1 → B2")
    assert hops[1].startswith("B2: from B1 → B3")
    assert hops[2] == f"B3: from B2 → no broker; matched {sub['id']} (web-{sub['id']}@B3)"
    traced = page.evaluate("window.monitor.cy.$('.traced').map((e) => e.id()).sort()")
    assert traced == ["b:B1", "b:B2", "b:B3", "l:B1|B2", "l:B2|B3"]
    page.screenshot(path=str(shots / "trace.png"), full_page=True)

    # Publish one at B2, the page's broker, and trace it: B2, then B3 where it matches.
    r = httpx.post(
        f"{overlay.http('B2')}/api/v1/advertisements",
        json={"filter": "[class,eq,'Parcel'],[to,isPresent,'']", "client": "desk"},
    )
    assert r.status_code == 201
    page.fill("#trace-publication", "[class,'Parcel'],[to,'y']")
    page.fill("#trace-client", "desk")
    page.click("#trace-publish-form button")
    page.wait_for_function(
        "document.getElementById('trace-summary').textContent.includes('from desk@B2')"
        " && document.querySelectorAll('#trace-hops li').length == 2",
        timeout=WAIT_MS,
    )
    hops = page.locator("#trace-hops li").all_inner_texts()
    assert hops[0].startswith("B2: from desk@B2 → B3")
    assert hops[1] == f"B3: from B2 → no broker; matched {sub['id']} (web-{sub['id']}@B3)"

    # B1's subscription routing table holds post's advertisement and desk's, from B2.
    page.select_option("#broker-choice", "B1")
    page.select_option("#routing-table", "srt")
    page.fill("#routing-search", "parcel")
    page.click("#routing-form button")
    page.wait_for_function(
        "document.getElementById('routing-summary').textContent == 'B1 SRT: 2 rows'",
        timeout=WAIT_MS,
    )
    assert "[class,eq,'Parcel'],[to,isPresent]" in page.inner_text("#routing-rows")


def test_the_history_console_shows_the_stored_rows(
    overlay: WebOverlay, page: Any, shots: Path
) -> None:
    b1 = overlay.http("B1")
    r = httpx.post(
        f"{b1}/api/v1/advertisements",
        json={"filter": "[class,eq,'Order'],[item,isPresent,'']", "client": "shop"},
    )
    assert r.status_code == 201
    items = ["hat", "shoes", "scarf"]
    orders = [{"class": "Order", "item": item} for item in items]
    assert httpx.post(f"{b1}/api/v1/publications?client=shop", json=orders).status_code == 201

    def stored() -> bool:
        query = {"filter": ORDERS, "from": "now-1h"}
        return bool(httpx.get(f"{b1}/api/v1/history", params=query).json()["total"] == 3)

    eventually(stored, timeout=20)
    page.fill("#history-filter", "[class,eq,'Order'],[item,neq,'scarf']")
    page.fill("#history-from", "now-1h")
    page.click("#history-form button")
    page.wait_for_function(
        "/^2 rows in [0-9.]+ s from DB1@B2$/"
        ".test(document.getElementById('history-summary').textContent)",
        timeout=WAIT_MS,
    )
    rows = page.locator("#history-rows tbody tr").all_inner_texts()
    assert [("hat" in row, "shoes" in row, "shop@B1" in row) for row in rows] == [
        (True, False, True),
        (False, True, True),
    ]
    page.screenshot(path=str(shots / "monitor.png"), full_page=True)


def test_a_durable_subscriptions_lag_shows_and_it_can_be_deleted_from_the_page(
    overlay: WebOverlay, page: Any, shots: Path
) -> None:
    """Its lag grows while its client is away and falls when the client is back and takes
    what waited; the page's Delete removes it at its broker."""
    url = overlay.brokers["B2"].url
    page.select_option("#broker-choice", "B2")
    with BlockingClient(url, name="clerk") as clerk:
        clerk.subscribe("[class,eq,'Invoice']", durable="invoices")
    with BlockingClient(url, name="billing") as billing:
        billing.advertise("[class,eq,'Invoice'],[n,isPresent,0]")
        for n in range(7):
            billing.publish({"class": "Invoice", "n": n}, guaranteed=True)
        billing.flush()
    clerk_row = "#durable-rows tr[data-durable='clerk@B2/invoices']"
    page.wait_for_function(
        f"(document.querySelector(\"{clerk_row}\")?.children[3].textContent) == '7'",
        timeout=WAIT_MS,
    )
    assert page.inner_text(f"{clerk_row} td:nth-child(3)").startswith("away")
    page.screenshot(path=str(shots / "durables.png"), full_page=True)

    with BlockingClient(url, name="clerk") as clerk:  # back: it takes and acknowledges all
        invoices = clerk.subscribe("[class,eq,'Invoice']", durable="invoices")
        got = []
        for note in clerk.deliveries(invoices, timeout=10):
            if isinstance(note, Notify):
                got.append(note.publication.attributes["n"])
            if len(got) == 7:
                break
        assert got == list(range(7))
        page.wait_for_function(
            f"(document.querySelector(\"{clerk_row}\")?.children[3].textContent) == '0'",
            timeout=WAIT_MS,
        )
        assert page.inner_text(f"{clerk_row} td:nth-child(3)") == "connected"
        connections = page.locator("#connection-rows tbody tr").all_inner_texts()
        assert any(r.startswith("clerk@B2\t127.0.0.1") for r in connections), connections

    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f"{clerk_row} button")
    page.wait_for_function(f'!document.querySelector("{clerk_row}")', timeout=WAIT_MS)
    left = httpx.get(f"{overlay.http('B2')}/api/v1/durables").json()
    assert [d for d in left if d["owner"] == "clerk@B2"] == []


def test_a_broker_that_stops_shows_as_down(overlay: WebOverlay, page: Any, shots: Path) -> None:
    overlay.stop("B3")
    _counts_are(page, 2, 1)
    page.wait_for_function(
        "document.getElementById('down-summary').textContent == ' (1 down)'", timeout=WAIT_MS
    )
    graph = _graph(page)
    assert graph["broker"] == ["b:B1", "b:B2", "b:B3"] and graph["link"] == ["l:B1|B2"]
    assert page.evaluate("window.monitor.cy.getElementById('b:B3').hasClass('down')")
    rows = page.locator("#broker-rows tbody tr").all_inner_texts()
    assert rows[-1].startswith("B3\tdown, last seen "), rows
    assert any(
        a.endswith("B3 is down") or " B3 is down (last seen" in a
        for a in (page.locator("#alarms li").all_inner_texts())
    )
    page.screenshot(path=str(shots / "stopped.png"), full_page=True)


def test_the_page_of_a_broker_with_accounts_reads_every_broker_with_its_token(
    tmp_path: Path, browser: Any
) -> None:
    """With accounts, the page given an administrator's token in its address draws the
    overlay and reads the routing tables of another broker (another origin) with it."""
    from padres.security.accounts import Accounts, Role
    from padres.testing.processes import BrokerProcess

    accounts = Accounts(tmp_path / "accounts.toml", create=True)
    for name in ("S1", "S2"):
        accounts.add(name, f"{name}-pw", role=Role.BROKER)
    accounts.add("ops", "ops-pw", admin=True)
    token = accounts.add_token("ops", "page")

    def secured(name: str, neighbours: list[str]) -> BrokerProcess:
        login = ["--user", name, "--password", f"{name}-pw"]
        options = ["--accounts", str(accounts.path), *login]
        return BrokerProcess(name, neighbours=neighbours, options=options)

    s1 = secured("S1", [])
    s2: BrokerProcess | None = None
    try:
        s1.start()
        s2 = secured("S2", [s1.url])
        s2.start()
        base = f"http://127.0.0.1:{s1.port}"
        assert httpx.get(f"{base}/").status_code == 401
        tab = browser.new_page()
        try:
            errors: list[str] = []
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            tab.goto(f"{base}/?access_token={token}")
            _counts_are(tab, 2, 1)
            tab.select_option("#broker-choice", "S2")
            tab.select_option("#routing-table", "srt")
            tab.click("#routing-form button")
            tab.wait_for_function(
                "document.getElementById('routing-summary').textContent.startsWith('S2 SRT')",
                timeout=WAIT_MS,
            )
            assert errors == []
        finally:
            tab.close()
    finally:
        for process in (s2, s1):
            if process is not None:
                process.stop()
