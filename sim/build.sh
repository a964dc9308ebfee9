#!/usr/bin/env bash
# Builds the simulated cluster's binaries from Go modules into a cache outside git, keyed by version.
# Only what is missing is built; the time each build took is printed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
CACHE=${TPU_RL_SIM_CACHE:-$HOME/.cache/tpu-rl-sim}
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local

built() { [ -f "$CACHE/$1/.complete" ]; }
mark() { touch "$CACHE/$1/.complete"; }
timed() {  # timed NAME CMD...: runs CMD, prints how long it took
  local name=$1 start=$SECONDS; shift
  echo "building $name ..."
  "$@"
  echo "built $name in $((SECONDS - start)) s"
}

build_kube() {
  local key=kube-$KUBE_VERSION src="$CACHE/src/kube-$KUBE_VERSION" minor=${KUBE_VERSION#v1.}
  minor=${minor%%.*}
  mkdir -p "$src" "$CACHE/$key/bin"
  cd "$src"
  # k8s.io/kubernetes pins its staging modules at v0.0.0 through replace directives, which
  # `go install` refuses: a wrapper module replaces each of them with its published release.
  local staging_version=v0.${KUBE_VERSION#v1.}
  local modfile
  modfile=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module tpu-rl-sim/kube"
    echo "go 1.24.0"
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    grep -E '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$modfile" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  cat > tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
EOF
  go mod tidy
  local pkg ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  done
  go build -ldflags "-s -w $ldflags" -o "$CACHE/$key/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler
  mark "$key"
}

build_etcd() {
  local key=etcd-$ETCD_VERSION src="$CACHE/src/etcd-$ETCD_VERSION"
  mkdir -p "$src" "$CACHE/$key/bin"
  cd "$src"
  cat > main.go <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  printf 'module tpu-rl-sim/etcd\n\ngo 1.24.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
  go mod tidy
  go build -ldflags "-s -w" -o "$CACHE/$key/bin/etcd" .
  mark "$key"
}

build_kwok() {
  local key=kwok-$KWOK_VERSION
  mkdir -p "$CACHE/$key/bin"
  GOBIN="$CACHE/$key/bin" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  kwok_crds
  mark "$key"
}

# kwok serves `kubectl logs` from Logs objects (--enable-crds=Logs): keep their CRD beside the binary.
kwok_crds() {
  local dir
  dir=$(cd "$CACHE" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  install -m 0644 "$dir/kustomize/crd/bases/kwok.x-k8s.io_logs.yaml" "$CACHE/kwok-$KWOK_VERSION/"
}

build_jobset() {
  local key=jobset-$JOBSET_VERSION src="$CACHE/src/jobset-$JOBSET_VERSION"
  mkdir -p "$src" "$CACHE/$key/bin"
  cd "$src"
  # `go install sigs.k8s.io/jobset@v` asks the proxy for the module's version list (for deprecation
  # notices), which the registry mirror answers 403: a wrapper module pins the version instead.
  printf 'module tpu-rl-sim/jobset\n\ngo 1.24.0\n\nrequire sigs.k8s.io/jobset %s\n' "$JOBSET_VERSION" > go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/jobset"\n' > tools.go
  go mod tidy
  go build -ldflags "-s -w" -o "$CACHE/$key/bin/jobset" sigs.k8s.io/jobset
  # The CRD ships in the module source: keep it beside the binary for the apiserver and the tests.
  local dir
  dir=$(go mod download -json "sigs.k8s.io/jobset@$JOBSET_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  install -m 0644 "$dir/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "$CACHE/$key/"
  mark "$key"
}

total=$SECONDS
for component in etcd kwok jobset kube; do
  version_var=${component^^}_VERSION
  if built "$component-${!version_var}"; then
    echo "$component ${!version_var}: cached"
  else
    timed "$component ${!version_var}" "build_$component"
  fi
done
# Caches built before the CRD was kept get it added.
[ -f "$CACHE/kwok-$KWOK_VERSION/kwok.x-k8s.io_logs.yaml" ] || kwok_crds
echo "simulation binaries ready in $CACHE ($((SECONDS - total)) s)"
