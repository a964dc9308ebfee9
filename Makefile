# One command runs the tests (make test); one runs the whole pipeline on the simulated cluster (make demo).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: venv wheel test lint format core unit demo chaos plan preflight docs docs-pages sim-up sim-down sim-status bench bench-triggerer bench-trigger-start bench-run-view

# The package as it ships: the wheel of src/ (dist/), installed into .venv like any distribution (no path to
# the source tree), so every Airflow component and every test imports what a deployment imports.
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' src/tpu_rl/__init__.py)
WHEEL := dist/tpu_rl-$(VERSION)-py3-none-any.whl
SOURCES := pyproject.toml LICENSE scripts/build_wheel.py \
  $(shell find src -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*.egg-info/*')
INSTALLED := $(VENV)/.installed-wheel

venv: $(STAMP) $(INSTALLED)

# The pinned install; constraints.txt freezes every transitive version of a tested environment. uv installs
# it (scripts/uv.sh: seconds where pip takes minutes); pip stays in the venv for the wheel and its check.
$(STAMP): requirements-dev.txt constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	scripts/uv.sh pip install -q --compile-bytecode --python $(VENV)/bin/python -c constraints.txt -r requirements-dev.txt
	touch $@

# The wheel is a function of the sources (scripts/build_wheel.py: a fresh copy with fixed modes, under umask 022,
# fixed time stamps, the exactly pinned backend): any checkout of a commit builds the same SHA-256, which the
# deploy compares with the repository's, so a redeploy or a rollback finds its wheel there.
wheel: $(WHEEL)
$(WHEEL): $(SOURCES)
	rm -f dist/tpu_rl-*.whl
	$(PYTHON) scripts/build_wheel.py dist

$(INSTALLED): $(WHEEL) $(STAMP)
	$(VENV)/bin/pip install -q --no-deps --force-reinstall $(WHEEL)
	$(VENV)/bin/pip check
	echo $(WHEEL) > $@

# scripts/test.sh installs .venv (make venv) beside the simulation's build.
test:
	scripts/test.sh

# The whole pipeline on the simulated cluster through a local Airflow; KEEP_UI=1 leaves the UI up.
demo: venv
	scripts/with-stack.sh python -m scripts.demo --url "$$(scripts/airflow-stack.sh url)" \
	  --conf "$(or $(CONF),include/examples/simulation.json)"

# The fault campaign (scripts/chaos.py): runs at once on the simulation and the stack, each meeting faults drawn
# at random; prints a table and fails when an invariant broke. make chaos ARGS="--seed 7 --runs 6 --faults 3"
chaos: venv
	scripts/with-stack.sh python -m scripts.chaos $(ARGS)

# The linter and the formatter's check (their rules in pyproject.toml); make test runs them first.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Formats every Python file as make lint expects.
format: venv
	$(VENV)/bin/ruff format .

# The pure core's tests: no PostgreSQL, no cluster, under a minute (make test runs them too).
core: venv
	$(VENV)/bin/python -m pytest -p no:cacheprovider -m core tests/unit

# The tests that need only the metadata database (config, manifests, plan, DAG wiring, deploy files).
unit: venv
	scripts/postgres.sh start
	source scripts/airflow-env.sh && airflow db migrate >/dev/null && \
	  python -m pytest -m "not jobset and not checkpoints and not sim and not gke and not e2e"

# The documentation site (mkdocs.yml) into site/, strictly: a broken link, anchor or nav entry fails. make test builds it.
docs: venv
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir site

# Writes the generated pages (the parameters, the XComs, what validation refuses) from the code; the docs tests fail
# while a committed page differs from what these write.
docs-pages: venv
	$(VENV)/bin/python -m scripts.docs_reference
	$(VENV)/bin/python -m scripts.docs_validation

# make plan CONF=my-run.json
plan: venv
	$(VENV)/bin/python -m tpu_rl.plan --conf $(or $(CONF),include/examples/tutorial.json)

# The run's preflight from your machine: reads the project's reservations and quotas with your Application Default
# Credentials (gcloud auth application-default login) and says what the run's preflight stage would.
preflight: venv
	$(VENV)/bin/python -m tpu_rl.project_check --conf $(or $(CONF),include/examples/tutorial.json)

sim-up: venv
	sim/up.sh

sim-down:
	sim/down.sh

sim-status:
	sim/status.sh

bench: venv
	$(VENV)/bin/python benchmarks/dag_parse.py

# One triggerer holding N deferred trainings on the simulated cluster (sim-up first): CPU, memory, requests per
# training (benchmarks/triggerer_load.py; about 25 minutes). make bench-triggerer ARGS="--trainings 10"
bench-triggerer: venv
	nice -n 5 $(VENV)/bin/python -m benchmarks.triggerer_load $(ARGS)

# make deploy-composer ENV=<name> LOCATION=<region> REPOSITORY=<Artifact Registry Python repository>
#   VIRTUAL_REPOSITORY=<Artifact Registry virtual repository: REPOSITORY first, then PyPI> [PYPI_REMOTE=...]
#   [PROJECT=...] [REPOSITORY_LOCATION=...] [REPOSITORY_URL=... VIRTUAL_REPOSITORY_URL=...]
#   [BUCKET=... SERVICE_ACCOUNT=...] [DRY_RUN=1] [REPLACE_PROGRAMS=1]: the wheel into the repository, the
# environment's pip.conf to the virtual repository alone, its custom package to this version, then the DAG files
# and programs (docs/reference/deploy.md).
DEPLOY_VENV := .venv-deploy
.PHONY: deploy-composer
deploy-composer: wheel
	test -x $(DEPLOY_VENV)/bin/python || $(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install -q -c constraints.txt google-cloud-storage twine
	$(DEPLOY_VENV)/bin/python scripts/deploy_composer.py $(if $(ENV),--env "$(ENV)") \
	  $(if $(LOCATION),--location "$(LOCATION)") $(if $(PROJECT),--project "$(PROJECT)") \
	  $(if $(REPOSITORY),--repository "$(REPOSITORY)") \
	  $(if $(VIRTUAL_REPOSITORY),--virtual-repository "$(VIRTUAL_REPOSITORY)") \
	  $(if $(PYPI_REMOTE),--pypi-remote "$(PYPI_REMOTE)") \
	  $(if $(REPOSITORY_LOCATION),--repository-location "$(REPOSITORY_LOCATION)") \
	  $(if $(REPOSITORY_URL),--repository-url "$(REPOSITORY_URL)") \
	  $(if $(VIRTUAL_REPOSITORY_URL),--virtual-repository-url "$(VIRTUAL_REPOSITORY_URL)") \
	  $(if $(BUCKET),--bucket "$(BUCKET)") \
	  $(if $(SERVICE_ACCOUNT),--service-account "$(SERVICE_ACCOUNT)") $(if $(DRY_RUN),--dry-run) \
	  $(if $(REPLACE_PROGRAMS),--replace-programs)

# Composer 3 compatibility: the DAG import and tests/unit on Airflow 3.1.7 (.venv-af31); see docs/reference/versions.md.
.PHONY: test-compat
test-compat: wheel
	scripts/test-compat.sh

# The longest stall of the triggerer's event loop while a GKE wait starts, the package's and the provider's
# trigger (benchmarks/trigger_start_stall.py; sim-up first; about a minute).
bench-trigger-start: venv
	$(VENV)/bin/python benchmarks/trigger_start_stall.py $(ARGS)

# The Training tab on a 72-hour run's event file: the page's time, the bytes read and the memory, with the
# api-server's kept folders and with a fresh read per view (benchmarks/run_view_page.py; no simulation; about 4
# minutes). make bench-run-view ARGS="--hours 24"
bench-run-view: venv
	$(VENV)/bin/python -m benchmarks.run_view_page $(ARGS)
