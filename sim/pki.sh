#!/usr/bin/env bash
# Creates the simulation's PKI with openssl (only the files that are missing): a CA, the apiserver's serving cert, a serving cert for
# the other local TLS servers (JobSet webhook, kwok), the admin client cert (group system:masters), the front-proxy client cert and the
# service-account key pair. Usage: pki.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
# Each file is made only if missing, so a PKI from an older version of this script is completed.
days=3650
if [ ! -f ca.crt ]; then
  openssl genrsa -out ca.key 2048 2>/dev/null
  openssl req -x509 -new -key ca.key -subj "/CN=tpu-rl-sim-ca" -days $days -out ca.crt \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
fi

# sign NAME SUBJECT EXTENSIONS: a key and a CA-signed cert.
sign() {
  [ -f "$1.crt" ] && return 0
  openssl genrsa -out "$1.key" 2048 2>/dev/null
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  printf '%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days $days \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

server_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth"
sign apiserver "/CN=kube-apiserver" "$server_ext
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign serving "/CN=tpu-rl-sim-local" "$server_ext
subjectAltName=IP:127.0.0.1,DNS:localhost"
# The GKE emulator's gRPC server (sim/gke_emulator.py): clients reach it as container.googleapis.com through its
# CONNECT proxy and trust it through GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=ca.crt.
sign gke "/CN=container.googleapis.com" "$server_ext
subjectAltName=DNS:container.googleapis.com"
client_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
sign admin "/O=system:masters/CN=kubernetes-admin" "$client_ext"
# The apiserver's client cert towards aggregated APIs (request-header authentication).
sign front-proxy-client "/CN=front-proxy-client" "$client_ext"

if [ ! -f sa.key ]; then
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
fi

# The JobSet webhook server wants tls.crt/tls.key in one directory.
mkdir -p webhook
cp serving.crt webhook/tls.crt
cp serving.key webhook/tls.key
chmod 600 ./*.key webhook/tls.key
