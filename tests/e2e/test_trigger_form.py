"""The DAG's trigger form in a real browser: headless Chromium on the local Airflow's React UI.

The form is the one a user opens with the Trigger button of the DAG's page: its sections and fields come
from tpu_rl.params (titles, descriptions and the tutorial's defaults), its checks from the Params' JSON
schema, in the browser and again in the api-server.

A run that the form starts is deleted through the REST API as soon as it is seen (marked failed first
if it started): the test checks only that the run was created with the conf typed. Its conf would also
fail the DAG's first task (zone outside the region), should a task start in between, so nothing is ever
created in a cloud.
"""

from __future__ import annotations

import time
import uuid

import pytest
from playwright.sync_api import Locator, Page, expect

from scripts.local_airflow import AirflowApiError
from tpu_rl.config import field_specs
from tpu_rl.run import DAG_ID

#: The form's sections, in the order the user sees them.
SECTIONS = ("Cloud", "Cluster", "TPU slice", "Model", "Training", "Evaluation and cost", "Advanced")

pytestmark = pytest.mark.e2e
# The UI renders slowly on a busy 2-core machine: wait for what should show, up to 30 s.
expect.set_options(timeout=30_000)

SCREENSHOT = "/tmp/trigger-form.png"
#: The fields the form asks for (no default).
REQUIRED = {
    "project": "e2e-form-test",
    "region": "us-east5",
    "zone": "europe-west4-a",  # not in us-east5: validate_config would refuse the run at once
    "gcs_bucket": "e2e-form-bucket",
    "cluster_name": "e2e-form",
}
SPECS = {spec.name: spec for spec in field_specs()}


@pytest.fixture(scope="module")
def airflow(airflow_stack):
    airflow_stack.wait_for_healthy_dag(DAG_ID)
    return airflow_stack


class TriggerForm:
    """The Trigger dialog of the DAG's page, driven as a user would."""

    def __init__(self, page: Page, base_url: str):
        self.page = page
        page.goto(f"{base_url}/dags/{DAG_ID}", wait_until="domcontentloaded")
        page.get_by_role("button", name="Trigger").first.click()
        self.dialog = page.get_by_role("dialog")
        expect(self.dialog.get_by_text(f"Trigger Dag - {DAG_ID}")).to_be_visible()
        self.submit = self.dialog.get_by_role("button", name="Trigger")
        # A paused DAG's dialog offers to unpause it; a test must not change that.
        unpause = self.dialog.get_by_role("checkbox", name=f"Unpause {DAG_ID} on trigger")
        if unpause.count() and unpause.is_checked():
            self.dialog.get_by_text(f"Unpause {DAG_ID} on trigger").click()
            expect(unpause).not_to_be_checked()

    def section_names(self) -> list[str]:
        triggers = self.dialog.locator("[data-scope=accordion][data-part=item-trigger]")
        expect(triggers.first).to_be_visible()
        return [text.strip() for text in triggers.all_inner_texts()]

    def open_section(self, name: str) -> Locator:
        """Opens a section (one is open at a time) and returns its content."""
        trigger = self.dialog.get_by_role("button", name=name, exact=True)
        if trigger.get_attribute("aria-expanded") != "true":
            trigger.click()
        expect(trigger).to_have_attribute("aria-expanded", "true")
        content = self.page.locator(f"[id='{trigger.get_attribute('aria-controls')}']")
        expect(content).to_be_visible()
        return content

    def field(self, name: str) -> Locator:
        """The input of a param, in its section (opened)."""
        spec = SPECS[name]
        content = self.open_section(spec.metadata["section"])
        if spec.type in ("int", "float"):
            return content.get_by_role("spinbutton", name=spec.metadata["title"], exact=True)
        return content.locator(f"#element_{name}")

    def fill(self, values: dict[str, object]) -> None:
        for name, value in values.items():
            box = self.field(name)
            box.fill(str(value))
            box.blur()

    def set_run_id(self, run_id: str) -> None:
        self.open_section("Advanced Options").locator("input[name=dagRunId]").fill(run_id)


ACTIVE = {"running", "queued", "scheduled", "deferred", "restarting", "up_for_reschedule", "up_for_retry"}


def _discard_run(client, run_id: str, timeout: float = 90) -> None:
    """Deletes the run: at once while it is queued (a paused DAG's run never starts); a running one is
    marked failed first (nothing more is scheduled) and deleted once its tasks are done. A task that was
    running when the run was marked failed may report back and set the run running again: mark it failed
    again, until it stays done."""
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = client.run(DAG_ID, run_id)["state"]
            if state == "running":
                client.request("PATCH", path, {"state": "failed"})
            elif not {ti["state"] for ti in client.task_instances(DAG_ID, run_id).values()} & ACTIVE:
                client.request("DELETE", path)
                return
        except AirflowApiError as error:
            if error.status == 404:
                return
            if error.status != 409 or time.monotonic() > deadline:  # 409: running again, cannot delete
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {state} after {timeout:.0f} s")
        time.sleep(1)


