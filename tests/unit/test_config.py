"""Validation: every bad value is refused with a message naming the field and the fix."""

import re
from datetime import UTC

import pytest

from tpu_rl.config import ConfigError, RunConfig

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core


def problems_for(conf: dict, **overrides) -> dict[str, str]:
    with pytest.raises(ConfigError) as raised:
        RunConfig.from_params({**conf, **overrides})
    return {p.field: str(p) for p in raised.value.problems}


def test_tutorial_values_are_the_defaults(tutorial_config):
    c = tutorial_config
    assert (c.tpu_type, c.topology, c.compute_type) == ("v6e-64", "8x8", "ct6e-standard-4t")
    assert (c.cluster_nodepool_count, c.pw_cpu_machine_type, c.model_name) == (1, "c4d-standard-96", "qwen3-30b-a3b")
    assert c.cloud_image_name.endswith("tpu_post_training:0.2.4")
    assert (c.num_batches, c.batch_size, c.rollout_tensor_parallelism, c.rollout_expert_parallelism) == (50, 4, 8, 1)
    assert (c.ici_tensor_parallelism, c.ici_expert_parallelism, c.hbm_utilization_vllm) == (4, 4, 0.65)
    assert (c.trainer_devices_fraction, c.sampler_devices_fraction, c.reshard_chunk_size) == (0.5, 0.5, 8)


def test_derived_values_of_the_tutorial_slice(tutorial_config):
    assert tutorial_config.chips == 64
    assert tutorial_config.hosts_per_slice == 16
    assert tutorial_config.slice.pathways_instance_type == "tpuv6e:8x8"
    assert (tutorial_config.trainer_devices, tutorial_config.sampler_devices) == (32, 32)
    assert tutorial_config.train_steps == 50


def test_other_generations_derive_their_own_shape(tutorial_conf):
    v5p = RunConfig.from_params(
        {
            **tutorial_conf,
            "tpu_type": "v5p-128",
            "topology": "4x4x4",
            "compute_type": "ct5p-hightpu-4t",
            "zone": "us-east5-a",
        }
    )
    assert (v5p.chips, v5p.hosts_per_slice, v5p.slice.pathways_instance_type) == (64, 16, "tpuv5:4x4x4")
    v6e_16 = RunConfig.from_params(
        {
            **tutorial_conf,
            "tpu_type": "v6e-16",
            "topology": "4x4",
            "ici_tensor_parallelism": 2,
            "ici_expert_parallelism": 2,
        }
    )
    assert (v6e_16.chips, v6e_16.hosts_per_slice) == (16, 4)


@pytest.mark.parametrize("missing", ["project", "region", "zone", "cluster_name", "gcs_bucket"])
def test_required_fields(tutorial_conf, missing):
    del tutorial_conf[missing]
    problems = problems_for(tutorial_conf)
    assert "is required" in problems[missing]


def test_invalid_topology_names_the_field(tutorial_conf):
    problems = problems_for(tutorial_conf, topology="7x9")
    assert list(problems) == ["topology"]
    assert "'7x9' is not a v6e topology" in problems["topology"] and "8x8" in problems["topology"]


def test_topology_must_match_the_tpu_type(tutorial_conf):
    assert "4x4 has 16 chips but v6e-64 has 64" in problems_for(tutorial_conf, topology="4x4")["topology"]


def test_unknown_tpu_type_and_wrong_machine_type(tutorial_conf):
    assert "tpu_type" in problems_for(tutorial_conf, tpu_type="v9-64")
    assert "not a v6e machine type" in problems_for(tutorial_conf, compute_type="ct5p-hightpu-4t")["compute_type"]


def test_single_host_machine_type_cannot_form_a_multi_host_slice(tutorial_conf):
    assert "cannot form a 64-chip slice" in problems_for(tutorial_conf, compute_type="ct6e-standard-8t")["compute_type"]


def test_trainer_parallelism_must_divide_the_trainer_devices(tutorial_conf):
    problems = problems_for(tutorial_conf, ici_tensor_parallelism=4, ici_expert_parallelism=3)
    assert "12 does not divide the 32 trainer devices" in problems["ici_expert_parallelism"]


