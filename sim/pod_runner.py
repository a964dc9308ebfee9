"""Runs, as local processes, the containers of a simulated cluster's pods that the simulation has a real
binary for: today the JobSet controller (`registry.k8s.io/jobset/jobset:vX` -> $CACHE/jobset-vX/bin/jobset).

    pod_runner.py --cluster-dir DIR --kubeconfig ADMIN_KUBECONFIG --apiserver 127.0.0.1:PORT

Started per cluster by sim/control_plane.py. kwok makes pods Running and gives them a loopback pod IP;
this does what a kubelet and kube-proxy would do for the few pods that must really work:

- a pod Running with a podIP and a runnable image gets a process, stopped when the pod is gone or no
  longer Running (and restarted with a back-off if it exits, as restartPolicy Always would);
- in a private mount namespace (`unshare --mount`), like a container: ConfigMap and Secret volumes at
  their mountPaths under a tmpfs /tmp, the service-account token (TokenRequest, bound to the pod),
  namespace and CA at /var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT
  pointing at the apiserver: so the release's RBAC is what the controller gets;
- Secret volumes are re-synced every second (JobSet's internal cert management writes its webhook cert
  into a Secret and waits for the mounted files, like kubelet's secret volume sync);
- the controller's Configuration file is rewritten only where a local process must differ: the webhook,
  health probe and metrics servers bind the pod IP (not every interface), certDir is the mounted secret;
- a Service with a loopback ClusterIP that selects such a pod is served on ClusterIP:port and forwarded
  to podIP:targetPort (kube-proxy's job): the apiserver reaches webhooks at their Service's ClusterIP.

Nothing here dials or binds a non-loopback address: every address is checked to be in 127.0.0.0/8.
"""

import argparse
import ipaddress
import json
import os
import shlex
import signal
import socket
import socketserver
import threading
import time
from pathlib import Path

from .control_plane import CACHE, PKI, spawn, terminate

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_ROOT = "/run/pod"
TOKEN_SECONDS = 3600


def loopback(ip):
    return ipaddress.ip_address(ip) in ipaddress.ip_network("127.0.0.0/8")


def runnable_binary(image):
    """The cached binary that is this image's entrypoint, or None."""
    repo, _, tag = image.rpartition(":")
    if repo == "registry.k8s.io/jobset/jobset":
        path = CACHE / f"jobset-{tag}" / "bin" / "jobset"
        return path if path.exists() else None
    return None


def jobset_config(cfg, pod_ip, cert_dir):
    """JobSet's Configuration with the servers on the pod IP instead of every interface."""
    cfg = dict(cfg or {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration"})
    port = lambda addr, default: (addr or f":{default}").rpartition(":")[2] or default  # noqa: E731
    webhook = dict(cfg.get("webhook") or {})
    cfg["webhook"] = {**webhook, "host": pod_ip, "port": webhook.get("port", 9443), "certDir": cert_dir}
    health = dict(cfg.get("health") or {})
    health["healthProbeBindAddress"] = f"{pod_ip}:{port(health.get('healthProbeBindAddress'), 8081)}"
    cfg["health"] = health
    metrics = dict(cfg.get("metrics") or {})
    if metrics.get("bindAddress") != "0":
        metrics["bindAddress"] = f"{pod_ip}:{port(metrics.get('bindAddress'), 8443)}"
    cfg["metrics"] = metrics
    return cfg


class Forwarder(socketserver.ThreadingTCPServer):
    """ClusterIP:port -> podIP:targetPort, both on loopback (a userspace kube-proxy for one port)."""

    daemon_threads = allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, listen, target):
        assert loopback(listen[0]) and loopback(target[0]), (listen, target)
        self.target = target
        super().__init__(listen, _Forward)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self):
        self.shutdown()
        self.server_close()


class _Forward(socketserver.BaseRequestHandler):
    def handle(self):
        try:
            upstream = socket.create_connection(self.server.target, timeout=5)
        except OSError:
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
        back.start()
        _pipe(self.request, upstream)
        back.join()
        upstream.close()


