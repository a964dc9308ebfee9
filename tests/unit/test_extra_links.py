"""What src/tpu_rl/provider.py says of the JobSet task's extra links on Airflow 3: the serialised DAG holds each
link's name and XCom key, and the side that reads the links (the API server) gets XCom-reading links from them,
not the package's link classes, so no registration of those classes is what makes them resolve."""

from __future__ import annotations

import pytest

from tpu_rl.links import JobSetLogsLink, JobSetWorkloadLink
from tpu_rl.operators.jobset import JobSetOperator

pytestmark = pytest.mark.core

MANIFEST = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "x"}, "spec": {}}


def test_a_serialised_dag_keeps_each_links_name_and_xcom_key_and_reads_the_link_from_xcom():
    from airflow.sdk import DAG

    try:
        from airflow.serialization.serialized_objects import DagSerialization
    except ImportError:  # Airflow 3.1
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization

    with DAG("links_dag", schedule=None) as dag:
        JobSetOperator(task_id="train", manifest=MANIFEST, project_id="p", location="us-east5", cluster_name="c")
    serialised = DagSerialization.serialize_dag(dag)
    (task,) = serialised["tasks"]
    expected = {link.name: link.xcom_key for link in (JobSetWorkloadLink(), JobSetLogsLink())}
    assert task.get("__var", task)["_operator_extra_links"] == expected

    links = DagSerialization.deserialize_dag(serialised).get_task("train").operator_extra_links
    assert {link.name: link.xcom_key for link in links} == expected
    assert {type(link).__name__ for link in links} == {"XComOperatorLink"}
