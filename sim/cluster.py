"""Kubernetes-side setup of the simulated cluster, called by sim/up.sh step by step.

    cluster.py STEP...   runs the steps in order, in one process:
      files     kubeconfig and the JobSet controller's config file
      crds      applies the JobSet and kwok Logs CRDs from the build cache
      webhooks  registers JobSet's four webhooks by URL and waits until they default a JobSet
      nodes     the simulated GKE nodes (sim/nodes.py)
      finish    default bucket in the GCS emulator, .sim/airflow.env

Every object is built here as Python data. Settings come from the environment exported by sim/lib.sh.
"""

import base64
import json
import os
import shlex
import sys
import time
from pathlib import Path

SIM = Path(os.environ["SIM"])
PKI = SIM / "pki"
APISERVER = f"https://127.0.0.1:{os.environ['APISERVER_PORT']}"
WEBHOOK = f"https://127.0.0.1:{os.environ['JOBSET_WEBHOOK_PORT']}"
GCS = f"http://127.0.0.1:{os.environ['GCS_PORT']}"
PROJECT = "tpu-rl-sim"


def write_files():
    import yaml

    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "tpu-rl-sim", "cluster": {"server": APISERVER, "certificate-authority": str(PKI / "ca.crt")}}
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate": str(PKI / "admin.crt"), "client-key": str(PKI / "admin.key")},
            }
        ],
        "contexts": [{"name": "tpu-rl-sim", "context": {"cluster": "tpu-rl-sim", "user": "admin"}}],
        "current-context": "tpu-rl-sim",
    }
    (SIM / "kubeconfig").write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    (SIM / "kubeconfig").chmod(0o600)

    jobset_config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {
            "host": "127.0.0.1",
            "port": int(os.environ["JOBSET_WEBHOOK_PORT"]),
            "certDir": str(PKI / "webhook"),
        },
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{os.environ['JOBSET_HEALTH_PORT']}"},
    }
    (SIM / "jobset").mkdir(exist_ok=True)
    (SIM / "jobset" / "config.yaml").write_text(yaml.safe_dump(jobset_config, sort_keys=False))


def api_client():
    from kubernetes import config

    return config.new_client_from_config(str(SIM / "kubeconfig"))


def apply_crds():
    """JobSet's CRD, and kwok's Logs CRD (kwok serves `kubectl logs` from Logs objects), from the build cache."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    cache = Path(os.environ["CACHE"])
    files = [
        cache / f"jobset-{os.environ['JOBSET_VERSION']}" / "jobset.x-k8s.io_jobsets.yaml",
        cache / f"kwok-{os.environ['KWOK_VERSION']}" / "kwok.x-k8s.io_logs.yaml",
    ]
    api = client.ApiextensionsV1Api(api_client())
    names = []
    for path in files:
        crd = yaml.safe_load(path.read_text())
        name = crd["metadata"]["name"]
        names.append(name)
        try:
            api.create_custom_resource_definition(crd)
            print(f"created CRD {name}")
        except ApiException as e:
            if e.status != 409:
                raise
            crd["metadata"]["resourceVersion"] = api.read_custom_resource_definition(name).metadata.resource_version
            api.replace_custom_resource_definition(name, crd)
    deadline = time.time() + 60
    while names and time.time() < deadline:
        conditions = api.read_custom_resource_definition(names[0]).status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            names.pop(0)
        else:
            time.sleep(0.5)
    if names:
        sys.exit(f"CRDs not established: {names}")
    print("CRDs established")


def webhook(name, path, rules, object_selector=None):
    hook = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": WEBHOOK + path, "caBundle": base64.b64encode((PKI / "ca.crt").read_bytes()).decode()},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": rules,
    }
    if object_selector:
        hook["objectSelector"] = object_selector
    return hook


def register_webhooks():
    """The four webhooks of JobSet's config/components/webhook, with a URL instead of a Service."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    def jobsets(ops):
        return [
            {"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"], "operations": ops, "resources": ["jobsets"]}
        ]

    pods = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    in_jobset = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "jobset-mutating-webhook-configuration"},
        "webhooks": [
            webhook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", jobsets(["CREATE"])),
            webhook("mpod.kb.io", "/mutate--v1-pod", pods, in_jobset),
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "jobset-validating-webhook-configuration"},
        "webhooks": [
            webhook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset", jobsets(["CREATE", "UPDATE"])),
            webhook("vpod.kb.io", "/validate--v1-pod", pods, in_jobset),
        ],
    }
    api = client.AdmissionregistrationV1Api(api_client())
    for body, create, read, replace in (
        (
            mutating,
            api.create_mutating_webhook_configuration,
            api.read_mutating_webhook_configuration,
            api.replace_mutating_webhook_configuration,
        ),
        (
            validating,
            api.create_validating_webhook_configuration,
            api.read_validating_webhook_configuration,
            api.replace_validating_webhook_configuration,
        ),
    ):
        name = body["metadata"]["name"]
        try:
            create(body)
        except ApiException as e:
            if e.status != 409:
                raise
            body["metadata"]["resourceVersion"] = read(name).metadata.resource_version
            replace(name, body)
    wait_for_defaulting()


