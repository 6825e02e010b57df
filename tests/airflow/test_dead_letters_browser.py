"""The Dead letters page in a real headless browser (Debian's chromium driven by Playwright).

A user logs in through Airflow's own login page, finds "Dead letters" in Airflow's navigation,
filters, searches, opens a job, replays one (and sees it published once the publish loop ran)
and purges another. Takes a screenshot of the page on every run; with RETRY_UPDATE_SCREENSHOT=1
it writes the README's, ``docs/dead-letters.png``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.sync_api import Browser, Frame, FrameLocator, Page, expect, sync_playwright

from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.store import Store
from retry_scheduler.loops.publish import Publisher
from tests.airflow import test_dead_letters_api as api
from tests.conftest import ROOT, TEST_DESTINATIONS
from tests.kafkautil import consume

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

CHROMIUM = os.environ.get("RETRY_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOT = (
    ROOT / "docs" / "dead-letters.png"
    if os.environ.get("RETRY_UPDATE_SCREENSHOT")
    else Path(tempfile.gettempdir()) / "retry-scheduler-dead-letters.png"
)

# One api-server for this module too (the fixtures are the API tests' ones).
retry_db = api.retry_db
airflow_server = api.airflow_server
AirflowServer = api.AirflowServer


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), (
        f"no chromium at {CHROMIUM}: run `make browser-deps` (apt-get install chromium)"
    )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


REASONS = [
    ("exhausted", "TimeoutError", "TimeoutError: payment gateway did not answer within 10 s"),
    ("fatal", "SchemaError", "SchemaError: field 'amount' is required"),
    (
        "exhausted",
        "ConnectionRefusedError",
        "ConnectionRefusedError: inventory-service:8443 refused the connection",
    ),
    ("expired", "requests.HTTPError", "HTTPError: 503 Service Unavailable from carrier API"),
    ("requested", "ManualReview", "sent to the DLQ by the fraud check"),
]
DESTINATIONS = ["orders", "payments", "shipping", "inventory"]


def _value(n: int) -> bytes:
    return json.dumps(
        {"order_id": f"A-{10_000 + n}", "amount": round(19.9 + n * 3.5, 2), "currency": "EUR"}
    ).encode()


@pytest.fixture(scope="module")
def jobs(retry_db: str) -> dict[str, Any]:
    """Realistic dead jobs over the last hours, plus the few the test acts on."""
    now = datetime.now(UTC).replace(microsecond=0)
    ids: list[int] = []
    seeded: list[tuple[str | None, str]] = []  # (destination, reason) of every job
    for n in range(36):
        dead_reason, error_class, reason = REASONS[n % len(REASONS)]
        destination = DESTINATIONS[n % len(DESTINATIONS)]
        invalid = n % 11 == 5
        if invalid:
            reason = "retry.attempt header is not a whole number: 'three'"
        seeded.append((None if invalid else destination, reason))
        ids.append(
            api.insert_dead(
                retry_db,
                None if invalid else destination,
                dead_reason="invalid" if invalid else dead_reason,
                error_class=None if invalid else error_class,
                reason=reason,
                attempt=n % 5,
                source_offset=48_210 + n,
                msg_key=f"A-{10_000 + n}".encode(),
                msg_value=_value(n),
                headers=[
                    ("traceparent", f"00-{hashlib.md5(bytes([n])).hexdigest()}-{n:016x}-01".encode()),
                    ("content-type", b"application/json"),
                    ("retry.reason", reason.encode()),
                ],
                dead_at=now - timedelta(minutes=400 - n * 10),
                first_seen_at=now - timedelta(minutes=460 - n * 10),
            )
        )
    long_value = json.dumps({"lines": [{"sku": f"SKU-{i:05d}", "qty": 1} for i in range(400)]}).encode()
    special = {
        "xss": api.insert_dead(
            retry_db,
            "orders",
            msg_key=bytes([0x00, 0x9F, 0x92, 0x96]),
            msg_value=b'{"comment": "<script>window.__xss = 1</script><img src=x onerror=\\"window.__xss = 2\\">"}',
            reason="<b>ValueError</b>: comment rejected by the filter",
            error_class="ValueError",
            dead_reason="fatal",
            dead_at=now - timedelta(minutes=35),
        ),
        "long": api.insert_dead(
            retry_db,
            "orders",
            msg_value=long_value,
            reason="PayloadTooLarge: 400 order lines",
            error_class="PayloadTooLarge",
            dead_reason="fatal",
            dead_at=now - timedelta(minutes=25),
        ),
        "replay": api.insert_dead(
            retry_db,
            "payments",
            attempt=4,
            msg_key=b"A-20001",
            msg_value=_value(20001),
            headers=[("traceparent", b"00-replayed-01"), ("content-type", b"application/json")],
            reason="TimeoutError: payment gateway did not answer within 10 s",
            error_class="TimeoutError",
            dead_at=now - timedelta(minutes=15),
        ),
        "purge": api.insert_dead(
            retry_db,
            "shipping",
            msg_value=_value(30001),
            reason="HTTPError: 410 Gone: shipment cancelled",
            error_class="requests.HTTPError",
            dead_reason="expired",
            dead_at=now - timedelta(minutes=5),
        ),
    }
    seeded += [
        ("orders", "<b>ValueError</b>: comment rejected by the filter"),
        ("orders", "PayloadTooLarge: 400 order lines"),
        ("payments", "TimeoutError: payment gateway did not answer within 10 s"),
        ("shipping", "HTTPError: 410 Gone: shipment cancelled"),
    ]
    return {"ids": ids, **special, "total": len(seeded), "seeded": seeded, "long_size": len(long_value)}


def spaced(n: int) -> str:
    """A number as the page writes it: 10 000."""
    return f"{n:,}".replace(",", " ")


def login(page: Page, user: str, password: str) -> None:
    """Fill in Airflow's own login page (the page must be on it)."""
    expect(page).to_have_url(re.compile(r"/auth/login"))
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def dead_letters_frame(page: Page) -> tuple[FrameLocator, Frame]:
    locator = page.frame_locator('iframe[title="Dead letters"]')
    expect(locator.locator("#total")).not_to_be_empty()
    frame = next(f for f in page.frames if "/retry-scheduler/" in f.url)
    return locator, frame


