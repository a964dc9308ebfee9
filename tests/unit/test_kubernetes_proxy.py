"""The Kubernetes hook's client behind an egress proxy: ``HTTPS_PROXY`` for the clusters' DNS-based endpoints,
``NO_PROXY`` for the hosts reached directly (the simulation runs so: sim/cluster.py). kubernetes 34.1 (make
test-compat's, Composer 3.1.7's line) drops ``NO_PROXY`` when it builds its Configuration; 35 and later keep it."""

from __future__ import annotations

from types import SimpleNamespace

import urllib3

from tpu_rl.hooks.kubernetes import ClusterTarget, KubernetesApiHook

TARGET = ClusterTarget(project_id="my-project", location="us-east5", cluster_name="qwen-rl")


def client_for(monkeypatch, host: str):
    """The hook's client of a cluster at ``host``, made by the kubernetes client of this install."""
    from kubernetes import client as k8s

    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    configuration = k8s.Configuration()
    configuration.host = host
    api = k8s.ApiClient(configuration)
    monkeypatch.setattr(KubernetesApiHook, "kube_hook", property(lambda self: SimpleNamespace(get_conn=lambda: api)))
    return KubernetesApiHook(TARGET).api_client()


def test_a_cluster_no_proxy_names_is_reached_directly_and_another_through_the_proxy(monkeypatch):
    direct = client_for(monkeypatch, "https://127.0.0.1:6443")
    assert not isinstance(direct.rest_client.pool_manager, urllib3.ProxyManager)
    assert direct.rest_client.pool_manager.connection_pool_kw["retries"].total  # the hook's retries still apply
    proxied = client_for(monkeypatch, "https://gke-0123.us-east5.gke.goog")
    assert isinstance(proxied.rest_client.pool_manager, urllib3.ProxyManager)
    assert proxied.rest_client.pool_manager.proxy.port == 3128
