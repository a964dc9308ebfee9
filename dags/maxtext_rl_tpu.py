"""
### MaxText RL post-training on a GKE TPU slice

The tutorial *Run multi-host RL training for Qwen3-30b-a3b on TPU v6e* as one pipeline:

| stage | tutorial step |
|---|---|
| `validate_config` | the environment variables (checked: topology, parallelism, names, ...) |
| `ensure_bucket` | `gcloud storage buckets create` |
| `create_cluster`, `wait_for_cluster` | `gcluster deploy gke-tpu-v6e-advanced.yaml` (system and CPU pools) |
| `ensure_jobset`, `hf_token_secret` | what the blueprint installs; `HF_TOKEN` as a Kubernetes Secret |
| `hf_to_maxtext`, `verify_converted` | `gcluster job submit --name qwen-hf-to-mt` (skipped when already converted; one run at a time converts) |
| `check_training_record`, `wait_for_tpu_capacity`, `create_tpu_pools`, `train_rl`, `delete_tpu_pools` | `gcluster job submit --pathways` on the 8x8 slice (with a `capacity_group`, runs queue for its slices) |
| `verify_training` | `gcloud storage ls .../checkpoints/actor/` (final step resolved, not assumed) |
| `quality_gate` | (a trained model that fails `min_post_accuracy` or `require_no_regression` is not exported) |
| `maxtext_to_hf`, `verify_export`, `publish_export` | `gcluster job submit --name qwen-mt-to-hf` |
| `delete_cluster` | `gcluster destroy` (only a cluster this run created; always runs) |
| `pipeline_done` | the run's summary: final step, evaluation before and after, TPU chip-hours and cost, the model |

Trigger it from the form: every tutorial value is a default. `python -m tpu_rl.plan --conf conf.json`
prints what a run would submit, without touching the cloud.
"""

from __future__ import annotations

from airflow.sdk import DAG  # also what Airflow's safe mode looks for before it parses a file

from tpu_rl.pipeline import build_pipeline, exported_model_asset
from tpu_rl.run import DAG_ID

dag: DAG = build_pipeline(DAG_ID, doc_md=__doc__)

#: Downstream DAGs (serving, evaluation) schedule on this; each event's extra has uri, final_step, source_run,
#: evaluation, evaluation_note, tpu and tpu_note.
EXPORTED_MODEL = exported_model_asset(DAG_ID)