def rows(ui: FrameLocator | Page) -> Any:
    return ui.locator("#jobs tbody tr")


def test_without_a_login_the_browser_lands_on_airflows_login_page(
    airflow_server: AirflowServer, browser: Browser, jobs: dict[str, Any]
) -> None:
    context = browser.new_context(base_url=airflow_server.base_url)
    try:
        page = context.new_page()
        response = page.request.get("/retry-scheduler/api/dead-letters")
        assert response.status == 401
        page.goto("/retry-scheduler/")
        expect(page.get_by_role("button", name="Sign in")).to_be_visible()
        assert "next=" in page.url and "retry-scheduler" in page.url
        assert page.locator("#jobs").count() == 0
        # Logging in there leads back to the page.
        login(page, "admin", "admin")
        expect(page).to_have_url(f"{airflow_server.base_url}/retry-scheduler/")
        expect(rows(page)).to_have_count(min(50, jobs["total"]))
    finally:
        context.close()


def test_a_user_filters_inspects_replays_and_purges(
    airflow_server: AirflowServer,
    browser: Browser,
    jobs: dict[str, Any],
    retry_db: str,
    bootstrap_servers: str,
) -> None:
    context = browser.new_context(base_url=airflow_server.base_url, viewport={"width": 1440, "height": 900})
    try:
        page = context.new_page()
        page.goto("/")
        login(page, "admin", "admin")

        # Airflow's navigation: Browse > Dead letters shows the page inside the Airflow UI.
        page.get_by_role("button", name="Browse").click()
        page.get_by_role("menuitem", name="Dead letters").click()
        ui, frame = dead_letters_frame(page)
        expect(ui.locator("#total")).to_have_text(f"{jobs['total']} dead jobs")
        expect(ui.locator("#who")).to_have_text("Signed in as admin")
        expect(rows(ui)).to_have_count(jobs["total"])
        expect(rows(ui).first).to_have_attribute("data-id", str(jobs["purge"]))  # the newest
        shown = ui.locator("#jobs td.when").all_inner_texts()
        assert shown == sorted(shown, reverse=True) and len(set(shown)) == len(shown)

        # Filter by destination (a menu filled from the facets, with counts) ...
        n_payments = sum(d == "payments" for d, _ in jobs["seeded"])
        n_gateway = sum(d == "payments" and "gateway" in r for d, r in jobs["seeded"])
        assert n_payments > n_gateway > 1
        menu = ui.locator("#f-destination option").all_inner_texts()
        assert [o for o in menu if o.startswith("payments")] == [f"payments ({n_payments})"]
        ui.locator("#f-destination").select_option("payments")
        expect(ui.locator("#total")).to_have_text(f"{n_payments} dead jobs match")
        expect(rows(ui)).to_have_count(n_payments)
        assert set(ui.locator("#jobs tbody td:nth-child(3)").all_inner_texts()) == {"payments"}
        # who wrote each letter: all of these came from the service's own retry topic
        assert set(ui.locator("#jobs tbody td:nth-child(5)").all_inner_texts()) == {"retry-scheduler"}
        assert ui.locator("#f-written-by option").all_inner_texts()[:2] == ["Anyone", "retry-scheduler"]
        # ... and search the reason text (any case).
        ui.locator("#f-search").fill("GATEWAY")
        ui.locator("#f-search").press("Enter")
        expect(ui.locator("#total")).to_have_text(f"{n_gateway} dead jobs match")
        expect(rows(ui)).to_have_count(n_gateway)
        for text in ui.locator("#jobs td.reason").all_inner_texts():
            assert "payment gateway did not answer" in text
        ui.locator("#clear").click()
        expect(ui.locator("#total")).to_have_text(f"{jobs['total']} dead jobs")

        # The detail: markup in a value or reason is text, a binary key is hex.
        ui.locator(f'#jobs tr[data-id="{jobs["xss"]}"]').click()
        expect(ui.locator("#detail-title")).to_have_text(f"Job {jobs['xss']}")
        expect(ui.locator("#detail-value pre")).to_contain_text(
            '"<script>window.__xss = 1</script><img src=x'
        )
        expect(ui.locator('#detail-fields [data-field="reason"]')).to_have_text(
            "<b>ValueError</b>: comment rejected by the filter"
        )
        expect(ui.locator("#detail-key pre")).to_have_text("00 9f 92 96")
        expect(ui.locator("#detail-key")).to_contain_text("binary, shown as hex")
        assert ui.locator("#detail script, #detail img, #detail b").count() == 0
        assert frame.evaluate("window.__xss") is None
        ui.locator(f'#jobs tr[data-id="{jobs["long"]}"]').click()
        expect(ui.locator("#detail-value")).to_contain_text(
            f"truncated, {spaced(jobs['long_size'])} bytes: the first 4 096 shown"
        )

        # The README's screenshot: the page inside Airflow, a job open.
        ui.locator(f'#jobs tr[data-id="{jobs["ids"][-3]}"]').click()
        expect(ui.locator("#detail-title")).to_have_text(f"Job {jobs['ids'][-3]}")
        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT))

        # Replay one selected job: a dry run first, shown in a confirmation, then the replay.
        replay = jobs["replay"]
        ui.locator(f'#jobs input[data-id="{replay}"]').check()
        ui.get_by_role("button", name="Replay selected (1)").click()
        dialog = ui.get_by_role("dialog")
        expect(dialog).to_be_visible()
        expect(dialog.locator("#dialog-title")).to_have_text("Replay 1 dead job?")
        expect(dialog.locator("#dialog-body")).to_contain_text(
            "Dry run: 1 of 1 selected dead jobs would be replayed."
        )
        expect(dialog.locator("#dialog-selection")).to_have_text(f"Selection: job {replay}.")
        dialog.get_by_label(re.compile("Reset attempts to 0")).check()
        expect(dialog.locator("#dialog-pace")).to_have_text(
            "Not paced: every job falls due at once (the default for a replay of this size)."
        )
        dialog.locator("#dialog-rate").fill("3")  # a pace of its own: 3 jobs/s per destination
        dialog.get_by_role("button", name="Replay 1 job").click()
        expect(dialog).to_be_hidden()
        expect(ui.locator("#message")).to_have_text(
            re.compile(
                r"Replayed 1 of 1 selected dead jobs, attempts reset, paced at 3 jobs/s per destination "
                r"\(the last due in about 0 s\) — audit #\d+\."
            )
        )
        expect(ui.locator(f'#jobs tr[data-id="{replay}"]')).to_have_count(0)
        expect(ui.locator("#total")).to_have_text(f"{jobs['total'] - 1} dead jobs")
        row = api.job_rows(retry_db, [replay])[replay]
        assert (row["status"], row["attempt"], row["dead_reason"]) == ("pending", 0, None)
        audit_id = int(re.findall(r"audit #(\d+)", ui.locator("#message").inner_text())[0])
        audit = api.audit_row(retry_db, audit_id)
        assert (audit["action"], audit["actor"], audit["source"], audit["dry_run"]) == (
            "replay",
            "admin",
            "ui",
            False,
        )
        assert (audit["filter"], audit["affected"], audit["reset_attempts"]) == ({"ids": [replay]}, 1, True)
        assert audit["rate_per_s"] == 3.0
        dry = api.audit_row(retry_db, audit_id - 1)
        assert (dry["dry_run"], dry["matched"], dry["filter"]) == (True, 1, {"ids": [replay]})
        recent = ui.locator("#audit tbody tr").first
        expect(recent).to_have_attribute("data-audit-id", str(audit_id))
        expect(recent).to_contain_text("admin")
        expect(recent).to_contain_text("paced 3/s")

        # The publish loop sends it to its destination; the page says it is no longer a dead letter.
        settings = Settings(
            database_url=retry_db,
            kafka={"bootstrap.servers": bootstrap_servers},
            create_topics=True,
            destination_allowlist=TEST_DESTINATIONS,
        )
        with Store(retry_db) as store:
            publisher = Publisher(Deployment.load(settings), store)
            try:
                assert publisher.publish_once().published == 1
            finally:
                publisher.close()
        retry_id = row["retry_id"]
        sent = [s for s in consume(bootstrap_servers, ["payments"], 1) if s.header("retry.id") == retry_id]
        assert len(sent) == 1
        assert (sent[0].key, sent[0].value, sent[0].header("retry.attempt")) == (
            b"A-20001",
            _value(20001),
            "1",
        )
        assert sent[0].header("traceparent") == "00-replayed-01"
        page.goto(f"/retry-scheduler/#job={replay}")  # the page on its own, linked to a job no longer dead
        expect(page.locator("#message")).to_contain_text(
            f"Job {replay} is no longer dead: it is published. This page shows dead jobs only."
        )
        expect(page.locator("#detail-actions")).to_be_hidden()

        # Purge another from its detail, again after a dry run.
        purge = jobs["purge"]
        page.locator(f'#jobs tr[data-id="{purge}"]').click()
        page.locator("#detail-purge").click()
        dialog = page.get_by_role("dialog")
        expect(dialog.locator("#dialog-title")).to_have_text("Purge 1 dead job?")
        expect(dialog.locator("#dialog-body")).to_contain_text("cannot be undone")
        expect(dialog.locator("#dialog-reset-row")).to_be_hidden()
        dialog.get_by_role("button", name="Purge 1 job").click()
        expect(page.locator("#message")).to_have_text(
            re.compile(r"Purged 1 of 1 selected dead jobs — audit #\d+\.")
        )
        expect(page.locator(f'#jobs tr[data-id="{purge}"]')).to_have_count(0)
        assert api.job_rows(retry_db, [purge]) == {}
    finally:
        context.close()


