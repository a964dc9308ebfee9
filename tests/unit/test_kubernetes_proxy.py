"""The Kubernetes hook's client in the environment a deployment gives it: ``HTTPS_PROXY`` for the clusters'
DNS-based endpoints, ``NO_PROXY`` for the hosts reached directly, ``SSL_CERT_FILE`` for the CAs to trust (the
simulation runs so: sim/cluster.py). kubernetes 34.1 (make test-compat's, Composer 3.1.7's line) drops ``NO_PROXY``
when it builds its Configuration and trusts certifi's bundle alone; 35 and later honour both."""

from __future__ import annotations

from types import SimpleNamespace

import urllib3

from tpu_rl.hooks.kubernetes import ClusterTarget, KubernetesApiHook

CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
TARGET = ClusterTarget(project_id="my-project", location="us-east5", cluster_name="qwen-rl")


def client_for(monkeypatch, host: str):
    """The hook's client of a cluster at ``host``, made by the kubernetes client of this install."""
    from kubernetes import client as k8s

    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("SSL_CERT_FILE", CA_FILE)
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


def test_a_server_whose_ca_the_kubeconfig_does_not_pin_is_checked_against_ssl_cert_file(monkeypatch):
    """A DNS-based endpoint's certificate is public: no CA in the kubeconfig, the environment's trust store."""
    client = client_for(monkeypatch, "https://gke-0123.us-east5.gke.goog")
    assert client.rest_client.pool_manager.connection_pool_kw["ca_certs"] == CA_FILE
