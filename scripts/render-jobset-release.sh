#!/usr/bin/env bash
# Renders JobSet's release manifests (the `manifests.yaml` of a GitHub release) from the Go module
# source, the way JobSet's release checklist does: `make prepare-release-branch` sets the manager image
# (`kustomize edit set image controller=...` in config/components/manager), then `make artifacts` runs
# `kustomize build config/default`. The kustomize version is the one the module's Makefile pins, built
# from the Go module proxy into the simulation's cache (never into git).
#   scripts/render-jobset-release.sh v0.10.1   ->  src/tpu_rl/releases/jobset-v0.10.1.yaml
set -euo pipefail
version=${1:?usage: render-jobset-release.sh VERSION (e.g. v0.10.1)}
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${TPU_RL_SIM_CACHE:-$HOME/.cache/tpu-rl-sim}
image=registry.k8s.io/jobset/jobset:$version
out=$repo/src/tpu_rl/releases/jobset-$version.yaml
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local

mkdir -p "$cache"
# `go mod download mod@version` (not `go install`): the proxy mirror refuses version-list queries.
src=$(cd "$cache" && go mod download -json "sigs.k8s.io/jobset@$version" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
kustomize_version=$(sed -n 's/^KUSTOMIZE_VERSION ?= *//p' "$src/Makefile")
kustomize=$cache/kustomize-$kustomize_version/bin/kustomize
if [ ! -x "$kustomize" ]; then
  echo "building kustomize $kustomize_version (JobSet $version's Makefile pin) ..."
  GOBIN=$(dirname "$kustomize") go install -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$kustomize_version"
fi

# The module cache is read-only: edit a copy of the config tree.
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
cp -r "$src/config" "$work/"
chmod -R u+w "$work"
(cd "$work/config/components/manager" && "$kustomize" edit set image "controller=$image")
mkdir -p "$(dirname "$out")"
"$kustomize" build "$work/config/default" -o "$out"
echo "wrote $out ($(grep -c '^kind:' "$out") objects, image $image, kustomize $kustomize_version)"
