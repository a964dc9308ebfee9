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
rm -f "$SIM/run/maxtext-emulator.heartbeat"
if [ "${1:-}" = --purge ]; then
  rm -rf "$SIM/data" "$SIM/run" "$SIM/podlogs"
  echo "deleted $SIM/data, $SIM/run, $SIM/podlogs"
fi