def wait_for_defaulting():
    """A server-side dry-run create goes through both JobSet webhooks: done when the defaults appear."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    probe = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "sim-webhook-probe", "namespace": "default"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "probe",
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "probe", "image": "busybox", "command": ["true"]}],
                                }
                            }
                        }
                    },
                }
            ]
        },
    }
    api = client.CustomObjectsApi(api_client())
    deadline, last = time.time() + 60, None
    while time.time() < deadline:
        try:
            out = api.create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", probe, dry_run="All"
            )
            if out["spec"].get("successPolicy", {}).get("operator") == "All":
                print("JobSet webhooks answer (dry-run JobSet defaulted)")
                return
            last = f"not defaulted: {out['spec']}"
        except ApiException as e:
            last = f"{e.status} {e.reason}: {e.body}"
        time.sleep(0.5)
    sys.exit(f"JobSet webhooks not answering: {last}")


def finish():
    """Default bucket(s) in the GCS emulator and the env file for Airflow and the tests."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = GCS
    gcs = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
    for bucket in os.environ.get("TPU_RL_SIM_BUCKETS", "tpu-rl-sim").split(","):
        if bucket and gcs.lookup_bucket(bucket) is None:
            gcs.create_bucket(bucket)
            print(f"created bucket gs://{bucket}")

    kubeconfig = str(SIM / "kubeconfig")
    env = {
        "KUBECONFIG": kubeconfig,
        "STORAGE_EMULATOR_HOST": GCS,
        "AIRFLOW_CONN_TPU_RL_SIM": json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig}}),
        # The GKE emulator (sim/gke_emulator.py): a service-account key whose token_uri is the emulator's
        # token endpoint; gRPC's HTTP CONNECT proxy support sends container.googleapis.com:443 to the
        # emulator, whose certificate is signed by the sim CA. GCS still goes to STORAGE_EMULATOR_HOST.
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(
            {
                "conn_type": "google_cloud_platform",
                "extra": {"key_path": str(SIM / "gke" / "service-account.json"), "project": PROJECT},
            }
        ),
        "grpc_proxy": f"http://127.0.0.1:{os.environ['GKE_PROXY_PORT']}",
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(PKI / "ca.crt"),
        # A cluster's DNS-based endpoint (<id>.<location>.gke.goog) through the same proxy, as through an
        # egress proxy: the kubernetes client reads HTTPS_PROXY/NO_PROXY, kubernetes_asyncio's aiohttp
        # session trusts the environment. Its certificate is signed by the stand-in public CA, which the
        # default trust store gets through SSL_CERT_FILE (the system roots plus that CA; sim/gke_dns.py).
        "HTTPS_PROXY": f"http://127.0.0.1:{os.environ['GKE_PROXY_PORT']}",
        "NO_PROXY": "127.0.0.1,localhost",
        "SSL_CERT_FILE": str(PKI / "public-trust.pem"),
        # google-cloud-compute's REST transport (requests) trusts certifi's roots unless told otherwise: the same
        # bundle, for the Compute Engine stand-in at compute.googleapis.com (sim/compute_api.py).
        "REQUESTS_CA_BUNDLE": str(PKI / "public-trust.pem"),
        # The reaper DAG (paused at creation) watches where the simulation's runs create clusters.
        "TPU_RL_REAPER_WATCH": f"{PROJECT}/us-east5",
        # The recurring programs of the shipped example, declared for the simulation.
        "TPU_RL_PROGRAMS": str(Path(__file__).resolve().parents[1] / "include" / "examples" / "programs.yaml"),
        # A fake token: the simulation checks that pods get HF_TOKEN from a Secret, never its value.
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT": json.dumps(
            {"conn_type": "generic", "password": "hf_simulated_token_not_real"}
        ),
    }
    lines = ["# Written by sim/up.sh: source it to point Airflow and clients at the simulation."]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    (SIM / "airflow.env").write_text("\n".join(lines) + "\n")


def create_nodes():
    from . import nodes

    nodes.ensure_nodes(str(SIM / "kubeconfig"))


if __name__ == "__main__":
    steps = {
        "files": write_files,
        "crds": apply_crds,
        "webhooks": register_webhooks,
        "nodes": create_nodes,
        "finish": finish,
    }
    for step in sys.argv[1:]:  # several steps in one process: importing the clients takes seconds
        steps[step]()
