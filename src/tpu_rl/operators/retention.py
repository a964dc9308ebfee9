"""The run's ``prune_checkpoints``: after ``publish_export``, the run's training checkpoints that its verified export
superseded are removed, as ``keep_checkpoints`` says (the decision: :mod:`tpu_rl.retention`).

Its Cloud Storage calls are in :mod:`tpu_rl.hooks.gcs`, imported where they are used: the DAG file imports this
module at parse time.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from tpu_rl.contract import FINAL_STEP, PUBLISHED_MODEL
from tpu_rl.maxtext import export_files_beyond_the_converters
from tpu_rl.output_checks import HfExport
from tpu_rl.retention import KEEP_ALL, RetentionPlan, checkpoint_folders, plan_retention, removal_order
from tpu_rl.run_scope import RunScope, RunScoped

GB = 1e9


class PruneCheckpointsOperator(RunScoped, BaseOperator):
    """Removes the run's checkpoint folders its verified export superseded (``keep_checkpoints``).

    The export counts as verified when ``publish_export`` of this run published it where the run's layout puts it
    and the published folder passes the export's check again now (config, tokenizer, every shard's header, the
    model's ``generation_config.json``). Only folders under the run's own ``checkpoints/`` are listed, so no other
    run's are touched.

    XCom return value: ``{"removed": [folders], "kept": [folders], "freed_gb": float}``.
    """

    ui_color = "#eeeeee"

    def execute(self, context: Any) -> dict[str, Any]:
        scope = self.scope
        if scope.config.keep_checkpoints == KEEP_ALL:
            self.log.info("keep_checkpoints is 'all': the run's checkpoints stay under %s", self._checkpoints_uri)
            return {"removed": [], "kept": [], "freed_gb": 0.0}
        sizes = scope.bucket.object_sizes(scope.layout.checkpoints_prefix)
        steps, set_aside = checkpoint_folders(sizes)
        plan = plan_retention(
            scope.config.keep_checkpoints,
            exported_step=_as_step(context["ti"].xcom_pull(task_ids=FINAL_STEP.task, key=FINAL_STEP.key)),
            export_verified=self._export_verified(context, scope),
            steps=steps,
            set_aside=set_aside,
        )
        return self._apply(plan, sizes)

    @property
    def _checkpoints_uri(self) -> str:
        return self.scope.layout.uri(self.scope.layout.checkpoints_prefix)

    def _export_verified(self, context: Any, scope: RunScope) -> bool:
        """This run published its export to its export folder, and that folder is whole now."""
        layout = scope.layout
        published = context["ti"].xcom_pull(task_ids=PUBLISHED_MODEL.task, key=PUBLISHED_MODEL.key)
        if published != layout.uri(layout.export_prefix):
            self.log.warning(
                "publish_export of this run reports %r, not %s", published, layout.uri(layout.export_prefix)
            )
            return False
        check = HfExport(prefix=layout.export_prefix, also_required=export_files_beyond_the_converters(scope.config))
        verdict, _ = scope.storage_reads.run_now(scope.config.gcs_bucket, check)
        if not verdict.complete:
            self.log.warning("The published export %s is not whole: %s", published, verdict.describe())
        return verdict.complete

    def _apply(self, plan: RetentionPlan, sizes: dict[str, int]) -> dict[str, Any]:
        """Removes the plan's folders, each one's commit marker first (:func:`tpu_rl.retention.removal_order`)."""
        prefix, freed = self.scope.layout.checkpoints_prefix, 0
        for kept in plan.keep:
            self.log.info("Kept %s%s: %s", self._checkpoints_uri, kept.folder, kept.why)
        for removal in plan.remove:
            names = [n[len(removal.folder) :] for n in sizes if n.startswith(removal.folder)]
            self.scope.bucket.delete_objects(prefix + name for name in removal_order(removal.folder, names))
            size = sum(sizes[removal.folder + n] for n in names)
            freed += size
            self.log.info(
                "Removed %s%s (%d objects, %.1f GB): %s",
                self._checkpoints_uri,
                removal.folder,
                len(names),
                size / GB,
                removal.why,
            )
        self.log.info("keep_checkpoints %r: %.1f GB removed", self.scope.config.keep_checkpoints, freed / GB)
        return {
            "removed": [r.folder for r in plan.remove],
            "kept": [k.folder for k in plan.keep],
            "freed_gb": round(freed / GB, 3),
        }


def _as_step(value: Any) -> int | None:
    """``verify_training``'s step (an int; a string from an older XCom), None when it is missing."""
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
