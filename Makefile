# One command runs the tests (make test); one runs the whole pipeline on the simulated cluster (make demo).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: venv test unit demo plan sim-up sim-down sim-status bench

venv: $(STAMP)

# The pinned install; constraints.txt freezes every transitive version of a tested environment.
$(STAMP): requirements-dev.txt constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -c constraints.txt -r requirements-dev.txt
	echo "$(CURDIR)/plugins" > "$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tpu_rl_plugins.pth"
	touch $@

test: venv
	scripts/test.sh

# The whole pipeline on the simulated cluster through a local Airflow; KEEP_UI=1 leaves the UI up.
demo: venv
	scripts/demo.sh

# The tests that need only the metadata database (config, manifests, plan, DAG wiring, deploy files).
unit: venv
	scripts/postgres.sh start
	source scripts/airflow-env.sh && airflow db migrate >/dev/null && \
	  python -m pytest -m "not jobset and not checkpoints and not sim and not gke and not e2e"

# make plan CONF=my-run.json
plan: venv
	$(VENV)/bin/python -m tpu_rl.plan --conf $(or $(CONF),include/examples/tutorial.json)

sim-up: venv
	sim/up.sh

sim-down:
	sim/down.sh

sim-status:
	sim/status.sh

bench: venv
	$(VENV)/bin/python benchmarks/dag_parse.py

# make deploy-composer ENV=<name> LOCATION=<region> [PROJECT=...] [BUCKET=...] [DRY_RUN=1] [UPDATE_PYPI=1]:
# this package's files into the environment's bucket (nobody else's are touched); the PyPI packages that
# differ from requirements.txt are shown, and added only with UPDATE_PYPI=1. Needs google-cloud-storage only.
DEPLOY_VENV := .venv-deploy
.PHONY: deploy-composer
deploy-composer:
	test -x $(DEPLOY_VENV)/bin/python || $(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install -q -c constraints.txt google-cloud-storage
	$(DEPLOY_VENV)/bin/python scripts/deploy_composer.py $(if $(ENV),--env "$(ENV)") \
	  $(if $(LOCATION),--location "$(LOCATION)") $(if $(PROJECT),--project "$(PROJECT)") \
	  $(if $(BUCKET),--bucket "$(BUCKET)") $(if $(DRY_RUN),--dry-run) $(if $(UPDATE_PYPI),--update-pypi)

# Composer 3 compatibility: the DAG import and tests/unit on Airflow 3.1.7 (.venv-af31); see docs/compatibility.md.
.PHONY: test-compat
test-compat:
	scripts/test-compat.sh
