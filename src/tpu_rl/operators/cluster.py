"""The GKE cluster: created, adopted, waited for and deleted, by run ownership.

Every create adopts what exists; the delete removes only a cluster labelled with this run's key (a shared one:
once the last run of its lease leaves), so a retried or cleared task never creates twice and never deletes a
cluster another run made. Its operations are awaited through ``operators.gke_operations``; the run's TPU node
pools are ``operators.tpu_pools``'s.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator

from tpu_rl import gke
from tpu_rl.compat import AirflowException, AirflowFailException
from tpu_rl.config import RunConfig
from tpu_rl.environment import called, elsewhere
from tpu_rl.hooks.gke import GkeApiHook, GkeRefusedError
from tpu_rl.leases import holder_has_ended
from tpu_rl.operators.gke_operations import AwaitsGkeOperations
from tpu_rl.operators.leases import dag_run_state, drop_from_cluster_lease, join_cluster_lease, leave_cluster_lease
from tpu_rl.run import RunIdentity
from tpu_rl.run_scope import RunScoped
from tpu_rl.vocabulary import GKE_LABEL_RUN_KEY, GKE_LABEL_SHARED


class CreateClusterOperator(AwaitsGkeOperations):
    """Creates the run's cluster (cluster_mode=create), or adopts it when a previous try created it.

    cluster_mode=shared: the run first joins the cluster's lease, then creates the cluster or adopts it
    (another run of the lease made it); while the last run to leave is still deleting it, it waits.
    A cluster another live run uses is never adopted by cluster_mode=create.
    """

    #: Seconds between checks while the cluster of a shared lease is being deleted.
    CLOSING_POLL_SECONDS = 30

    def execute(self, context: Any, event: Any = None, refusals: int = 0) -> None:
        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        if not config.creates_cluster:
            self.log.info(
                "cluster_mode is 'existing': using cluster %s, which this run will not delete", config.cluster_name
            )
            return
        hook = scope.gke
        if config.shares_cluster and not self._join_lease(context, hook):
            return
        try:
            operation = hook.create_cluster(gke.cluster_body(config, run, datetime.now(UTC)))
        except GkeRefusedError as refused:
            self.wait_out(refused, f"create cluster {config.cluster_name}", refusals)
        if operation is None:
            cluster = hook.get_cluster(config.cluster_name)
            if cluster is None:
                raise AirflowException(
                    f"GKE said cluster {config.cluster_name} exists, then that it does not (being "
                    "deleted?): a retry creates it"
                )
            self._check_adoptable(context, cluster)
            owner = cluster.resource_labels.get(GKE_LABEL_RUN_KEY, "none")
            if cluster.status.name == "ERROR" and owner == run.key and not config.shares_cluster:
                self._replace_failed_cluster(context, hook, cluster, refusals)
                return
            self.log.info(
                "Cluster %s already exists (status %s, created by run key %s; this run is %s): adopting it",
                config.cluster_name,
                cluster.status.name,
                owner,
                run.key,
            )
            return
        self.log.info("Creating cluster %s (operation %s)", gke.cluster_path(config), operation)
        self._await(config, operation)

    def submit(self, context: Any, step: int, refusals: int = 0, **wait: Any) -> None:
        """After the delete of a cluster whose create failed, or a refused create: creates it again."""
        self.execute(context, refusals=refusals)

    def _replace_failed_cluster(self, context: Any, hook: GkeApiHook, cluster: Any, refusals: int) -> None:
        """A cluster an earlier try of this run created and GKE left in ERROR (its create failed): GKE does not
        repair it and nothing can run on it, so it is deleted and created again (as Terraform re-creates a
        cluster created in an error state)."""
        config = self.scope.config
        self.log.warning(
            "Cluster %s, created by an earlier try of this run, is ERROR (%s): deleting it to create it again",
            config.cluster_name,
            cluster.status_message or "GKE gave no reason",
        )
        try:
            operation = hook.delete_cluster(config.cluster_name)
        except GkeRefusedError as refused:
            self.wait_out(refused, f"delete cluster {config.cluster_name}", refusals)
        if operation is None:  # gone meanwhile
            self.execute(context, refusals=refusals)
            return
        self.log.info("Deleting cluster %s (operation %s)", config.cluster_name, operation)
        self._await(config, operation, next_step=0)

    def _join_lease(self, context: Any, hook: GkeApiHook) -> bool:
        """Joins the shared cluster's lease; False (after deferring) while its last holder deletes it."""
        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        config = self.scope.config
        cluster_exists = hook.get_cluster(config.cluster_name) is not None
        if join_cluster_lease(self.scope, context["ti"], cluster_exists, self.log) is None:  # the lease is closing
            self.log.info(
                "Shared cluster %s is being deleted by the last run that used it: waiting %d s to create it again",
                config.cluster_name,
                self.CLOSING_POLL_SECONDS,
            )
            self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=self.CLOSING_POLL_SECONDS)), method_name="execute")
        return True

    def _check_adoptable(self, context: Any, cluster: Any) -> None:
        """Refuses a cluster this run must not use as its own: in shared mode one that is not shared; in create
        mode one that shared runs use, or one another live run created (it would delete it under them), or a run
        of another Airflow environment (this one cannot tell whether that run lives)."""
        config, run = self.scope.config, self.scope.run
        shared = cluster.resource_labels.get(GKE_LABEL_SHARED) == "true"
        if config.shares_cluster and not shared:
            drop_from_cluster_lease(self.scope)
            raise AirflowFailException(
                f"cluster_name: cluster {config.cluster_name} exists and is not a shared cluster (it is another "
                "run's, or not this package's); fix: use another cluster_name, or cluster_mode 'existing' to use "
                "it without deleting it."
            )
        if config.shares_cluster:
            recorded, mine = gke.cluster_lease_uri(cluster.description), gke.shared_lease_uri(config)
            if recorded and recorded != mine:
                drop_from_cluster_lease(self.scope)
                raise AirflowFailException(
                    f"gcs_bucket: shared cluster {config.cluster_name} keeps its lease at {recorded}, and this run's "
                    f"would be {mine}: its runs could not see this one and would delete the cluster under it; fix: "
                    "set gcs_bucket to the bucket of the runs that share it (or use another cluster_name)."
                )
            return
        owner = gke.cluster_owner(cluster.description)
        if shared:
            raise AirflowFailException(
                f"cluster_name: cluster {config.cluster_name} is shared by runs in cluster_mode 'shared'; this run "
                "would delete it under them; fix: set cluster_mode to 'shared' (or use another cluster_name)."
            )
        if owner and elsewhere(owner.environment, run.environment):
            raise AirflowFailException(
                f"cluster_name: cluster {config.cluster_name} was created by the run {owner.dag_id} / {owner.run_id} "
                f"of Airflow environment {owner.environment}, not this one ({called(run.environment)}), which cannot "
                "tell whether that run still uses it; fix: use another cluster_name, or cluster_mode 'existing' to "
                "use it without deleting it."
            )
        if owner and (owner.dag_id, owner.run_id) != (run.dag_id, run.run_id):
            state = dag_run_state(context["ti"], owner)
            if not holder_has_ended(state):
                raise AirflowFailException(
                    f"cluster_name: cluster {config.cluster_name} belongs to the live run {owner.dag_id} / "
                    f"{owner.run_id} ({state}), which deletes it when it ends; fix: let runs share it with "
                    "cluster_mode 'shared', or use another cluster_name."
                )