def test_on_one_slice_the_trainers_ici_axes_must_divide_the_sampler_devices_too(tutorial_conf):
    """MaxText 0.2.4's single-slice branch gives the sampler the run's config, and lays the rollout mesh with its ICI
    axes (utils/model_creation_utils.py:689, :770): 4 x 4 does not divide 24 sampler chips."""
    problems = problems_for(tutorial_conf, sampler_devices_fraction=0.375)
    assert "16 does not divide the 24 sampler devices" in problems["ici_expert_parallelism"]


def test_rollout_parallelism_must_divide_the_sampler_devices(tutorial_conf):
    problems = problems_for(tutorial_conf, rollout_tensor_parallelism=64)
    assert "64 does not divide the 32 sampler devices" in problems["rollout_tensor_parallelism"]


def test_device_fractions(tutorial_conf):
    assert "outside (0, 1]" in problems_for(tutorial_conf, trainer_devices_fraction=1.5)["trainer_devices_fraction"]
    assert "add up to 1.2" in problems_for(tutorial_conf, trainer_devices_fraction=0.7)["sampler_devices_fraction"]
    assert "whole chips" in problems_for(tutorial_conf, trainer_devices_fraction=0.3)["trainer_devices_fraction"]


@pytest.mark.parametrize("bucket", ["Upper-Case", "ab", "goog-bucket", "-dash-first", "a..b"])
def test_bucket_name_rules(tutorial_conf, bucket):
    assert "not a valid bucket name" in problems_for(tutorial_conf, gcs_bucket=bucket)["gcs_bucket"]


@pytest.mark.parametrize("name", ["1cluster", "Cluster", "a" * 41, "ends-with-dash-"])
def test_cluster_name_rules(tutorial_conf, name):
    assert "not a GKE cluster name" in problems_for(tutorial_conf, cluster_name=name)["cluster_name"]


def test_zone_must_be_in_the_region(tutorial_conf):
    assert "not in region 'us-east5'" in problems_for(tutorial_conf, zone="us-central1-a")["zone"]


def test_pathways_jobset_name_length_limits_the_prefix(tutorial_conf):
    problem = problems_for(tutorial_conf, workload_prefix="a-very-long-prefix")["workload_prefix"]
    assert "Pathways allows 22" in problem and "at most 7 characters" in problem


def test_kubernetes_connection_needs_an_existing_cluster_and_pools(tutorial_conf):
    problems = problems_for(tutorial_conf, kubernetes_conn_id="sim")
    assert "cluster_mode" in problems["kubernetes_conn_id"]
    assert "'existing'" in problems["tpu_pool_mode"]
    RunConfig.from_params(
        {**tutorial_conf, "kubernetes_conn_id": "sim", "cluster_mode": "existing", "tpu_pool_mode": "existing"}
    )


def test_unknown_model_and_unknown_param(tutorial_conf):
    problems = problems_for(tutorial_conf, model_name="gpt-9", num_batchs=3)
    assert "not a supported MaxText model" in problems["model_name"]
    assert "is not a parameter of this DAG" in problems["num_batchs"]


def test_wrong_types_are_refused_not_guessed(tutorial_conf):
    problems = problems_for(tutorial_conf, num_batches="many", scan_layers="maybe")
    assert set(problems) == {"num_batches", "scan_layers"}


def test_form_strings_are_coerced(tutorial_conf):
    config = RunConfig.from_params({**tutorial_conf, "num_batches": "10", "scan_layers": "false"})
    assert (config.num_batches, config.scan_layers) == (10, False)


def test_a_key_the_run_sets_itself_is_refused_with_where_it_comes_from(tutorial_conf):
    """No parameter is named hf_access_token: the fix says where the token comes from, not "its parameter"."""
    problem = problems_for(tutorial_conf, extra_train_args={"hf_access_token": "hf_x"})["extra_train_args"]
    assert "which the run sets itself" in problem and "hf_token_conn_id" in problem and "its parameter" not in problem
    assert (
        "which the run sets itself"
        in problems_for(tutorial_conf, extra_train_args={"load_parameters_path": "gs://b"})["extra_train_args"]
    )


