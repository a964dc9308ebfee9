"""The trigger's parts that need no cluster: its serialized form and the log cursor used on reconnects."""

from tpu_rl.triggers.jobset import JobSetTrigger, _LogCursor


def test_trigger_round_trips_through_its_serialized_form():
    trigger = JobSetTrigger(
        name="n",
        namespace="ns",
        uid="u",
        log_replicated_job="pathways-head",
        log_container="workload-container",
        kubernetes_conn_id="k",
        progress_interval=60,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "tpu_rl.triggers.jobset.JobSetTrigger"
    assert JobSetTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_a_trigger_serialised_before_the_cluster_was_one_object_still_loads():
    """A task deferred across a deploy: its trigger row names the cluster with the old keywords."""
    from tpu_rl.hooks.kubernetes import ClusterTarget

    old = {
        "name": "n",
        "namespace": "ns",
        "uid": "u",
        "log_replicated_job": "pathways-head",
        "log_container": "workload-container",
        "kubernetes_conn_id": None,
        "cluster_url": "https://34.1.2.3",
        "ssl_ca_cert": "Q0E=",
        "gcp_conn_id": "g",
        "impersonation_chain": None,
        "use_dns_endpoint": False,
        "progress_interval": 60,
        "log_tail_lines": 100,
        "delete_on_kill": True,
    }
    trigger = JobSetTrigger(**old)
    assert trigger.cluster == ClusterTarget(cluster_url="https://34.1.2.3", ssl_ca_cert="Q0E=", gcp_conn_id="g")
    assert trigger.serialize()[1]["cluster"]["cluster_url"] == "https://34.1.2.3"


def test_reconnect_drops_lines_already_seen_and_keeps_new_ones():
    cursor = _LogCursor()
    first = ["2026-11-29T10:00:01.5Z step 1", "2026-11-29T10:00:02Z step 2", "2026-11-29T10:00:02Z step 2b"]
    assert [cursor.new_text(x) for x in first] == ["step 1", "step 2", "step 2b"]
    # A reconnect with sinceSeconds returns some lines again; kubelet timestamps drop trailing zeros.
    again = ["2026-11-29T10:00:01.5Z step 1", "2026-11-29T10:00:02Z step 2b", "2026-11-29T10:00:02.000000001Z step 3"]
    assert [cursor.new_text(x) for x in again] == [None, None, "step 3"]
