"""The simulation's GKE and Cloud Storage APIs through the real client libraries, as the pipeline reaches them: GKE
with the service-account key of the Google connection (over gRPC through the simulation's proxy, which the
environment of .sim/airflow.env names), Cloud Storage at the emulator's endpoint. For the tests and the scripts
that check what a run did."""

import json


def gke_client(google_connection: str):
    """A ``ClusterManagerClient`` with the key of ``google_connection`` (AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT's JSON)."""
    from google.cloud.container_v1 import ClusterManagerClient
    from google.oauth2 import service_account

    key_path = json.loads(google_connection)["extra"]["key_path"]
    credentials = service_account.Credentials.from_service_account_file(
        key_path, scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )
    return ClusterManagerClient(credentials=credentials)


def gcs_client(endpoint: str):
    """A Cloud Storage client of the emulator at ``endpoint`` (STORAGE_EMULATOR_HOST)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="tpu-rl-sim", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )
