"""The page of one run of the pipeline in the Airflow UI: its reward, loss and KL curves over steps, its
progress and ETA while it trains, the evaluation before and after, the TPU chip-hours and cost, and where
its checkpoints and exported model are.

Pure: the run view's app (``tpu_rl.run_view_app``) reads the run's params, state and XComs from Airflow
and the event files from the bucket; this module turns them into one HTML page. The page holds no script
and loads nothing from elsewhere (the curves are inline SVG), and it shows only what the run's task logs
and XComs already show: a few of the run's settings by name (never its connections' contents), the
figures, and the bucket's paths. Each curve's points are also in its ``data-step``/``data-value``
attributes and in a table, exactly as read from the event files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote

from tpu_rl import __version__
from tpu_rl import training_metrics as tm
from tpu_rl.config import RunConfig
from tpu_rl.contract import (
    CAPACITY_CANDIDATES,
    FINAL_STEP,
    PUBLISHED_MODEL,
    SLICE_TIMES,
    TRAINING_CAPACITY,
    TRAINING_EVALUATION,
    TRAINING_JOBSET,
    TRAINING_PREEMPTIONS,
    Pull,
)
from tpu_rl.layout import GcsLayout
from tpu_rl.preemption import describe_accounting
from tpu_rl.timestamps import posix_time

#: The curves shown, in order, with their titles.
CURVES = {tm.REWARD_TAG: "Reward (batch mean)", tm.LOSS_TAG: "Policy loss", tm.KL_TAG: "KL to the reference model"}
#: The run's settings the page shows: what it trains, on what, how long, at what price.
SHOWN_SETTINGS = (
    "model_name",
    "tpu_type",
    "topology",
    "cluster_nodepool_count",
    "capacity_type",
    "num_batches",
    "batch_size",
    "gcs_bucket",
    "tpu_price_per_chip_hour",
)
#: Run states in which the training may still move: the page shows the progress and reloads itself.
ACTIVE_STATES = ("queued", "running")
#: Seconds between two reloads of an active run's page (the trainer flushes its curves every few minutes).
RELOAD_SECONDS = 60
STORAGE_CONSOLE = "https://console.cloud.google.com/storage/browser"

_FIELDS = frozenset(f.name for f in dataclasses.fields(RunConfig))


def _pulled(pull: Pull) -> Any:
    return dataclasses.field(default=None, metadata={"pull": pull})


@dataclass(frozen=True)
class RunXComs:
    """What the run's tasks pushed that the page shows, each None while its task has not pushed it: ``train_rl``'s
    evaluation, preemptions and training JobSet (its ``created``: when the current attempt was submitted, so that
    an earlier attempt's event file gives no ETA), ``delete_tpu_pools``'s slices, ``verify_training``'s final step
    and ``publish_export``'s model URI. Each field names the XCom it is read from."""

    evaluation: Mapping[str, Any] | None = _pulled(TRAINING_EVALUATION)
    preemptions: Mapping[str, Any] | None = _pulled(TRAINING_PREEMPTIONS)
    training_jobset: Mapping[str, Any] | None = _pulled(TRAINING_JOBSET)
    slices: Sequence[Mapping[str, str]] | None = _pulled(SLICE_TIMES)
    capacity: Mapping[str, Any] | None = _pulled(CAPACITY_CANDIDATES)
    training_capacity: Mapping[str, Any] | None = _pulled(TRAINING_CAPACITY)
    final_step: int | None = _pulled(FINAL_STEP)
    model_uri: str | None = _pulled(PUBLISHED_MODEL)

    @staticmethod
    def pulls() -> dict[str, Pull]:
        """The XCom each field is read from, by field name."""
        return {f.name: f.metadata["pull"] for f in dataclasses.fields(RunXComs)}

    @classmethod
    def of(cls, stored: Mapping[Pull, Any]) -> RunXComs:
        """The bundle from the run's XComs as stored (a pull missing: its field None)."""
        values = {name: stored.get(pull) for name, pull in cls.pulls().items()}
        if values["final_step"] is not None:
            values["final_step"] = int(values["final_step"])
        return cls(**values)


def is_pipeline_params(params: Mapping[str, Any]) -> bool:
    """Whether a DAG's params are the pipeline's (its own DAG or a program's): the view is offered on every
    DAG's runs, and only these have curves."""
    return "gcs_bucket" in params and set(params) <= _FIELDS


def storage_console_url(bucket: str, prefix: str, project: str) -> str:
    """The Cloud Console's page of a bucket folder."""
    return f"{STORAGE_CONSOLE}/{quote(bucket)}/{quote(prefix)}?project={quote(project)}"


@dataclass(frozen=True)
class Link:
    label: str
    uri: str | None
    console_url: str | None
    note: str = ""


@dataclass(frozen=True)
class RunPage:
    """What the page shows of one run."""

    dag_id: str
    run_id: str
    state: str
    train_steps: int
    settings: list[tuple[str, str]]
    curves: tm.Scalars
    progress: str | None
    evaluation: tm.Evaluation | None
    evaluation_note: str
    cost: Mapping[str, Any] | None
    cost_note: str
    final_step: int | None
    preemptions: str
    links: list[Link]
    #: With several capacity candidates: which were tried, why each was left, which one the slices came from.
    capacity: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def run_page(
    *,
    dag_id: str,
    run_id: str,
    state: str,
    config: RunConfig,
    layout: GcsLayout,
    files: Mapping[str, tm.Scalars],
    xcoms: RunXComs,
    now: float,
) -> RunPage:
    """The page of a run from its config and layout, its event files' scalars (by file name) and its XComs."""
    scores = tm.Evaluation.from_dict(xcoms.evaluation)
    attempt_started = posix_time((xcoms.training_jobset or {}).get("created"))
    slices = xcoms.slices
    cost = tm.tpu_cost(slices, config) if slices is not None and config.tpu_pools_per_run else None
    shown = [(name, str(getattr(config, name))) for name in SHOWN_SETTINGS]
    shown.insert(SHOWN_SETTINGS.index("batch_size") + 1, ("train_steps", str(config.train_steps)))
    return RunPage(
        dag_id=dag_id,
        run_id=run_id,
        state=state,
        train_steps=config.train_steps,
        settings=shown,
        curves=tm.merge_scalars(files),
        progress=(
            tm.attempt_progress(files, config.train_steps, now, attempt_started) if state in ACTIVE_STATES else None
        ),
        evaluation=scores if config.evaluation_batches else None,
        evaluation_note=tm.describe_evaluation(scores, config),
        cost=cost,
        cost_note=tm.describe_cost(cost, config),
        final_step=xcoms.final_step,
        preemptions=describe_accounting(dict(xcoms.preemptions) if xcoms.preemptions else None),
        capacity=tuple((xcoms.training_capacity or xcoms.capacity or {}).get("lines") or ()),
        links=_output_links(config, layout, xcoms.model_uri),
    )


def _output_links(config: RunConfig, layout: GcsLayout, model_uri: str | None) -> list[Link]:
    """The run's outputs in Cloud Storage: the checkpoints, the event files and, once published, the model."""
    checkpoints = layout.actor_checkpoints_prefix
    links = [
        Link("Checkpoints", layout.uri(checkpoints), storage_console_url(layout.bucket, checkpoints, config.project)),
        Link(
            "TensorBoard event files",
            layout.uri(layout.tensorboard_prefix),
            storage_console_url(layout.bucket, layout.tensorboard_prefix, config.project),
        ),
    ]
    if model_uri:
        bucket_path = model_uri.split("/", 3)[3]
        links.append(Link("Exported model", model_uri, storage_console_url(layout.bucket, bucket_path, config.project)))
    else:
        links.append(Link("Exported model", None, None, "not published"))
    return links


# --- HTML -------------------------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1rem 1.5rem; color: #1a202c; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin-top: 1.5rem; }
table { border-collapse: collapse; } td, th { padding: .15rem .6rem; text-align: left; }
th { font-weight: 600; } .num { text-align: right; font-variant-numeric: tabular-nums; }
.curves { display: flex; flex-wrap: wrap; gap: 1.5rem; }
figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: .3rem; }
svg.curve { background: #f7fafc; border: 1px solid #e2e8f0; }
svg.curve polyline { fill: none; stroke: #3182ce; stroke-width: 2; }
svg.curve circle { fill: #3182ce; } svg.curve text { font-size: 11px; fill: #4a5568; }
details { margin-top: .4rem; } .note { color: #4a5568; } code { font-size: .9em; }
"""
_WIDTH, _HEIGHT, _MARGIN = 460, 240, 48


def render(page: RunPage) -> str:
    """The whole page, escaped; an active run's page reloads itself every :data:`RELOAD_SECONDS`."""
    reload = f'<meta http-equiv="refresh" content="{RELOAD_SECONDS}">' if page.active else ""
    sections = [
        f"<h1>Training of <code>{escape(page.dag_id)}</code> / <code>{escape(page.run_id)}</code></h1>",
        f'<p>Run state: <strong id="run-state">{escape(page.state)}</strong>; {_step_line(page)}</p>',
        _progress(page),
        "<h2>Curves</h2>",
        _curves(page),
        "<h2>Evaluation</h2>",
        _evaluation(page),
        "<h2>TPU cost</h2>",
        _cost(page),
        f'<p>Preemptions: <span id="preemptions">{escape(page.preemptions)}</span></p>',
        _capacity(page),
        "<h2>Outputs</h2>",
        _links(page),
        "<h2>Settings</h2>",
        "<table>"
        + "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in page.settings)
        + "</table>",
        f'<p class="note" id="version">tpu-rl {escape(__version__)}</p>',
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        + reload
        + f"<title>Training: {escape(page.run_id)}</title><style>{_STYLE}</style></head><body>"
        + "\n".join(s for s in sections if s)
        + "</body></html>"
    )


def render_message(title: str, message: str) -> str:
    """A page that says why there is nothing to show (not a run of the pipeline, a run whose params fail)."""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f'<p class="note" id="message">{escape(message)}</p></body></html>'
    )


def _step_line(page: RunPage) -> str:
    if page.final_step is not None:
        return f'final step <strong id="final-step">{page.final_step}</strong>/{page.train_steps}'
    return f"final step not resolved yet (of {page.train_steps} planned)"


def _progress(page: RunPage) -> str:
    if not page.active:
        return ""
    line = page.progress or "the trainer has written no event file yet"
    return (
        f'<p>Training progress: <strong id="progress">{escape(line)}</strong> '
        f'<span class="note">(this page reloads every {RELOAD_SECONDS} s)</span></p>'
    )


def _curves(page: RunPage) -> str:
    figures = [_curve(tag, title, page.curves[tag]) for tag, title in CURVES.items() if page.curves.get(tag)]
    if not figures:
        return '<p class="note" id="no-curves">No curves yet: the trainer has written no event file.</p>'
    return '<div class="curves">' + "".join(figures) + "</div>"


def _curve(tag: str, title: str, points: Sequence[tuple[int, float]]) -> str:
    """One curve as an SVG line with a marker per point (each point's step and value in data attributes),
    axis bounds as text, and the points again in a folded table."""
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    low, high = min(values), max(values)
    first, last = steps[0], steps[-1]

    def x(step: int) -> float:
        return _MARGIN + (step - first) / ((last - first) or 1) * (_WIDTH - 2 * _MARGIN)

    def y(value: float) -> float:
        return _HEIGHT - _MARGIN + (-(value - low) / ((high - low) or 1)) * (_HEIGHT - 2 * _MARGIN)

    line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
    marks = "".join(
        f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="2.5" data-step="{s}" data-value="{v!r}">'
        f"<title>step {s}: {v:.4g}</title></circle>"
        for s, v in points
    )
    axes = (
        f'<text x="{_MARGIN}" y="{_HEIGHT - _MARGIN + 16}">step {first}</text>'
        f'<text x="{_WIDTH - _MARGIN}" y="{_HEIGHT - _MARGIN + 16}" text-anchor="end">step {last}</text>'
        f'<text x="{_MARGIN - 4}" y="{_MARGIN}" text-anchor="end">{high:.3g}</text>'
        f'<text x="{_MARGIN - 4}" y="{_HEIGHT - _MARGIN}" text-anchor="end">{low:.3g}</text>'
    )
    rows = "".join(f'<tr><td class="num">{s}</td><td class="num">{v!r}</td></tr>' for s, v in points)
    return (
        f'<figure data-tag="{escape(tag)}"><figcaption>{escape(title)} <code>{escape(tag)}</code></figcaption>'
        f'<svg class="curve" role="img" aria-label="{escape(title)}" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}"><polyline points="{line}"/>{marks}{axes}</svg>'
        f'<details><summary>{len(points)} points</summary><table class="points"><tr><th>step</th><th>value</th>'
        f"</tr>{rows}</table></details></figure>"
    )


def _evaluation(page: RunPage) -> str:
    evaluation = page.evaluation
    if evaluation is None:
        return f'<p class="note" id="evaluation-note">{escape(page.evaluation_note)}</p>'
    header = (
        "<tr><th></th><th>accuracy</th><th>correct</th><th>partial accuracy</th><th>format accuracy</th>"
        "<th>mean reward</th></tr>"
    )
    rows = []
    for when, score in (("before", evaluation.before), ("after", evaluation.after)):
        if score is None:
            rows.append(f'<tr id="evaluation-{when}"><th>{when} training</th><td colspan="5">not logged</td></tr>')
            continue
        rows.append(
            f'<tr id="evaluation-{when}"><th>{when} training</th>'
            f'<td class="num">{score.accuracy:.1f}%</td><td class="num">{score.correct:g}/{score.total}</td>'
            f'<td class="num">{score.partial_accuracy:.1f}%</td>'
            f'<td class="num">{score.format_accuracy:.1f}%</td>'
            f'<td class="num">{score.mean_reward:.4f}</td></tr>'
        )
    return f'<table id="evaluation">{header}{"".join(rows)}</table>'


def _cost(page: RunPage) -> str:
    if page.cost is None:
        return f'<p class="note" id="cost-note">{escape(page.cost_note)}</p>'
    cost = page.cost
    return (
        f'<p id="cost-note">{escape(page.cost_note)}</p><table><tr><th>chip-hours</th>'
        f'<td class="num" id="chip-hours">{cost["chip_hours"]:.3f}</td></tr><tr><th>cost (USD)</th>'
        f'<td class="num" id="cost-usd">{cost["cost_usd"]:.2f}</td></tr><tr><th>price per chip-hour (USD)</th>'
        f'<td class="num">{cost["price_per_chip_hour"]:.2f}</td></tr></table>'
        + _cost_by_candidate(cost.get("by_candidate") or ())
    )


def _cost_by_candidate(costs: Sequence[Mapping[str, Any]]) -> str:
    """The TPU time and cost on each capacity candidate the slices came from, at its price."""
    if not costs:
        return ""
    rows = "".join(
        f"<tr><th>candidate {c['candidate']} ({escape(c['describe'])})</th>"
        f'<td class="num">{c["chip_hours"]:.3f}</td><td class="num">{c["price_per_chip_hour"]:.2f}</td>'
        f'<td class="num">{c["cost_usd"]:.2f}</td></tr>'
        for c in costs
    )
    header = (
        "<tr><th>capacity candidate</th><th>chip-hours</th><th>price per chip-hour (USD)</th><th>cost (USD)</th></tr>"
    )
    return f'<table id="cost-by-candidate">{header}{rows}</table>'


def _capacity(page: RunPage) -> str:
    """The capacity candidates the run tried (nothing with one candidate)."""
    if not page.capacity:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in page.capacity)
    return f'<p>Capacity candidates:</p><ul id="capacity">{items}</ul>'


def _links(page: RunPage) -> str:
    rows = []
    for link in page.links:
        if link.uri is None:
            rows.append(f'<tr><th>{escape(link.label)}</th><td class="note">{escape(link.note)}</td></tr>')
            continue
        console = (
            f' (<a href="{escape(link.console_url)}" target="_blank" rel="noopener noreferrer">Cloud Console</a>)'
            if link.console_url
            else ""
        )
        rows.append(f"<tr><th>{escape(link.label)}</th><td><code>{escape(link.uri)}</code>{console}</td></tr>")
    return '<table id="outputs">' + "".join(rows) + "</table>"