def test_extra_train_args_cannot_override_own_params(tutorial_conf):
    problems = problems_for(tutorial_conf, extra_train_args={"num_batches": 3})
    assert "has its own parameter" in problems["extra_train_args"]
    config = RunConfig.from_params({**tutorial_conf, "extra_train_args": {"rl.num_iterations": 2}})
    assert config.train_steps == 100


def test_a_key_maxtext_does_not_know_is_refused_with_the_nearest_one(tutorial_conf):
    """MaxText 0.2.4 refuses an unknown key only when train_rl starts, on the TPU slice the run created."""
    problems = problems_for(tutorial_conf, extra_train_args={"learning_rat": 1e-6})
    assert problems["extra_train_args"] == (
        "extra_train_args: 'learning_rat' is not a MaxText 0.2.4 setting; fix: did you mean 'learning_rate'?"
    )


@pytest.mark.parametrize(
    "key, fix",
    [
        ("rl.num_iteratons", "did you mean 'rl.num_iterations'?"),  # MaxText would drop it and train 1 iteration
        ("learning_rate.peak", "did you mean 'learning_rate'?"),  # learning_rate holds a number, not keys
        ("eval_dataset", "did you mean 'eval_dataset_name'?"),
        ("temperature", "did you mean 'temperature_tuning' or 'distill_temperature'?"),
        ("zzz", "remove it, or use a key of train_rl's config (MaxText 0.2.4: configs/types.py RLConfig)."),
    ],
)
def test_each_unknown_key_is_named_with_its_fix(tutorial_conf, key, fix):
    problems = problems_for(tutorial_conf, extra_train_args={"learning_rate": 1e-6, key: 1})
    assert problems["extra_train_args"] == f"extra_train_args: '{key}' is not a MaxText 0.2.4 setting; fix: {fix}"


def test_known_keys_nested_keys_and_keys_under_a_mapping_are_accepted(tutorial_conf):
    extra = {
        "learning_rate": 1e-6,
        "rl.num_iterations": 2,
        "num_generations": 4,
        "rl.grpo_beta": 0.04,
        "generation_configs.greedy.temperature": 0.1,
    }
    assert RunConfig.from_params({**tutorial_conf, "extra_train_args": extra}).extra_train_args == extra


@pytest.mark.parametrize(
    "extra, steps",
    [
        ({}, 50),
        ({"rl.num_iterations": 2}, 100),
        ({"num_iterations": 3, "rl.num_iterations": 2}, 150),  # the flat key wins, as in MaxText's pyconfig
        ({"train_fraction": 0.5}, 25),
        ({"num_epoch": 2, "train_fraction": 0.5}, 50),
        ({"num_epoch": 3, "rl.num_iterations": 2, "train_fraction": 0.7}, 210),
    ],
)
def test_planned_steps_are_computed_as_maxtext_computes_them(tutorial_conf, extra, steps):
    """MaxText 0.2.4 configs/types.py: int(num_batches x rl.num_iterations x train_fraction x num_epoch). With
    only the first two multiplied, progress, ETA and the final-step check would be wrong."""
    assert RunConfig.from_params({**tutorial_conf, "extra_train_args": extra}).train_steps == steps


@pytest.mark.parametrize(
    "extra",
    [
        {"train_fraction": 0},
        {"train_fraction": 1.5},
        {"num_epoch": 0},
        {"rl.num_iterations": "two"},
        {"num_iterations": 1.5},
    ],
)
def test_step_keys_maxtext_would_refuse_are_refused(tutorial_conf, extra):
    assert next(iter(extra)) in problems_for(tutorial_conf, extra_train_args=extra)["extra_train_args"]


def test_all_problems_are_reported_at_once(tutorial_conf):
    problems = problems_for(tutorial_conf, topology="7x9", gcs_bucket="BAD", hbm_utilization_vllm=2)
    assert {"topology", "gcs_bucket", "hbm_utilization_vllm"} <= set(problems)


def test_training_record_holds_typed_values(tutorial_config):
    from tpu_rl.layout import GcsLayout, training_record
    from tpu_rl.run import RunIdentity

    record = training_record(tutorial_config)
    assert record["num_batches"] == 50 and record["batch_size"] == 4 and record["train_steps"] == 50
    assert record["load_parameters_path"] == GcsLayout(tutorial_config, RunIdentity("d", "r")).converted_items_prefix


