#!/usr/bin/env bash
# Stops the simulation: only the processes whose pids sim/up.sh recorded in .sim/pids, newest first.
# State (.sim/data, pki, logs) is kept; `sim/down.sh --purge` also deletes .sim/data (etcd and GCS
# contents), the emulator's record of handled pods and the pod logs.
set -uo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
  name=${COMPONENTS[i]}
  if pid=$(pid_of "$name"); then
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "$name (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
      kill -KILL "$pid"
    fi
    echo "stopped $name (pid $pid)"
  fi
  rm -f "$(pidfile "$name")"
done
# The control planes the GKE emulator started for its clusters (their pids, same format, under
# $SIM/gke/clusters/<name>/pids); they come back when the emulator restarts (state in $SIM/gke/state.json).
for f in "$SIM"/gke/clusters/*/pids/*.pid; do
  [ -f "$f" ] || continue
  read -r pid st <"$f" || true
  if [ -n "$pid" ] && [ "$(starttime "$pid")" = "$st" ]; then
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "stopped $(basename "$(dirname "$(dirname "$f")")")/$(basename "$f" .pid) (pid $pid)"
  fi
  rm -f "$f"
done
rm -f "$SIM/run/maxtext-emulator.heartbeat"
if [ -f "$SIM/run/inotify-instances" ]; then  # the host's limit sim/up.sh raised
  cat "$SIM/run/inotify-instances" > /proc/sys/fs/inotify/max_user_instances 2>/dev/null || true
  rm -f "$SIM/run/inotify-instances"
fi
if [ "${1:-}" = --purge ]; then
  # $SIM/gke/service-account.json and token-secret stay (the Airflow connection names the key file).
  rm -rf "$SIM/data" "$SIM/run" "$SIM/podlogs" "$SIM/gke/clusters" "$SIM/gke/state.json" "$SIM/gke/faults.json" \
    "$SIM/gcs/faults.json"
  echo "deleted $SIM/data, $SIM/run, $SIM/podlogs, GKE emulator state"
fi
