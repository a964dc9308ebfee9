# Shared settings and process helpers for sim/up.sh, sim/down.sh and sim/status.sh (sourced, not run).
# Every process the simulation starts is recorded in $SIM/pids/<name>.pid; nothing is ever stopped by name.

SIM_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SIM_SRC/.." && pwd)
# shellcheck source=versions.env
source "$SIM_SRC/versions.env"
CACHE=${TPU_RL_SIM_CACHE:-$HOME/.cache/tpu-rl-sim}
SIM=${TPU_RL_SIM_DIR:-$REPO/.sim}
PY=${TPU_RL_SIM_PYTHON:-$REPO/.venv/bin/python}
# sim/ is the package `sim`: its modules run as `"$PY" -m sim.NAME`, found from the checkout.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# Ports: fixed by default, each overridable. Everything listens on 127.0.0.1 only.
ETCD_PORT=${TPU_RL_SIM_ETCD_PORT:-23790}
ETCD_PEER_PORT=${TPU_RL_SIM_ETCD_PEER_PORT:-23800}
APISERVER_PORT=${TPU_RL_SIM_APISERVER_PORT:-16443}
KCM_PORT=${TPU_RL_SIM_KCM_PORT:-20257}
SCHEDULER_PORT=${TPU_RL_SIM_SCHEDULER_PORT:-20259}
KWOK_PORT=${TPU_RL_SIM_KWOK_PORT:-20250}
JOBSET_WEBHOOK_PORT=${TPU_RL_SIM_JOBSET_WEBHOOK_PORT:-19443}
JOBSET_HEALTH_PORT=${TPU_RL_SIM_JOBSET_HEALTH_PORT:-18081}
# Cloud Storage: the clients' port is a front that can answer transient errors (sim/storage_faults.py); behind
# it, fake-gcs-server.
GCS_PORT=${TPU_RL_SIM_GCS_PORT:-14443}
GCS_SERVER_PORT=${TPU_RL_SIM_GCS_SERVER_PORT:-14444}
# GKE emulator: CONNECT proxy (the clients' grpc_proxy and HTTPS_PROXY), its gRPC/TLS server, the OAuth token
# endpoint, the clusters' DNS-based control-plane endpoints.
GKE_PROXY_PORT=${TPU_RL_SIM_GKE_PROXY_PORT:-14480}
GKE_GRPC_PORT=${TPU_RL_SIM_GKE_GRPC_PORT:-14481}
GKE_TOKEN_PORT=${TPU_RL_SIM_GKE_TOKEN_PORT:-14482}
GKE_DNS_PORT=${TPU_RL_SIM_GKE_DNS_PORT:-14483}

KUBECONFIG_PATH=$SIM/kubeconfig
PKI=$SIM/pki

# The components, in start order (down.sh stops them in reverse).
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok jobset gcs-server gcs maxtext-emulator gke)

bin() { echo "$CACHE/$1/bin/$2"; }

pidfile() { echo "$SIM/pids/$1.pid"; }

# A pidfile holds "PID STARTTIME" (starttime: field 22 of /proc/PID/stat), so a recycled pid never matches.
starttime() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null; }

# pid_of NAME: prints the recorded pid if that very process is still alive.
pid_of() {
  local f pid st
  f=$(pidfile "$1")
  [ -f "$f" ] || return 1
  read -r pid st <"$f" || true
  [ -n "$pid" ] && [ "$(starttime "$pid")" = "$st" ] || return 1
  echo "$pid"
}

# start NAME CMD...: starts CMD in the background in its own session, logs to $SIM/logs/NAME.log, records the pid.
start() {
  local name=$1 pid; shift
  mkdir -p "$SIM/logs" "$SIM/pids"
  setsid "$@" >>"$SIM/logs/$name.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid $(starttime "$pid")" >"$(pidfile "$name")"
  echo "started $name (pid $pid)"
}

# Health probes, one per component; each returns 0 when the component answers.
https_ok() { curl -sf --max-time 2 --cacert "$PKI/ca.crt" "$@" >/dev/null 2>&1; }
health() {
  case $1 in
    etcd) curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"' ;;
    kube-apiserver) https_ok --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:$APISERVER_PORT/readyz" ;;
    kube-controller-manager) curl -sfk --max-time 2 "https://127.0.0.1:$KCM_PORT/healthz" >/dev/null ;;
    kube-scheduler) curl -sfk --max-time 2 "https://127.0.0.1:$SCHEDULER_PORT/healthz" >/dev/null ;;
    kwok) curl -sfk --max-time 2 "https://127.0.0.1:$KWOK_PORT/healthz" >/dev/null ;;
    # Up when the manager's probe answers and the webhook server completes TLS with our CA-signed cert.
    jobset) curl -sf --max-time 2 "http://127.0.0.1:$JOBSET_HEALTH_PORT/readyz" >/dev/null &&
      [ "$(curl -s --max-time 2 --cacert "$PKI/ca.crt" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$JOBSET_WEBHOOK_PORT/")" != 000 ] ;;
    gcs-server) curl -sf --max-time 2 "http://127.0.0.1:$GCS_SERVER_PORT/storage/v1/b?project=tpu-rl-sim" >/dev/null ;;
    gcs) curl -sf --max-time 2 "http://127.0.0.1:$GCS_PORT/storage/v1/b?project=tpu-rl-sim" >/dev/null ;;
    # Up when the token endpoint answers (it starts after the gRPC server and the proxy).
    gke) curl -sf --max-time 2 "http://127.0.0.1:$GKE_TOKEN_PORT/healthz" >/dev/null ;;
    maxtext-emulator) [ -f "$SIM/run/maxtext-emulator.heartbeat" ] &&
      [ $(( $(date +%s) - $(stat -c %Y "$SIM/run/maxtext-emulator.heartbeat") )) -lt 30 ] ;;
    *) return 1 ;;
  esac
}

# wait_healthy NAME [SECONDS]: waits for the health probe; fails early if the process died.
wait_healthy() {
  local name=$1 deadline=$((SECONDS + ${2:-60}))
  until health "$name"; do
    if ! pid_of "$name" >/dev/null; then
      echo "$name exited; last log lines:" >&2
      tail -n 30 "$SIM/logs/$name.log" >&2
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "$name not healthy after ${2:-60} s; last log lines:" >&2
      tail -n 30 "$SIM/logs/$name.log" >&2
      return 1
    fi
    sleep 0.3
  done
}