def test_a_resume_over_other_data_settings_is_caught_by_the_training_record(tutorial_conf):
    """train_split, hf_subset, the shuffle seed or the length filter given in extra_train_args decide which prompts
    a step reads: a cleared run resumed under other values would fast-forward over other data."""
    from tpu_rl.checkpoints import training_record_changes
    from tpu_rl.layout import training_record

    def record(**extra):
        return training_record(RunConfig.from_params({**tutorial_conf, "extra_train_args": extra}))

    first = record(data_shuffle_seed=7, hf_subset="main", max_prefill_predict_length=256)
    assert first["training_data"] == {"data_shuffle_seed": 7, "hf_subset": "main", "max_prefill_predict_length": 256}
    changed = training_record_changes(
        first, record(data_shuffle_seed=8, hf_subset="main", max_prefill_predict_length=256)
    )
    assert changed and "data_shuffle_seed" in changed[0]
    assert record()["training_data"] == {} and training_record_changes(record(), record()) == []
    assert training_record_changes(record(), record(hf_subset="socratic"))  # settings added on a clear: refused
    before = {k: v for k, v in first.items() if k != "training_data"}  # written by an earlier version
    assert training_record_changes(before, first) == []


# Requests that real GKE or Kubernetes would refuse or never schedule are refused before anything exists.


def test_a_run_that_creates_pools_needs_a_node_service_account(tutorial_conf):
    problems = problems_for(tutorial_conf, node_service_account="")
    assert "Compute Engine default account is refused" in problems["node_service_account"]
    problems = problems_for(tutorial_conf, node_service_account="not-an-email")
    assert "not a service account email" in problems["node_service_account"]
    existing = {**tutorial_conf, "cluster_mode": "existing", "tpu_pool_mode": "existing", "node_service_account": ""}
    assert RunConfig.from_params(existing).node_service_account == ""


def test_conversion_on_tpu_with_per_run_pools_is_refused(tutorial_conf):
    problems = problems_for(tutorial_conf, conversion_on_tpu=True)
    assert "tpu_pool_mode 'per_run' creates only around training" in problems["conversion_on_tpu"]
    assert RunConfig.from_params({**tutorial_conf, "conversion_on_tpu": True, "tpu_pool_mode": "cluster"})


def test_conversion_must_fit_a_cpu_pool_node(tutorial_conf):
    # The blueprint's cpu-np is n4-standard-64: 256 GB, of which GKE leaves about 226Gi to pods.
    problems = problems_for(tutorial_conf, pw_cpu_machine_type="n4-standard-64", conversion_memory="256Gi")
    assert problems["conversion_memory"].startswith(
        "conversion_memory: 256Gi does not fit on one n4-standard-64 node (227Gi"
    )
    problems = problems_for(tutorial_conf, pw_cpu_machine_type="n4-standard-32", conversion_cpu="40")
    assert "fix: request at most 31" in problems["conversion_cpu"]
    assert (
        RunConfig.from_params({**tutorial_conf, "pw_cpu_machine_type": "n4-standard-64"}).conversion_memory == "200Gi"
    )


def test_only_shipped_jobset_releases_are_installed(tutorial_conf):
    problems = problems_for(tutorial_conf, jobset_version="v0.12.0")
    assert problems["jobset_version"] == (
        "jobset_version: 'v0.12.0' is not shipped with this package; fix: use v0.10.1, or install that JobSet on "
        "the cluster yourself."
    )


@pytest.mark.parametrize("topology", ["4x4x12", "8x8x16", "2x2x1", "2x4x4"])
def test_v5p_topologies_gke_offers(tutorial_conf, topology):
    dims = [int(d) for d in topology.split("x")]
    chips = dims[0] * dims[1] * dims[2]
    config = RunConfig.from_params(
        {
            **tutorial_conf,
            "tpu_type": f"v5p-{2 * chips}",
            "topology": topology,
            "compute_type": "ct5p-hightpu-4t",
            "zone": "us-east5-a",
            "trainer_devices_fraction": 0.5,
            "sampler_devices_fraction": 0.5,
            "ici_tensor_parallelism": 1,
            "ici_expert_parallelism": 1,
            "rollout_tensor_parallelism": 1,
        }
    )
    assert config.chips == chips


