#!/usr/bin/env bash
# Regenerates constraints-af31.txt, the pins of make test-compat: the packages of the compatibility build as read
# from Google's package list (docs/composer-builds.json, "compatibility_build") are constraints; whatever else
# requirements-af31.txt needs is resolved by uv for Python 3.11 (Composer 3's), keeping the versions the file
# already pins where it can (uv prefers an existing output file's pins).
set -euo pipefail
cd "$(dirname "$0")/.."
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
python3 - >"$pins" <<'PY'
import json

data = json.load(open("docs/composer-builds.json"))
for name, version in data["builds"][data["compatibility_build"]]["packages"].items():
    print(f"{name}=={version}")
PY
scripts/uv.sh pip compile -q --python-version 3.11 --no-annotate --custom-compile-command scripts/compile-af31.sh \
  -c "$pins" requirements-af31.txt -o constraints-af31.txt
