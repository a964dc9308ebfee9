"""The UI's backfill dialog (the DAG page's Trigger button, "Backfill") in headless Chromium, on the weekly
program of the shipped example. The program stays paused, so the backfill's runs are created and queued but
never start; the test checks them through the REST API and cancels the backfill."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.e2e
expect.set_options(timeout=30_000)

PROGRAM = "maxtext_rl_tpu_weekly"
SCREENSHOT = "/tmp/backfill-dialog.png"


def pick_date(page, dialog, index: int, day: str, time: str) -> None:
    """Types a date and a time into the index-th date picker of the dialog (a popover with two fields)."""
    picker = dialog.get_by_test_id("datetime-input").nth(index)
    picker.click()
    popover = page.locator(f"[id='popover:{picker.get_attribute('data-ownedby')}:content']")
    popover.get_by_placeholder("YYYY/MM/DD").fill(day)
    popover.get_by_placeholder("HH:mm").fill(time)
    page.keyboard.press("Escape")


def test_the_backfill_dialog_starts_a_backfill_with_one_run_per_week(airflow_stack, page):
    airflow = airflow_stack.client
    airflow_stack.wait_for_healthy_dag(PROGRAM)
    assert airflow.request("GET", f"/api/v2/dags/{PROGRAM}")["is_paused"]  # paused at creation
    for run in airflow.request("GET", f"/api/v2/dags/{PROGRAM}/dagRuns?limit=100")["dag_runs"]:
        airflow.request("DELETE", f"/api/v2/dags/{PROGRAM}/dagRuns/{run['dag_run_id']}")  # an earlier session's
    # A backfill an interrupted earlier session left open: Airflow refuses a second one for the program.
    for open_backfill in airflow.request("GET", f"/api/v2/backfills?dag_id={PROGRAM}&limit=100")["backfills"]:
        if not open_backfill["completed_at"]:
            airflow.request("PUT", f"/api/v2/backfills/{open_backfill['id']}/cancel")

    page.goto(f"{airflow.base_url}/dags/{PROGRAM}", wait_until="domcontentloaded")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog").first
    dialog.get_by_text("Backfill", exact=True).first.click()
    expect(dialog.get_by_text(f"Run Backfill - {PROGRAM}")).to_be_visible()
    pick_date(page, dialog, 0, "2026/11/02", "00:00")
    pick_date(page, dialog, 1, "2026/11/16", "06:00")
    # The dialog offers to unpause the program; the test keeps it paused.
    unpause = dialog.get_by_role("checkbox", name=f"Unpause {PROGRAM} on trigger")
    if unpause.count() and unpause.is_checked():
        dialog.get_by_text(f"Unpause {PROGRAM} on trigger").click()
        expect(unpause).not_to_be_checked()
    dialog.get_by_text("Missing and Errored Runs").click()
    dialog.locator("input[name=max_active_runs]").fill("2")
    # The dialog counts the runs it would create before it lets the user start them.
    expect(dialog.get_by_text("3 runs will be triggered")).to_be_visible()
    page.screenshot(path=SCREENSHOT, full_page=True)
    dialog.get_by_role("button", name="Run Backfill").click()
    expect(page.get_by_text(f"Run Backfill - {PROGRAM}")).to_be_hidden()

    backfills = airflow.request("GET", f"/api/v2/backfills?dag_id={PROGRAM}&limit=100")["backfills"]
    [backfill] = [b for b in backfills if not b["completed_at"]]
    try:
        assert (backfill["reprocess_behavior"], backfill["max_active_runs"]) == ("failed", 2)
        runs = airflow.request("GET", f"/api/v2/dags/{PROGRAM}/dagRuns?limit=100&run_type=backfill")["dag_runs"]
        assert sorted(r["logical_date"][:10] for r in runs) == ["2026-11-02", "2026-11-09", "2026-11-16"]
        assert {r["state"] for r in runs} == {"queued"}  # the program is paused: nothing runs
        # One run per week: each run's data interval is its week (the partition it will train on).
        spans = sorted((r["data_interval_start"][:16], r["data_interval_end"][:16]) for r in runs)
        assert spans == [
            ("2026-11-02T06:00", "2026-11-09T06:00"),
            ("2026-11-09T06:00", "2026-11-16T06:00"),
            ("2026-11-16T06:00", "2026-11-23T06:00"),
        ]
    finally:
        airflow.request("PUT", f"/api/v2/backfills/{backfill['id']}/cancel")