def test_v5p_topologies_gke_refuses(tutorial_conf):
    problems = problems_for(tutorial_conf, tpu_type="v5p-96", topology="2x4x6", compute_type="ct5p-hightpu-4t")
    assert "'2x4x6' is not a v5p topology" in problems["topology"]


def test_choices_are_checked_outside_the_form(tutorial_conf):
    """The plan command and the REST API bypass the form's enum: the config refuses a value it cannot act on."""
    problems = problems_for(tutorial_conf, control_plane_endpoint="public", cluster_mode="reuse")
    assert problems["control_plane_endpoint"] == (
        "control_plane_endpoint: 'public' is not one of its choices; fix: use 'dns' or 'ip'."
    )
    assert "cluster_mode" in problems


def test_a_created_cluster_is_reached_through_its_dns_endpoint_unless_ip_is_asked(tutorial_conf):
    """Composer 3 has no fixed egress address for authorized networks: the DNS endpoint is the default."""
    from datetime import datetime

    from tpu_rl.gke import cluster_body
    from tpu_rl.hooks.kubernetes import ClusterTarget
    from tpu_rl.run import RunIdentity

    run, now = RunIdentity("maxtext_rl_tpu", "manual__1"), datetime(2026, 12, 1, tzinfo=UTC)
    config = RunConfig.from_params(tutorial_conf)
    assert cluster_body(config, run, now)["control_plane_endpoints_config"] == {
        "dns_endpoint_config": {"allow_external_traffic": True}
    }
    assert ClusterTarget.for_run(config).use_dns_endpoint
    ip = RunConfig.from_params({**tutorial_conf, "control_plane_endpoint": "ip"})
    assert "control_plane_endpoints_config" not in cluster_body(ip, run, now)
    assert not ClusterTarget.for_run(ip).use_dns_endpoint


def test_reservation_goes_with_capacity_type_reservation(tutorial_conf):
    """The tutorial's RESERVATION is optional: without it the default on_demand run stays valid; a reservation
    is consumed only when capacity_type says so, never silently ignored."""
    assert RunConfig.from_params(tutorial_conf).capacity_type == "on_demand"
    problems = problems_for(tutorial_conf, capacity_type="reservation")
    assert problems["reservation"] == (
        "reservation: is required when capacity_type is 'reservation'; fix: name the "
        "reservation to consume, or choose another capacity_type."
    )
    problems = problems_for(tutorial_conf, capacity_type="spot", reservation="my-v6e")
    assert "capacity_type is 'spot', which consumes no reservation" in problems["reservation"]
    assert "set capacity_type to 'reservation', or clear reservation" in problems["reservation"]
    assert RunConfig.from_params({**tutorial_conf, "capacity_type": "reservation", "reservation": "my-v6e"})
    assert "capacity_type" in problems_for(tutorial_conf, capacity_type="preemptible")


def test_capacity_settings_that_would_be_ignored_are_refused(tutorial_conf):
    existing = {"cluster_mode": "existing", "tpu_pool_mode": "existing"}
    assert problems_for(tutorial_conf, capacity_type="spot", **existing)["capacity_type"] == (
        "capacity_type: 'spot' says how the TPU pools the run creates get their VMs, but tpu_pool_mode is 'existing' "
        "(the run creates none; preemptions are resumed on any capacity); fix: leave capacity_type 'on_demand', or "
        "set tpu_pool_mode to 'per_run'."
    )
    assert (
        "the run creates no pool"
        in problems_for(tutorial_conf, capacity_wait_minutes=30, **existing)["capacity_wait_minutes"]
    )
    flex = problems_for(tutorial_conf, capacity_type="flex_start", capacity_wait_minutes=30)["capacity_wait_minutes"]
    assert "a flex_start pool is created empty at once" in flex and flex.endswith("fix: set it to 0.")
    with_cluster = problems_for(tutorial_conf, tpu_pool_mode="cluster", capacity_wait_minutes=30)
    assert "the TPU pools are created inside the cluster's create" in with_cluster["capacity_wait_minutes"]
    assert RunConfig.from_params({**tutorial_conf, "capacity_type": "spot", "capacity_wait_minutes": 30})