def _pipe(src, dst):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Container:
    """One running container of one pod: its files, its process, its token."""

    def __init__(self, runner, pod, container, binary):
        self.runner, self.pod, self.spec, self.binary = runner, pod, container, binary
        meta = pod["metadata"]
        self.ns, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.key = f"pod-{self.ns}-{self.name}-{container['name']}"
        self.dir = runner.cluster_dir / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}" / container["name"]
        self.ip = pod["status"]["podIP"]
        assert loopback(self.ip), self.ip
        self.token_at = 0.0
        self.started_at = 0.0
        self.failures = 0
        self.proc = None

    # files ------------------------------------------------------------------------------------
    def volumes(self):
        """(volume, mountPath, subPath) for each mount of a ConfigMap or Secret volume."""
        by_name = {v["name"]: v for v in self.pod["spec"].get("volumes", [])}
        for mount in self.spec.get("volumeMounts", []):
            vol = by_name.get(mount["name"], {})
            if "configMap" in vol or "secret" in vol:
                yield vol, mount["mountPath"], mount.get("subPath")

    def sync_volumes(self):
        for vol, _, _ in self.volumes():
            if "secret" in vol:
                src, optional = vol["secret"]["secretName"], vol["secret"].get("optional", False)
                data = self.runner.read("secrets", self.ns, src, optional)
                files = {k: _b64(v) for k, v in (data or {}).get("data", {}).items()}
            else:
                src, optional = vol["configMap"]["name"], vol["configMap"].get("optional", False)
                data = self.runner.read("configmaps", self.ns, src, optional) or {}
                files = {k: v.encode() for k, v in data.get("data", {}).items()}
                files.update({k: _b64(v) for k, v in data.get("binaryData", {}).items()})
            src_items = (vol.get("secret") or vol.get("configMap")).get("items")
            if src_items:
                files = {i["path"]: files[i["key"]] for i in src_items if i["key"] in files}
            _write_dir(self.dir / "volumes" / vol["name"], files)

    def refresh_token(self):
        if time.time() - self.token_at < TOKEN_SECONDS / 3:
            return
        sa = self.pod["spec"].get("serviceAccountName", "default")
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
            },
        }
        out = self.runner.call("POST", f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token", request)
        _write_dir(
            self.dir / "serviceaccount",
            {
                "token": out["status"]["token"].encode(),
                "namespace": self.ns.encode(),
                "ca.crt": (PKI / "ca.crt").read_bytes(),
            },
        )
        self.token_at = time.time()

    def argv(self):
        """The container's args with --config pointing at the rewritten Configuration (in /run/pod)."""
        import yaml

        args, config_src, rest = list(self.spec.get("args", [])), None, []
        for i, arg in enumerate(args):
            if arg.startswith("--config="):
                config_src = arg.partition("=")[2]
            elif arg == "--config" or (i and args[i - 1] == "--config"):
                config_src = arg if arg != "--config" else config_src
            else:
                rest.append(arg)
        cfg = yaml.safe_load(self.container_file(config_src).read_text()) if config_src else None
        cert_dir = ((cfg or {}).get("webhook") or {}).get("certDir", "/tmp/k8s-webhook-server/serving-certs")
        (self.dir / "config.yaml").write_text(yaml.safe_dump(jobset_config(cfg, self.ip, cert_dir)))
        return [f"{POD_ROOT}/bin/entrypoint", f"--config={POD_ROOT}/config.yaml", *rest]

    def container_file(self, path):
        """Where a path of the container's filesystem is in our volume directories."""
        for vol, mount_path, sub_path in self.volumes():
            local = self.dir / "volumes" / vol["name"]
            if sub_path and path == mount_path:
                return local / sub_path
            if not sub_path and (path + "/").startswith(mount_path.rstrip("/") + "/"):
                return local / path[len(mount_path) :].lstrip("/")
        raise FileNotFoundError(f"{path} is in no ConfigMap or Secret volume of {self.ns}/{self.name}")

    def mount_script(self):
        """sh commands building the container's view in a private mount namespace: this pod's dir at
        /run/pod (bound before /tmp is hidden: the simulation may live in /tmp), the binary as
        /run/pod/bin/entrypoint, private /run and /tmp, the service account, volumes under /tmp."""
        q = lambda p: shlex.quote(str(p))  # noqa: E731
        lines = [
            "set -e",
            "mount --make-rprivate /",
            "mount -t tmpfs tmpfs /run",
            f"mkdir -p {POD_ROOT}",
            f"mount --bind {q(self.dir)} {POD_ROOT}",
            f"mount --bind {q(self.binary)} {POD_ROOT}/bin/entrypoint",
            "mount -t tmpfs tmpfs /tmp",
            f"mkdir -p {SA_DIR}",
            f"mount --bind {POD_ROOT}/serviceaccount {SA_DIR}",
        ]
        for vol, mount_path, sub_path in self.volumes():
            # Files at the image's root (/controller_manager_config.yaml) are reached through --config.
            if not sub_path and mount_path.startswith("/tmp/"):
                lines += [
                    f"mkdir -p {q(mount_path)}",
                    f"mount --bind {POD_ROOT}/volumes/{q(vol['name'])} {q(mount_path)}",
                ]
        return "\n".join(lines + ['exec "$@"'])

    # process ----------------------------------------------------------------------------------
    def start(self):
        (self.dir / "bin").mkdir(parents=True, exist_ok=True)
        (self.dir / "bin" / "entrypoint").touch()  # the mount point of the binary
        self.sync_volumes()
        self.refresh_token()
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": "/tmp",
            "KUBERNETES_SERVICE_HOST": self.runner.apiserver[0],
            "KUBERNETES_SERVICE_PORT": self.runner.apiserver[1],
        }
        env.update({e["name"]: e["value"] for e in self.spec.get("env", []) if "value" in e})
        unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
        self.proc = spawn(
            self.key,
            [*unshare, "sh", "-c", self.mount_script(), "sh", *self.argv()],
            self.runner.cluster_dir / "pids",
            self.runner.cluster_dir / "logs",
            env=env,
        )
        self.started_at = time.time()
        print(f"started {self.ns}/{self.name} {self.spec['name']} (pid {self.proc.pid}, pod IP {self.ip})", flush=True)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is not None:
            terminate([self.proc.pid], grace=float(self.pod["spec"].get("terminationGracePeriodSeconds", 10)))
            self.proc.wait()
            print(f"stopped {self.ns}/{self.name} {self.spec['name']} (exit {self.proc.returncode})", flush=True)
        (self.runner.cluster_dir / "pids" / f"{self.key}.pid").unlink(missing_ok=True)