class ClusterReadySensor(RunScoped, BaseSensorOperator):
    """Waits until the cluster is RUNNING (even one that already existed) and its API answers."""

    def poke(self, context: Any) -> bool:
        scope = self.bind_scope(context)
        config = scope.config
        if config.kubernetes_conn_id:
            version = scope.kubernetes.server_version()
            self.log.info("Cluster behind connection '%s' answers: Kubernetes %s", config.kubernetes_conn_id, version)
            return True
        cluster = scope.gke.get_cluster(config.cluster_name)
        if cluster is None:
            raise AirflowFailException(
                f"cluster_name: no cluster '{config.cluster_name}' in {config.project}/{config.region}; fix: "
                "set cluster_mode to 'create', or name an existing cluster."
            )
        status = cluster.status.name
        if status in ("ERROR", "DEGRADED", "STOPPING"):
            raise AirflowFailException(f"Cluster {config.cluster_name} is {status}: {cluster.status_message}")
        self.log.info("Cluster %s is %s", config.cluster_name, status)
        return status == "RUNNING"


class DeleteClusterOperator(AwaitsGkeOperations):
    """Teardown: deletes the cluster only if this run created it; in an existing cluster it removes the
    run's token Secret instead. GKE refuses a delete while another operation runs: it waits for that one."""

    def execute(self, context: Any) -> None:
        scope = self.bind_scope(context)
        config, run = scope.config, scope.run
        if not config.creates_cluster:
            self._delete_secret(config, run)
            return
        closing = not config.keep_cluster
        if config.shares_cluster and not leave_cluster_lease(scope, context["ti"], closing, self.log):
            self._delete_secret(config, run)
            return
        if config.keep_cluster:
            self.log.warning("keep_cluster is set: cluster %s stays up and keeps costing money", config.cluster_name)
            return
        hook = scope.gke
        cluster = hook.get_cluster(config.cluster_name)
        if cluster is None:
            self.log.info("Cluster %s does not exist: nothing to delete", config.cluster_name)
            return
        owner = cluster.resource_labels.get(GKE_LABEL_RUN_KEY)
        if config.shares_cluster and cluster.resource_labels.get(GKE_LABEL_SHARED) != "true":
            self.log.warning("Cluster %s is not a shared cluster: leaving it", config.cluster_name)
            return
        if owner != run.key and not config.shares_cluster:
            self.log.warning(
                "Cluster %s was created by run key %s, not by this run (%s): leaving it",
                config.cluster_name,
                owner,
                run.key,
            )
            return
        self.submit(context, 0)

    def submit(self, context: Any, step: int = 0, refusals: int = 0) -> None:
        """Asks GKE to delete the cluster (``execute`` found it this run's to delete) and waits for it; while
        GKE refuses (another operation runs on the cluster: the run's, or GKE's own upgrade or repair; throttling),
        waits, deferred, and asks again."""
        scope = self.bind_scope(context)
        config = scope.config
        try:
            operation = scope.gke.delete_cluster(config.cluster_name)
        except GkeRefusedError as refused:
            self.wait_out(refused, f"delete cluster {config.cluster_name}", refusals)
        if operation is None:
            self.log.info("Cluster %s does not exist (any more): nothing to delete", config.cluster_name)
            return
        self.log.info("Deleting cluster %s (operation %s)", config.cluster_name, operation)
        self._await(config, operation)

    def _delete_secret(self, config: RunConfig, run: RunIdentity) -> None:
        if self.scope.kubernetes.delete_secret(run.secret_name(), config.namespace):
            self.log.info("Deleted Secret %s/%s; the existing cluster stays", config.namespace, run.secret_name())
        else:
            self.log.info("No Secret %s to delete; the existing cluster stays", run.secret_name())