def test_capacity_wait_is_bounded_outside_the_form_too(tutorial_conf):
    assert problems_for(tutorial_conf, capacity_wait_minutes=-5)["capacity_wait_minutes"] == (
        "capacity_wait_minutes: -5 is out of range; fix: use a value from 0 to 1440."
    )
    assert "capacity_wait_minutes" in problems_for(tutorial_conf, capacity_wait_minutes=2000)
    assert RunConfig.from_params({**tutorial_conf, "capacity_wait_minutes": 90}).capacity_wait_minutes == 90


def test_flex_start_is_refused_for_tpu_v4(tutorial_conf):
    v4 = {"tpu_type": "v4-128", "topology": "4x4x4", "compute_type": "ct4p-hightpu-4t"}
    v4 |= {"region": "us-central2", "zone": "us-central2-b"}  # the zone of TPU v4 ("TPU regions and zones")
    problems = problems_for(tutorial_conf, capacity_type="flex_start", **v4)
    assert problems["capacity_type"] == (
        "capacity_type: flex_start does not offer TPU v4; fix: use on_demand, reservation or spot, or a "
        "v6e, v5litepod or v5p slice."
    )
    assert RunConfig.from_params({**tutorial_conf, "capacity_type": "spot", **v4}).capacity_type == "spot"


def test_a_hub_dataset_alone_is_refused_with_maxtexts_recipe(tutorial_conf):
    """train_rl would load nvidia/OpenMathInstruct-2 with hf_subset 'main' (it has only 'default': "BuilderConfig
    'main' not found") and evaluate on GSM8K; MaxText's run_qwen3_30b_rl.sh sets the files, the split and the
    evaluation set together."""
    problems = problems_for(tutorial_conf, dataset_name="nvidia/OpenMathInstruct-2")
    assert "hf_subset 'main'" in problems["dataset_name"] and "run_qwen3_30b_rl.sh" in problems["dataset_name"]
    recipe = {
        "hf_train_files": "hf://datasets/nvidia/OpenMathInstruct-2/data/train_1M-*.parquet",
        "train_split": "train_1M",
        "eval_dataset_name": "nvidia/OpenMathInstruct-2",
    }
    RunConfig.from_params({**tutorial_conf, "dataset_name": "nvidia/OpenMathInstruct-2", "extra_train_args": recipe})
    # Evaluating on another set is allowed when said so; not evaluating at all needs no evaluation set.
    RunConfig.from_params(
        {
            **tutorial_conf,
            "dataset_name": "nvidia/OpenMathInstruct-2",
            "extra_train_args": {**recipe, "eval_dataset_name": "openai/gsm8k"},
        }
    )
    RunConfig.from_params(
        {
            **tutorial_conf,
            "dataset_name": "nvidia/OpenMathInstruct-2",
            "extra_train_args": {"hf_subset": "default", "num_test_batches": 0},
        }
    )


def test_a_split_slice_with_data_files_is_refused(tutorial_conf):
    """With hf_train_files MaxText loads parquet files whose split is named by train_split: datasets refuses a
    slice there ("Split name should match '^\\w+(\\.\\w+)*$'")."""
    problems = problems_for(
        tutorial_conf, extra_train_args={"hf_train_files": "gs://b/p/*.parquet", "train_split": "train[0:200]"}
    )
    assert "refuses slices" in problems["extra_train_args"]


