#!/usr/bin/env bash
# Prints each component of the simulation with its pid and health; exit status 0 only if all are healthy.
set -uo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

rc=0
for name in "${COMPONENTS[@]}"; do
  if pid=$(pid_of "$name"); then
    if health "$name"; then state=healthy; else state=UNHEALTHY; rc=1; fi
  else
    pid=-; state=STOPPED; rc=1
  fi
  printf '%-24s pid %-8s %s\n' "$name" "$pid" "$state"
done
if [ $rc = 0 ]; then
  echo "all healthy; KUBECONFIG=$KUBECONFIG_PATH; env file $SIM/airflow.env"
fi
exit $rc
