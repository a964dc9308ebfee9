"""A fresh Kubernetes control plane per simulated GKE cluster (used by the GKE emulator, sim/gke_project.py).

Each cluster gets its own kube-apiserver on the simulation's shared etcd (`--etcd-prefix=/gke/<name>`),
kube-controller-manager, kube-scheduler, kwok, a MaxText emulator and a pod runner (sim/pod_runner.py),
all on loopback. No JobSet: the pipeline installs JobSet's release itself, and the pod runner makes its
controller Deployment really run. State lives in $SIM/gke/clusters/<name>/ (pids/, logs/, run/, pki/).

Ports (slot 0..49): apiserver 17000+10*slot, controller-manager +1, scheduler +2, kwok +3.
Pod IPs 127.<100+slot>.0.0/16 (kwok --cidr), Service IPs 127.<200+slot>.0.0/16: every address a
component of this cluster can be told to dial is on loopback.
"""

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

SRC = Path(__file__).resolve().parent
REPO = SRC.parent
SIM = Path(os.environ.get("TPU_RL_SIM_DIR", REPO / ".sim"))
CACHE = Path(os.environ.get("TPU_RL_SIM_CACHE", Path.home() / ".cache" / "tpu-rl-sim"))
ETCD_PORT = int(os.environ.get("TPU_RL_SIM_ETCD_PORT", "23790"))
GCS_PORT = int(os.environ.get("TPU_RL_SIM_GCS_PORT", "14443"))
PYTHON = os.environ.get("TPU_RL_SIM_PYTHON", sys.executable)
#: The environment a module of the package ``sim`` runs in (``python -m sim.NAME``): the checkout on its path.
PACKAGE_PATH = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
PKI = SIM / "pki"
FIELD_MANAGER = "tpu-rl-sim"


def _versions():
    """sim/versions.env, the file sim/lib.sh sources (NAME=value lines)."""
    out = {}
    for line in (SRC / "versions.env").read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out[name.strip()] = value.strip()
    return out


VERSIONS = _versions()
KUBE_BIN = CACHE / f"kube-{VERSIONS['KUBE_VERSION']}" / "bin"
KWOK_DIR = CACHE / f"kwok-{VERSIONS['KWOK_VERSION']}"