def test_a_cpu_pool_or_kueue_queue_name_gke_or_kubernetes_would_refuse_is_refused_before_anything_exists(
    tutorial_conf,
):
    found = problems_for(
        tutorial_conf, cpu_pool_name="CPU_pool", kueue_queue_name="Team Queue", tpu_pool_mode="cluster"
    )
    assert "'CPU_pool' is not a GKE node pool name" in found["cpu_pool_name"]
    assert "e.g. cpu-np" in found["cpu_pool_name"]
    assert "'Team Queue' is not a LocalQueue name a label can carry" in found["kueue_queue_name"]
    assert "cpu_pool_name" in problems_for(tutorial_conf, cpu_pool_name="c" * 41)  # GKE: at most 40
    standing = {"tpu_pool_mode": "cluster"}
    ok = RunConfig.from_params(
        {**tutorial_conf, **standing, "cpu_pool_name": "pathways-cpu", "kueue_queue_name": "team-a.q1"}
    )
    assert (ok.cpu_pool_name, ok.kueue_queue_name) == ("pathways-cpu", "team-a.q1")


#: A Kubernetes label value (apimachinery validation.IsValidLabelValue): at most 63 characters, empty or beginning
#: and ending with a letter or digit, with dashes, underscores and dots between.
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def generated_ids() -> list[str]:
    """DAG and run ids of every length around the label's limit, with a separator at each position."""
    ids = ["manual__2026-12-05T10:00:00+00:00", "scheduled__2026-12-05T00:00:00+00:00", "A", "_x_", "Ünïcode-run"]
    for length in range(55, 72):
        for cut in range(length - 10, length):
            base = "ab" * length
            ids += [base[:cut] + sep + base[cut + 1 : length] for sep in ("_", ".", "-", " ", "__")]
    return ids


def test_every_label_value_the_package_writes_is_valid_for_any_dag_and_run_id(tutorial_conf):
    """A program id of 63+ characters with a separator at the 63rd made a label value ending in a dash: the JobSet
    and the Secret creates failed, after the slice was created."""
    from datetime import datetime

    from tpu_rl.plan import plan_documents
    from tpu_rl.run import RunIdentity

    config = RunConfig.from_params({**tutorial_conf, "kueue_queue_name": "team-a", "tpu_pool_mode": "cluster"})
    bad = set()
    for dag_id in generated_ids():
        run = RunIdentity(dag_id, generated_ids()[0])
        for _, document in plan_documents(config, run, datetime(2026, 12, 5, tzinfo=UTC)):
            bad |= {(dag_id, v) for v in label_values(document) if not LABEL_VALUE.fullmatch(v)}
    assert bad == set()


def label_values(document) -> list[str]:
    """Every value of a ``labels`` or ``resource_labels`` mapping in a manifest or request, at any depth."""
    found = []
    if isinstance(document, dict):
        for key, value in document.items():
            if key in ("labels", "resource_labels") and isinstance(value, dict):
                found += [str(v) for v in value.values()]
            found += label_values(value)
    elif isinstance(document, list):
        for item in document:
            found += label_values(item)
    return found


@pytest.mark.parametrize(
    ("reservation", "path"),
    [
        ("my-v6e", "projects/my-project/reservations/my-v6e"),
        ("projects/central-tpus/reservations/v6e-pool", "projects/central-tpus/reservations/v6e-pool"),
        (
            "projects/central-tpus/reservations/v6e-pool/reservationBlocks/block-1",
            "projects/central-tpus/reservations/v6e-pool/reservationBlocks/block-1",
        ),
    ],
)
def test_a_reservation_is_a_name_in_the_runs_project_or_the_path_of_a_shared_one(tutorial_conf, reservation, path):
    conf = {**tutorial_conf, "project": "my-project", "capacity_type": "reservation"}
    assert RunConfig.from_params({**conf, "reservation": reservation}).reservation_path == path


@pytest.mark.parametrize("reservation", ["projects/central-tpus/v6e", "My_Reservation", "projects//reservations/r"])
def test_a_reservation_that_is_neither_name_nor_path_is_refused(tutorial_conf, reservation):
    found = problems_for(tutorial_conf, capacity_type="reservation", reservation=reservation)
    assert f"'{reservation}' is not a reservation name or path" in found["reservation"]
    assert "projects/OWNER/reservations/NAME" in found["reservation"]


def test_kueue_with_a_slice_created_per_run_is_refused_it_would_bill_while_kueue_holds_the_training(tutorial_conf):
    found = problems_for(tutorial_conf, kueue_queue_name="user-queue")["kueue_queue_name"]
    assert "the run creates its slice before it submits the training" in found
    assert "tpu_pool_mode 'cluster' or 'existing'" in found
    assert RunConfig.from_params({**tutorial_conf, "kueue_queue_name": "user-queue", "tpu_pool_mode": "cluster"})