def test_form_shows_sections_titles_descriptions_and_tutorial_defaults(airflow, page):
    form = TriggerForm(page, airflow.base_url)
    # The param sections in their order, then Airflow's own "Advanced Options" (run id, note, JSON).
    assert form.section_names() == [*SECTIONS, "Advanced Options"]
    form.open_section("Cloud")
    page.screenshot(path=SCREENSHOT, full_page=True)

    for section in SECTIONS:
        text = form.open_section(section).inner_text()
        for spec in SPECS.values():
            if spec.metadata["section"] == section:
                assert spec.metadata["title"] in text, f"{spec.name}: title missing in section {section}"
                assert spec.metadata["description"] in text, f"{spec.name}: description missing in {section}"
        page.screenshot(path=SCREENSHOT.replace(".png", f"-{section.replace(' ', '-').lower()}.png"), full_page=True)

    # The tutorial's values, as the form shows them.
    expect(form.field("tpu_type")).to_have_value("v6e-64")
    expect(form.field("topology")).to_have_value("8x8")
    expect(form.field("model_name")).to_have_value("qwen3-30b-a3b")
    expect(form.field("num_batches")).to_have_value("50")
    expect(form.field("checkpoint_period")).to_have_value("50")
    expect(form.field("run_name")).to_have_value("rl")
    expect(form.open_section("Cluster").locator("input[name=element_cluster_mode]")).to_have_value("create")
    expect(form.open_section("TPU slice").locator("input[name=element_tpu_pool_mode]")).to_have_value("per_run")
    for name in REQUIRED:
        expect(form.field(name)).to_have_value("")


def test_form_refuses_invalid_values(airflow, page):
    form = TriggerForm(page, airflow.base_url)
    # Required fields empty: each says so, and the run cannot be triggered.
    cloud = form.open_section("Cloud")
    expect(cloud.get_by_text("This field is required")).to_have_count(4)
    expect(form.submit).to_be_disabled()

    form.fill(REQUIRED)
    expect(form.submit).to_be_enabled()

    batches = form.field("num_batches")
    # Empty integer field: refused with a message.
    batches.fill("")
    expect(form.open_section("Training").get_by_text("This field is required")).to_be_visible()
    expect(form.submit).to_be_disabled()
    # Below the minimum of 1: the form sets it back to the minimum.
    batches.fill("0")
    batches.blur()
    expect(batches).to_have_value("1")
    expect(form.submit).to_be_enabled()
    # Letters in an integer field are not taken.
    batches.press_sequentially("x")
    expect(batches).to_have_value("1")

    # What only the schema on the server checks: the form shows the api-server's refusal, no run starts.
    run_id = f"e2e_form_refused_{uuid.uuid4().hex[:8]}"
    form.set_run_id(run_id)
    for name, value, message in [
        ("run_name", "bad name!", "Invalid input for param run_name"),
        ("num_batches", "2.5", "Invalid input for param num_batches"),
    ]:
        default = str(SPECS[name].default)
        form.fill({name: value})
        with page.expect_response(lambda r: r.url.endswith("/dagRuns") and r.request.method == "POST") as posted:
            # The keyboard: the first refusal's toast may lie over the button (and stays while hovered).
            form.submit.press("Enter")
        assert posted.value.status == 400, posted.value.text()
        expect(form.dialog.get_by_text(message)).to_be_visible()
        form.fill({name: default})
    try:
        airflow.client.run(DAG_ID, run_id)
    except AirflowApiError as error:
        assert error.status == 404
    else:
        _discard_run(airflow.client, run_id)
        pytest.fail(f"the api-server created run {run_id} from an invalid form")


def test_required_fields_alone_enable_trigger(airflow, page):
    form = TriggerForm(page, airflow.base_url)
    form.fill(REQUIRED)
    expect(form.submit).to_be_enabled(timeout=5_000)


def test_valid_trigger_starts_a_run_with_the_typed_conf(airflow, page):
    form = TriggerForm(page, airflow.base_url)
    typed = REQUIRED | {"num_batches": 7, "run_name": "e2e-form"}
    form.fill(typed)
    run_id = f"e2e_form_{uuid.uuid4().hex[:8]}"
    form.set_run_id(run_id)
    expect(form.submit).to_be_enabled()
    try:
        with page.expect_response(lambda r: r.url.endswith("/dagRuns") and r.request.method == "POST") as posted:
            form.submit.click()
        assert posted.value.status == 200, posted.value.text()
        expect(page.get_by_text("Dag Run Triggered").first).to_be_visible()

        run = airflow.client.run(DAG_ID, run_id)
        assert run["run_type"] == "manual"
        conf = run["conf"]
        assert {name: conf.get(name) for name in typed} == typed
        # The rest of the conf is the tutorial's defaults, untouched.
        assert conf["topology"] == "8x8" and conf["tpu_type"] == "v6e-64" and conf["model_name"] == "qwen3-30b-a3b"
    finally:
        _discard_run(airflow.client, run_id)
    with pytest.raises(AirflowApiError) as gone:
        airflow.client.run(DAG_ID, run_id)
    assert gone.value.status == 404