def test_an_invalid_letter_is_re_evaluated_from_its_detail(
    airflow_server: AirflowServer, browser: Browser, jobs: dict[str, Any], retry_db: str
) -> None:
    """Dead invalid when ``orders`` was not yet allowed; the policies allow it now. The letter is
    this test's own (removed afterwards: the module's other tests count the seeded ones)."""
    job = api.insert_dead(
        retry_db,
        None,
        dead_reason="invalid",
        reason="destination 'orders' is not allowed",
        headers=[("retry.destination", b"orders")],
    )
    context = browser.new_context(base_url=airflow_server.base_url)
    try:
        page = context.new_page()
        page.goto("/retry-scheduler/")
        login(page, "admin", "admin")
        # (a seeded job no other test replays or purges: the tests may run in any order)
        page.locator(f'#jobs tr[data-id="{jobs["xss"]}"]').click()
        expect(page.locator("#detail-reevaluate")).to_be_hidden()  # not invalid: nothing to re-evaluate
        page.locator(f'#jobs tr[data-id="{job}"]').click()
        page.locator("#detail-reevaluate").click()
        dialog = page.get_by_role("dialog")
        expect(dialog.locator("#dialog-title")).to_have_text("Re-evaluate 1 dead job?")
        expect(dialog.locator("#dialog-body")).to_contain_text(
            "Dry run: 1 of 1 selected dead jobs would be re-evaluated and made pending. They pass the "
            "current policies"
        )
        expect(dialog.locator("#dialog-reset-row")).to_be_hidden()
        dialog.get_by_role("button", name="Re-evaluate 1 job").click()
        expect(page.locator("#message")).to_have_text(
            re.compile(r"Made pending 1 of 1 selected dead jobs — audit #\d+\.")
        )
        expect(page.locator(f'#jobs tr[data-id="{job}"]')).to_have_count(0)
        row = api.job_rows(retry_db, [job])[job]
        assert (row["status"], row["destination"]) == ("pending", "orders")
    finally:
        context.close()
        with psycopg.connect(retry_db, autocommit=True) as conn:
            conn.execute("DELETE FROM retry_jobs WHERE id = %s", (job,))