class Runner:
    def __init__(self, cluster_dir, kubeconfig, apiserver):
        from kubernetes import client, config

        self.cluster_dir = Path(cluster_dir)
        self.api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        host, _, port = apiserver.rpartition(":")
        assert loopback(host), apiserver
        self.apiserver = (host, port)
        self.containers: dict[str, Container] = {}
        self.forwarders: dict[tuple, Forwarder] = {}
        self.stopping = False

    def call(self, method, path, body=None):
        resp = self.api.call_api(
            path,
            method,
            body=body,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
        )
        return json.loads((resp[0] if isinstance(resp, tuple) else resp).data)  # client versions differ

    def read(self, plural, ns, name, optional):
        from kubernetes.client.exceptions import ApiException

        try:
            return self.call("GET", f"/api/v1/namespaces/{ns}/{plural}/{name}")
        except ApiException as e:
            if e.status == 404 and optional:
                return None
            raise

    def wanted(self):
        """key -> (pod, container, binary) for the containers that should run now."""
        pods = self.call("GET", "/api/v1/pods?fieldSelector=status.phase%3DRunning")["items"]
        out = {}
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp") or not pod["status"].get("podIP"):
                continue
            for c in pod["spec"]["containers"]:
                binary = runnable_binary(c.get("image", ""))
                if binary:
                    out[f"{pod['metadata']['uid']}/{c['name']}"] = (pod, c, binary)
        return out

    def step(self):
        wanted = self.wanted()
        for key in list(self.containers):
            if key not in wanted:
                self.containers.pop(key).stop()
        for key, (pod, spec, binary) in wanted.items():
            c = self.containers.get(key)
            if c is None:
                c = self.containers[key] = Container(self, pod, spec, binary)
            c.pod = pod
            try:
                if not c.alive():
                    # restartPolicy Always, with a back-off doubling from 1 s to 30 s
                    if c.proc is not None:
                        c.failures += 1
                        print(f"{c.key} exited with {c.proc.returncode}", flush=True)
                        c.proc = None
                    if time.time() - c.started_at >= min(30, 2**c.failures / 2):
                        c.start()
                else:
                    c.sync_volumes()
                    c.refresh_token()
            except Exception as e:  # a missing ConfigMap, a refused token: retried next second
                print(f"{c.key}: {type(e).__name__}: {e}", flush=True)
        self.sync_forwarders()

    def sync_forwarders(self):
        """Serve the loopback ClusterIP:port of every Service that selects a pod we run."""
        want = {}
        pods = [c.pod for c in self.containers.values() if c.alive()]
        if pods:
            for svc in self.call("GET", "/api/v1/services")["items"]:
                spec, selector = svc["spec"], svc["spec"].get("selector") or {}
                ip = spec.get("clusterIP")
                if not selector or not ip or ip == "None" or not loopback(ip):
                    continue
                for pod in pods:
                    labels = pod["metadata"].get("labels", {})
                    if pod["metadata"]["namespace"] == svc["metadata"]["namespace"] and all(
                        labels.get(k) == v for k, v in selector.items()
                    ):
                        for port in spec.get("ports", []):
                            target = _target_port(pod, port)
                            if target:
                                want[(ip, port["port"])] = (pod["status"]["podIP"], target)
        for listen in list(self.forwarders):
            if want.get(listen) != self.forwarders[listen].target:
                self.forwarders.pop(listen).close()
        for listen, target in want.items():
            if listen not in self.forwarders:
                try:
                    self.forwarders[listen] = Forwarder(listen, target)
                    print(f"service {listen[0]}:{listen[1]} -> {target[0]}:{target[1]}", flush=True)
                except OSError as e:
                    print(f"cannot serve {listen}: {e}", flush=True)

    def run(self):
        beat = self.cluster_dir / "run" / "pod-runner.heartbeat"
        beat.parent.mkdir(parents=True, exist_ok=True)
        while not self.stopping:
            try:
                self.step()
            except Exception as e:  # the apiserver restarting: try again
                print(f"step failed: {type(e).__name__}: {e}", flush=True)
            beat.touch()
            time.sleep(1)
        for c in self.containers.values():
            c.stop()
        for f in self.forwarders.values():
            f.close()


def _target_port(pod, port):
    target = port.get("targetPort", port["port"])
    if isinstance(target, int):
        return target
    for c in pod["spec"]["containers"]:
        for p in c.get("ports", []):
            if p.get("name") == target:
                return p["containerPort"]
    return None


def _b64(text):
    import base64

    return base64.b64decode(text)


def _write_dir(path, files):
    """Make directory `path` hold exactly `files` (name -> bytes); each file replaced atomically."""
    path.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() and target.read_bytes() == content:
            continue
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(content)
        tmp.rename(target)
    for old in path.iterdir():
        if old.is_file() and not old.name.startswith(".") and old.name not in files:
            old.unlink()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster-dir", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--apiserver", required=True)
    args = parser.parse_args()
    runner = Runner(args.cluster_dir, args.kubeconfig, args.apiserver)

    def stop(*_):
        runner.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runner.run()


if __name__ == "__main__":
    main()
