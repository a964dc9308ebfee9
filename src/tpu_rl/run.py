"""Identity of one DAG run: the names that every stage of it derives, and its data interval.

Everything here is a pure function of (dag_id, run_id), so a retried or cleared task finds what an earlier
try of the same run created, and two runs never share outputs (its Cloud Storage paths: ``tpu_rl.layout``). A run
of a recurring program (scheduled or backfilled) is keyed by its data interval instead of its run id:
whichever run trains an interval finds that interval's checkpoints, and no other interval's.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tpu_rl.environment import label_value

# The label keys that tie cloud and Kubernetes objects to the run that created them; imported from here too.
from tpu_rl.vocabulary import (  # noqa: F401 (GKE_LABEL_RUN_KEY)
    ANNOTATION_DAG_ID,
    ANNOTATION_ENVIRONMENT,
    ANNOTATION_RUN_ID,
    GKE_LABEL_RUN_KEY,
    LABEL_DAG_ID,
    LABEL_ENVIRONMENT,
    LABEL_RUN_KEY,
    LABEL_VALUE_MAX,
)

#: The DAG's id; the plan derives the same names as a run of it.
DAG_ID = "maxtext_rl_tpu"
#: The reaper of what dead runs left (dags/maxtext_rl_tpu_reaper.py).
REAPER_DAG_ID = "maxtext_rl_tpu_reaper"

#: Workload stages and the short word each contributes to its JobSet name.
STAGE_WORDS = {"hf_to_maxtext": "hf2mt", "train": "train", "maxtext_to_hf": "mt2hf"}
#: Hex digits of a run key.
RUN_KEY_LENGTH = 8


def slug(text: str, limit: int | None = None) -> str:
    """Lowercase letters, digits and single dashes, at most ``limit`` characters, beginning and ending with a letter
    or digit (cut after the limit, a dash would end it: Kubernetes refuses such a label value): safe in object
    names, label values and GCS paths."""
    cleaned = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")
    return cleaned[:limit].rstrip("-") if limit is not None else cleaned


@dataclass(frozen=True)
class RunIdentity:
    """A DAG run; ``interval``: the start of its data interval (ISO 8601) when its outputs are the interval's;
    ``environment``: the Airflow environment it runs in (``tpu_rl.environment``), "" when unnamed or not marked.
    The environment is in the run's marks, not in its key: a run in flight when its environment got a name keeps
    finding what it made."""

    dag_id: str
    run_id: str
    interval: str | None = None
    environment: str = ""

    @property
    def key(self) -> str:
        """Eight hex digits, stable for the run: short enough for every Kubernetes and GKE name."""
        name = f"interval {self.interval}" if self.interval else self.run_id
        return hashlib.sha256(f"{self.dag_id}\n{name}".encode()).hexdigest()[:RUN_KEY_LENGTH]

    @property
    def slug(self) -> str:
        """Readable and unique folder name for the run's outputs."""
        name = f"interval-{self.interval[:10]}" if self.interval else self.run_id
        return f"{slug(name, 60)}-{self.key}"

    def labels(self) -> dict[str, str]:
        labels = {LABEL_RUN_KEY: self.key, LABEL_DAG_ID: slug(self.dag_id, LABEL_VALUE_MAX)}
        return labels | ({LABEL_ENVIRONMENT: label_value(self.environment)} if self.environment else {})

    def annotations(self) -> dict[str, str]:
        """The run's full identity, which labels (slugs) cannot hold: the reaper asks Airflow about it (when the
        environment is its own)."""
        annotations = {ANNOTATION_DAG_ID: self.dag_id, ANNOTATION_RUN_ID: self.run_id}
        return annotations | ({ANNOTATION_ENVIRONMENT: self.environment} if self.environment else {})

    def jobset_name(self, prefix: str, stage: str) -> str:
        return f"{prefix}-{STAGE_WORDS[stage]}-{self.key}"

    @staticmethod
    def longest_jobset_name(prefix: str) -> str:
        """The longest name :meth:`jobset_name` gives any run and stage with this prefix."""
        return max((f"{prefix}-{word}-{'0' * RUN_KEY_LENGTH}" for word in STAGE_WORDS.values()), key=len)

    def secret_name(self) -> str:
        return f"tpu-rl-hf-token-{self.key}"

    def tpu_pool_name(self, slice_index: int) -> str:
        return f"tpu-{self.key}-{slice_index}"


#: The fields an ``interval_data`` template may use (see :meth:`DataInterval.template_values`).
INTERVAL_FIELDS = ("ds", "ds_nodash", "start", "end", "index", "first", "stop")


@dataclass(frozen=True)
class DataInterval:
    """The data interval a scheduled or backfilled run trains on; ``index``: intervals since the program's
    start date (0 for the first)."""

    start: datetime
    end: datetime
    index: int

    def template_values(self, examples_per_interval: int) -> dict[str, Any]:
        return {
            "ds": self.start.strftime("%Y-%m-%d"),
            "ds_nodash": self.start.strftime("%Y%m%d"),
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "index": self.index,
            "first": self.index * examples_per_interval,
            "stop": (self.index + 1) * examples_per_interval,
        }
