"""What a trigger does before its first request stays off the triggerer's event loop: the Google provider reads a
connection's credentials on the loop when it makes a token or a client (a key file's RSA key, or a question to the
metadata server), and importing a provider's module there takes hundreds of milliseconds. Every trigger of the
triggerer would wait meanwhile (Airflow warns from 0.2 s); ``make bench-triggerer`` measures the stalls."""

from __future__ import annotations

import asyncio
import threading

import pytest


class SyncHook:
    """A provider's sync hook: it keeps the credentials once read, and notes the thread that read them."""

    def __init__(self, threads: list[int]) -> None:
        self.threads, self.cached = threads, False

    def get_credentials_and_project_id(self):
        if not self.cached:
            self.threads.append(threading.get_ident())
            self.cached = True
        return object(), "p"


def async_hook_class(threads: list[int], made_in: list[int]):
    class AsyncHook:  # what a provider's async Google hook does with its sync hook
        def __init__(self, **kwargs) -> None:
            made_in.append(threading.get_ident())
            self.sync = SyncHook(threads)

        async def get_sync_hook(self):
            return self.sync

        async def get_storage_client(self, session):  # GCSAsyncHook: the token reads the credentials here
            self.sync.get_credentials_and_project_id()
            return object()

        async def get_token(self):  # GKEKubernetesAsyncHook's _load_config, through _CredentialsToken.from_hook
            self.sync.get_credentials_and_project_id()

        async def get_conn_extras(self):  # AsyncKubernetesHook: its connection's extras, read once and kept
            return {}

    return AsyncHook


def loop_thread(work) -> int:
    async def run():
        await work()
        return threading.get_ident()

    return asyncio.run(run())


def test_the_storage_reader_reads_the_credentials_off_the_loop(monkeypatch):
    from airflow.providers.google.cloud.hooks import gcs as provider

    from tpu_rl.hooks.gcs import GcsReadHook

    threads: list[int] = []
    monkeypatch.setattr(provider, "GCSAsyncHook", async_hook_class(threads, []))

    async def read():
        async with GcsReadHook().reader("bucket"):
            pass

    loop = loop_thread(read)
    assert threads and threads[0] != loop


@pytest.mark.parametrize("gke", [True, False])
def test_a_kubernetes_hook_is_made_and_its_credentials_read_off_the_loop(monkeypatch, gke):
    from airflow.providers.cncf.kubernetes.hooks import kubernetes as cncf
    from airflow.providers.google.cloud.hooks import kubernetes_engine as provider

    from tpu_rl.hooks.kubernetes import AsyncKubernetesApiHook, ClusterTarget

    threads: list[int] = []
    made_in: list[int] = []
    monkeypatch.setattr(provider, "GKEKubernetesAsyncHook", async_hook_class(threads, made_in))
    monkeypatch.setattr(cncf, "AsyncKubernetesHook", async_hook_class([], made_in))
    target = (
        ClusterTarget(project_id="p", location="us-east5", cluster_name="c").with_endpoint("https://1.2.3.4", "Q0E=")
        if gke
        else ClusterTarget(kubernetes_conn_id="kubernetes_default")
    )
    hook = AsyncKubernetesApiHook(target)

    async def connect():
        await (await hook.ready()).get_token()

    loop = loop_thread(connect)
    assert made_in and made_in[0] != loop
    if gke:
        assert threads and threads[0] != loop