def test_a_viewer_browses_without_replay_or_purge(
    airflow_server: AirflowServer, browser: Browser, jobs: dict[str, Any]
) -> None:
    context = browser.new_context(base_url=airflow_server.base_url)
    try:
        page = context.new_page()
        page.goto("/retry-scheduler/")
        login(page, "viewer", "viewer")
        expect(page.locator("#who")).to_have_text("Signed in as viewer · read only")
        expect(rows(page).first).to_be_visible()
        expect(page.locator("#readonly")).to_be_visible()
        expect(page.locator("#actions")).to_be_hidden()
        assert page.locator("#jobs tbody input[type=checkbox]").count() == 0
        expect(page.locator("#select-page")).to_be_hidden()
        rows(page).first.click()
        expect(page.locator("#detail-title")).to_be_visible()
        expect(page.locator("#detail-actions")).to_be_hidden()
    finally:
        context.close()


def test_an_operator_releases_a_stuck_chain_from_the_page(
    airflow_server: AirflowServer, browser: Browser, jobs: dict[str, Any], retry_db: str
) -> None:
    """Ordered mode's waiting chains show on the page; a stuck one is released with a note, audited."""
    chain = "chain-browser-1"
    held_due = datetime(9999, 12, 31, tzinfo=UTC)
    api.insert_dead(retry_db, "orders", status="pending", dead_reason=None, dead_at=None, dlq_published_at=None,
                    held_by=chain, due_at=held_due, original_partition=0, original_offset=5)  # fmt: skip
    with psycopg.connect(retry_db) as conn:
        conn.execute(
            "INSERT INTO retry_released_holds (blocker, why, head) VALUES (%s, 'blocked', 'lost')", [chain]
        )
    context = browser.new_context(base_url=airflow_server.base_url)
    try:
        page = context.new_page()
        page.goto("/retry-scheduler/")
        login(page, "admin", "admin")
        row = page.locator(f'#chains tbody tr[data-chain="{chain}"]')
        expect(row).to_contain_text("stuck")
        page.once("dialog", lambda dialog: dialog.accept("INC-9"))
        row.get_by_role("button", name="Release").click()
        expect(page.locator("#message")).to_contain_text("Released 1 chain(s)")
        audit = page.locator("#audit tbody tr").first
        expect(audit).to_contain_text("release_chains")
        expect(audit).to_contain_text(f"why: its chain was released by an operator (INC-9), chain {chain}")
        expect(row).to_have_count(0)  # its one record fell due: nothing waits in it any more
    finally:
        context.close()
    with psycopg.connect(retry_db) as conn:
        assert conn.execute(
            "SELECT why FROM retry_released_holds WHERE blocker = %s", [chain]
        ).fetchone() == ("dead",)


def test_an_operator_closes_an_open_breaker_from_the_page(
    airflow_server: AirflowServer, browser: Browser, jobs: dict[str, Any], retry_db: str
) -> None:
    """An open breaker shows on the page with why; an operator closes it, and it shows closed."""
    destination = "payments-browser"
    held = api.insert_dead(retry_db, destination, status="pending", dead_reason=None, dead_at=None,
                           dlq_published_at=None, due_at=datetime(9999, 12, 30, tzinfo=UTC))  # fmt: skip
    with psycopg.connect(retry_db) as conn:
        conn.execute(
            "INSERT INTO retry_destinations (destination) VALUES (%s) ON CONFLICT DO NOTHING", [destination]
        )
        conn.execute(
            "UPDATE retry_destinations SET breaker = 'open', breaker_since = now(), breaker_trips = 2, "
            "breaker_reason = 'the probe came back' WHERE destination = %s",
            [destination],
        )
        conn.execute(
            "INSERT INTO retry_breaker_holds (id, destination, due_at) VALUES (%s, %s, now())",
            [held, destination],
        )
    context = browser.new_context(base_url=airflow_server.base_url)
    try:
        page = context.new_page()
        page.goto("/retry-scheduler/")
        login(page, "admin", "admin")
        row = page.locator(f'#breakers tbody tr[data-destination="{destination}"]')
        expect(row).to_contain_text("open")
        expect(row).to_contain_text("the probe came back")
        page.once("dialog", lambda dialog: dialog.accept("consumer fixed"))
        row.get_by_role("button", name="Close").click()
        expect(page.locator("#message")).to_contain_text("Closed 1 breaker(s)")
        expect(row).to_contain_text("closed by admin on the dead letters page: consumer fixed")
        expect(row.get_by_role("button", name="Close")).to_have_count(0)
    finally:
        context.close()
    with psycopg.connect(retry_db) as conn:
        assert conn.execute(
            "SELECT breaker, breaker_by FROM retry_destinations WHERE destination = %s", [destination]
        ).fetchone() == ("closed", None)