def _starttime(pid):
    """Field 22 of /proc/PID/stat: with the pid, it identifies a process (pids are recycled)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def recorded_pid(pidfile):
    """The pid recorded in a "PID STARTTIME" file (sim/lib.sh's format) if that very process is alive."""
    try:
        pid, start = Path(pidfile).read_text().split()
    except (OSError, ValueError):
        return None
    return int(pid) if _starttime(pid) == start else None


#: Environment variables (lower-cased) that aim clients at the simulation's egress proxy and trust store.
CLIENT_EGRESS = {"https_proxy", "http_proxy", "no_proxy", "grpc_proxy", "ssl_cert_file"}


def spawn(name, argv, pids_dir, logs_dir, env=None):
    """Starts argv in its own session, logging to logs_dir/NAME.log; records "PID STARTTIME" in pids_dir."""
    Path(pids_dir).mkdir(parents=True, exist_ok=True)
    Path(logs_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(logs_dir) / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    (Path(pids_dir) / f"{name}.pid").write_text(f"{proc.pid} {_starttime(proc.pid)}\n")
    return proc


def terminate(pids, grace=10.0):
    """SIGTERM to each pid in order, then SIGKILL to those still alive after `grace` seconds."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace
    for pid in pids:
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)


def process_alive(pid):
    """True while pid runs (a zombie is not running; our own zombies are reaped on the way)."""
    return _alive(pid)


def _alive(pid):
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    state = Path(f"/proc/{pid}/stat")
    try:
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class ControlPlane:
    """One simulated GKE cluster's Kubernetes control plane, as local processes on loopback."""

    # Start order; stop() goes newest first.
    COMPONENTS = (
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "maxtext-emulator",
        "pod-runner",
    )

    def __init__(self, name: str, slot: int):
        if not 0 <= slot <= 49:
            raise ValueError(f"slot {slot}: must be 0..49 (ports 17000+10*slot, IPs 127.<100|200+slot>.x)")
        self.name, self.slot = name, slot
        self.dir = SIM / "gke" / "clusters" / name
        self.port = 17000 + 10 * slot
        self.ports = {
            "kube-apiserver": self.port,
            "kube-controller-manager": self.port + 1,
            "kube-scheduler": self.port + 2,
            "kwok": self.port + 3,
        }
        self.pod_cidr = f"127.{100 + slot}.0.0/16"
        self.service_cidr = f"127.{200 + slot}.0.0/16"
        self.etcd_prefix = f"/gke/{name}"

    # --- public API -------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        return (PKI / "ca.crt").read_bytes()

    @property
    def kubeconfig(self) -> str:
        """Admin kubeconfig (the simulation's admin client cert, group system:masters)."""
        return str(self.dir / "kubeconfig")

    def start(self, tokens: dict[str, str]) -> None:
        """Starts what is not alive; returns once the apiserver answers and the bootstrap objects exist.

        tokens: bearer token -> user name. Each user is bound to the cluster-admin ClusterRole (as GKE
        grants the cluster's creator), never put in system:masters. Changed tokens restart the apiserver
        (it reads --token-auth-file only at start)."""
        for d in ("pids", "logs", "run", "pki"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        self._write_files(tokens)
        if self._pid("kube-apiserver") and self._tokens_changed:
            terminate([self._pid("kube-apiserver")])
        self._launch("kube-apiserver", self._apiserver_argv())
        self._wait(lambda: self._healthy("kube-apiserver"), 60, "kube-apiserver")
        self._bootstrap(tokens)
        self._launch("kube-controller-manager", self._controller_manager_argv())
        self._launch("kube-scheduler", self._scheduler_argv())
        self._launch("kwok", self._kwok_argv())
        env = self._emulators_env()
        self._launch("maxtext-emulator", [PYTHON, "-u", "-m", "sim.maxtext_emulator"], env=env)
        self._launch("pod-runner", self._pod_runner_argv(), env=env)

    def wait_ready(self, timeout: float = 60) -> None:
        """Waits until every component answers its health probe; raises TimeoutError naming the laggard."""
        deadline = time.time() + timeout
        for name in self.COMPONENTS:
            self._wait(lambda n=name: self._healthy(n), max(0.0, deadline - time.time()), name)

    def alive(self) -> bool:
        """True when every component's recorded process is alive."""
        return all(self._pid(n) for n in self.COMPONENTS)

    def stop(self, purge: bool = False) -> None:
        """Stops this cluster's processes (pod runner first, then newest first); with purge also deletes
        the cluster's etcd keys and its directory."""
        pids_dir = self.dir / "pids"
        files = sorted(pids_dir.glob("*.pid"), key=lambda f: f.stat().st_mtime, reverse=True)
        files.sort(key=lambda f: f.stem != "pod-runner")  # it would restart the pods' processes
        for f in files:
            pid = recorded_pid(f)
            if pid:
                terminate([pid])
            f.unlink(missing_ok=True)
        if purge:
            self.delete_etcd_keys()
            shutil.rmtree(self.dir, ignore_errors=True)

    def etcd_keys(self) -> int:
        """Number of etcd keys under this cluster's prefix."""
        out = self._etcd("range", {**self._etcd_range(), "count_only": True})
        return int(out.get("count", 0))

    def delete_etcd_keys(self) -> int:
        return int(self._etcd("deleterange", self._etcd_range()).get("deleted", 0))

    # --- files and processes -----------------------------------------------------------------
    def _write_files(self, tokens):
        pki = self.dir / "pki"
        if not (pki / "sa.key").exists():  # a key pair of its own: tokens of one cluster are void in another
            subprocess.run(["openssl", "genrsa", "-out", pki / "sa.key", "2048"], check=True, capture_output=True)
            subprocess.run(
                ["openssl", "rsa", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub"],
                check=True,
                capture_output=True,
            )
        # token,user,uid (the static token file's CSV format); no groups.
        lines = "".join(f"{token},{user},{user}\n" for token, user in sorted(tokens.items()))
        path = self.dir / "tokens.csv"
        self._tokens_changed = path.exists() and path.read_text() != lines
        path.write_text(lines)
        path.chmod(0o600)
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.name,
                    "cluster": {"server": f"https://{self.endpoint}", "certificate-authority": str(PKI / "ca.crt")},
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(PKI / "admin.crt"), "client-key": str(PKI / "admin.key")},
                }
            ],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": "admin"}}],
            "current-context": self.name,
        }
        Path(self.kubeconfig).write_text(json.dumps(kubeconfig, indent=1))  # JSON is YAML
        Path(self.kubeconfig).chmod(0o600)

    def _apiserver_argv(self):
        pki = self.dir / "pki"
        return [
            KUBE_BIN / "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            f"--etcd-prefix={self.etcd_prefix}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={PKI}/apiserver.crt",
            f"--tls-private-key-file={PKI}/apiserver.key",
            f"--client-ca-file={PKI}/ca.crt",
            f"--token-auth-file={self.dir}/tokens.csv",
            f"--requestheader-client-ca-file={PKI}/ca.crt",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={PKI}/front-proxy-client.crt",
            f"--proxy-client-key-file={PKI}/front-proxy-client.key",
            f"--kubelet-client-certificate={PKI}/admin.crt",
            f"--kubelet-client-key={PKI}/admin.key",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki}/sa.pub",
            f"--service-account-signing-key-file={pki}/sa.key",
            # Loopback Service IPs: webhook Services are dialed at their ClusterIP, which the pod
            # runner serves on loopback (see pod_runner.py; EndpointSlices refuse loopback pod IPs,
            # so --enable-aggregator-routing cannot reach the pods).
            f"--service-cluster-ip-range={self.service_cidr}",
            "--enable-aggregator-routing=false",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--enable-admission-plugins=ExtendedResourceToleration",
        ]

    def _kube_client_flags(self):
        """What the controller manager and the scheduler share: the admin kubeconfig, loopback, no leader election."""
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ]

    def _controller_manager_argv(self):
        return [
            KUBE_BIN / "kube-controller-manager",
            *self._kube_client_flags(),
            f"--secure-port={self.ports['kube-controller-manager']}",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.dir}/pki/sa.key",
            f"--root-ca-file={PKI}/ca.crt",
            f"--cluster-signing-cert-file={PKI}/ca.crt",
            f"--cluster-signing-key-file={PKI}/ca.key",
            "--controllers=*",
        ]

    def _scheduler_argv(self):
        return [
            KUBE_BIN / "kube-scheduler",
            *self._kube_client_flags(),
            f"--secure-port={self.ports['kube-scheduler']}",
        ]

    def _kwok_argv(self):
        kwok_port = self.ports["kwok"]
        return [
            KWOK_DIR / "bin" / "kwok",
            f"--kubeconfig={self.kubeconfig}",
            *[f"--config={f}" for f in sorted((SRC / "kwok").glob("*.yaml"))],
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-ip=127.0.0.1",
            f"--node-port={kwok_port}",
            f"--server-address=127.0.0.1:{kwok_port}",
            f"--cidr={self.pod_cidr}",
            f"--tls-cert-file={PKI}/serving.crt",
            f"--tls-private-key-file={PKI}/serving.key",
            "--node-lease-duration-seconds=40",
            "--enable-crds=Logs",
        ]

    def _emulators_env(self):
        """The environment of the MaxText emulator and the pod runner: this cluster's kubeconfig and directory, the
        Cloud Storage emulator, and one fault switch for every simulated cluster: the standing cluster's ConfigMap
        (sim/faults.py), so a test can aim a fault at a workload of a cluster that does not exist yet (rules match
        by name)."""
        return {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "SIM": str(self.dir),
            "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{GCS_PORT}",
            "TPU_RL_SIM_FAULTS_KUBECONFIG": str(SIM / "kubeconfig"),
            **PACKAGE_PATH,
        }

    def _pod_runner_argv(self):
        return [
            PYTHON,
            "-u",
            "-m",
            "sim.pod_runner",
            "--cluster-dir",
            self.dir,
            "--kubeconfig",
            self.kubeconfig,
            "--apiserver",
            self.endpoint,
        ]

    def _pid(self, name):
        return recorded_pid(self.dir / "pids" / f"{name}.pid")

    def _launch(self, name, argv, env=None):
        """Starts a component without the clients' egress settings (.sim/airflow.env's HTTPS_PROXY and
        grpc_proxy): the apiserver reads HTTPS_PROXY too, and would send its webhook calls (to
        *.svc names, not in NO_PROXY) to the GKE emulator's proxy, which refuses them."""
        if not self._pid(name):
            env = {k: v for k, v in (env or os.environ).items() if k.lower() not in CLIENT_EGRESS}
            spawn(name, argv, self.dir / "pids", self.dir / "logs", env=env)

    def _wait(self, probe, timeout, name):
        deadline = time.time() + timeout
        while not probe():
            if not self._pid(name):
                raise RuntimeError(f"{name} of cluster {self.name} exited: {self._log_tail(name)}")
            if time.time() >= deadline:
                raise TimeoutError(f"{name} of cluster {self.name} not healthy: {self._log_tail(name)}")
            time.sleep(0.3)

    def _log_tail(self, name, lines=15):
        try:
            return "\n".join((self.dir / "logs" / f"{name}.log").read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _healthy(self, name):
        if name in ("maxtext-emulator", "pod-runner"):
            beat = self.dir / "run" / f"{name}.heartbeat"
            return beat.exists() and time.time() - beat.stat().st_mtime < 30
        path = "/readyz" if name == "kube-apiserver" else "/healthz"
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.ports[name]}{path}",
                timeout=2,
                context=self._tls(verify=name == "kube-apiserver"),
            ) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    # --- API and etcd over HTTP ---------------------------------------------------------------
    def _tls(self, verify=True):
        ctx = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
        ctx.load_cert_chain(PKI / "admin.crt", PKI / "admin.key")
        if not verify:  # kcm/scheduler/kwok serve self-signed health endpoints
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        return ctx

    def api(self, method, path, body=None, content_type="application/json"):
        """A request to this cluster's apiserver as the admin; returns the decoded JSON answer."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"https://{self.endpoint}{path}",
            data=data,
            method=method,
            headers={"Content-Type": content_type, "Accept": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30, context=self._tls()) as r:
            return json.load(r)

    def apply(self, obj):
        """Server-side apply (JSON is YAML) of one cluster-scoped object."""
        group_version = obj["apiVersion"]
        plural = {"ClusterRoleBinding": "clusterrolebindings", "CustomResourceDefinition": "customresourcedefinitions"}[
            obj["kind"]
        ]
        return self.api(
            "PATCH",
            f"/apis/{group_version}/{plural}/{obj['metadata']['name']}?fieldManager={FIELD_MANAGER}&force=true",
            obj,
            "application/apply-patch+yaml",
        )

    def _bootstrap(self, tokens):
        """kwok's Logs CRD (kwok serves pod logs from Logs objects) and the creators' cluster-admin bindings."""
        import yaml  # in the venv; the CRD file is YAML

        crd = yaml.safe_load((KWOK_DIR / "kwok.x-k8s.io_logs.yaml").read_text())
        self.apply(crd)
        for user in sorted(set(tokens.values())):
            self.apply(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": f"gke-creator-cluster-admin-{_dns_label(user)}"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
                }
            )
        name = crd["metadata"]["name"]

        self._wait(
            lambda: crd_established(self.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")),
            30,
            "kube-apiserver",
        )

    def _etcd_range(self):
        # The apiserver stores keys as <prefix>/<resource>/...; "0" is the byte after "/".
        key = f"{self.etcd_prefix}/".encode()
        return {"key": base64.b64encode(key).decode(), "range_end": base64.b64encode(key[:-1] + b"0").decode()}

    def _etcd(self, op, body):
        req = urllib.request.Request(
            f"http://127.0.0.1:{ETCD_PORT}/v3/kv/{op}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)


def crd_established(crd: dict) -> bool:
    """Whether a CustomResourceDefinition, as the apiserver returns it, is Established. Until the apiserver's
    establishing controller has written a condition, its status reads ``"conditions": null`` (the field has no
    omitempty in apiextensions/v1's CustomResourceDefinitionStatus): not yet established, not an error."""
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def _dns_label(text):
    """A name fit for metadata.name from a user name (e.g. an e-mail address)."""
    import hashlib
    import re

    clean = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].strip("-")
    return f"{clean}-{hashlib.sha256(text.encode()).hexdigest()[:6]}"