def test_the_pathways_images_carry_the_jax_tag_of_the_maxtext_image_not_latest(tutorial_config):
    """xpk's :latest drifts from the trainer's JAX; MaxText 0.2.4's image pins JAX 0.11.0."""
    assert tutorial_config.cloud_image_name.endswith(":0.2.4")
    assert tutorial_config.pathways_image("server").endswith("/pathways/server:jax-0.11.0")
    assert tutorial_config.pathways_image("proxy_server").endswith("/pathways/proxy_server:jax-0.11.0")


@pytest.mark.parametrize(
    ("model_name", "fits"),
    [("qwen3-30b-a3b-base", "qwen3-30b-a3b"), ("qwen3-8b", "qwen3-30b-a3b")],
)
def test_a_model_name_that_does_not_fit_the_weights_is_refused_before_the_conversion(tutorial_conf, model_name, fits):
    """qwen3-30b-a3b-base with the default Instruct-2507 weights converted without error into a model with the wrong
    RoPE base; qwen3-8b with them failed after the download started."""
    found = problems_for(tutorial_conf, model_name=model_name)["model_name"]
    assert f"'{model_name}' does not fit the weights of Qwen/Qwen3-30B-A3B-Instruct-2507, which are {fits}'s" in found
    assert f"set model_name to '{fits}'" in found


def test_weights_of_the_models_own_family_or_of_ones_own_are_accepted(tutorial_conf):
    for model_name, weights in (
        ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B-Thinking-2507"),
        ("qwen3-30b-a3b-base", "Qwen/Qwen3-30B-A3B-Base"),
        ("qwen3-8b", "Qwen/Qwen3-8B"),
        ("qwen3-30b-a3b", "my-team/qwen3-30b-a3b-sft"),  # a fine-tune: not in the table, not checked
    ):
        assert RunConfig.from_params({**tutorial_conf, "model_name": model_name, "hf_model_path": weights})


def test_a_tpu_generation_is_refused_in_a_zone_that_does_not_offer_it(tutorial_conf):
    """Cloud TPU "TPU regions and zones": GKE would refuse the pool ("Invalid machine type ... in zone ...") after the
    cluster and the bucket exist; validation names the zones that have the generation."""
    v5p = {"tpu_type": "v5p-128", "topology": "4x4x4", "compute_type": "ct5p-hightpu-4t"}
    assert problems_for(tutorial_conf, **v5p)["zone"] == (
        "zone: TPU v5p is not offered in us-east5-b; fix: use a zone that offers it (us-central1-a, us-east5-a or "
        "europe-west4-b) with its region, or a v6e slice."
    )
    assert "not offered in us-east5-c" in problems_for(tutorial_conf, zone="us-east5-c")["zone"]
    for mode in ("per_run", "cluster"):
        assert "zone" in problems_for(tutorial_conf, zone="us-east5-c", tpu_pool_mode=mode)
    existing = RunConfig.from_params(
        {**tutorial_conf, "zone": "us-east5-c", "tpu_pool_mode": "existing", "cluster_mode": "existing"}
    )
    assert existing.zone == "us-east5-c"  # the run creates no pool there


def test_flex_start_is_refused_where_gke_does_not_offer_it(tutorial_conf):
    """GKE "About flex-start": v6e in asia-northeast1-b, us-east5-a and us-east5-b only."""
    central = {"region": "us-central1", "zone": "us-central1-b", "capacity_type": "flex_start"}
    assert problems_for(tutorial_conf, **central)["zone"] == (
        "zone: flex_start does not offer TPU v6e in us-central1-b; fix: use asia-northeast1-b, us-east5-a or "
        'us-east5-b (GKE "About flex-start") with its region, or another capacity_type.'
    )
    assert RunConfig.from_params({**tutorial_conf, **central, "capacity_type": "spot"}).zone == "us-central1-b"
    assert RunConfig.from_params({**tutorial_conf, "capacity_type": "flex_start", "zone": "us-east5-a"}).zone
