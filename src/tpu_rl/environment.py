"""The Airflow environment a process runs in, by name: what tells apart the runs of two environments that share a
GCP project and a bucket (staging and production; Cloud Composer's side-by-side upgrade, a new environment next to
the old one), whose DAG ids and run ids may be the same.

Each environment asks its own Airflow about its runs only: to another environment's run it would answer "no such
run". So every ownership mark (the cluster's, the TPU pools', the JobSets' and Secrets', a lease holder's) also
names the environment, and the reaper and the leases' expiry pass by what :func:`elsewhere` says is not theirs.

An unnamed environment ("") writes no mark and behaves as before the mark existed. Pure: no Airflow import.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping

from tpu_rl.vocabulary import LABEL_VALUE_MAX

#: Names the environment where nothing else does (plain Airflow, docker compose); wins over Composer's name.
ENVIRONMENT_VARIABLE = "TPU_RL_ENVIRONMENT"
#: Reserved variables Cloud Composer sets in every component of an environment: its region and its name
#: (Composer 3 "Set environment variables", "Reserved variables").
COMPOSER_LOCATION = "COMPOSER_LOCATION"
COMPOSER_ENVIRONMENT = "COMPOSER_ENVIRONMENT"
#: Hex digits of the hash that keeps a shortened label value apart from every other name's.
LABEL_HASH_LENGTH = 8
#: A value both GKE resource labels (lowercase letters, digits, '_', '-') and Kubernetes labels
#: ('[A-Za-z0-9._-]', beginning and ending with a letter or digit) accept.
_LABEL_SAFE = re.compile(r"[a-z0-9]([a-z0-9_-]*[a-z0-9])?")


def current(environ: Mapping[str, str] | None = None) -> str:
    """This process's environment: ``TPU_RL_ENVIRONMENT``, else Composer's ``<location>/<environment>``, else ""
    (unnamed). Read when a task runs, on the worker: the DAG file's parse may happen elsewhere."""
    environ = os.environ if environ is None else environ
    if named := environ.get(ENVIRONMENT_VARIABLE, "").strip():
        return named
    location, name = environ.get(COMPOSER_LOCATION, ""), environ.get(COMPOSER_ENVIRONMENT, "")
    return f"{location}/{name}" if location and name else ""


def label_value(name: str) -> str:
    """The name as a GKE and Kubernetes label value: itself when it is one (at most 63 lowercase letters, digits,
    '_' or '-'); otherwise a readable prefix and a hash of the whole name, stable and unlike any other name's
    (``us-east5/prod``: ``us-east5-prod-`` and 8 hex digits). The full name goes where free text may."""
    if len(name) <= LABEL_VALUE_MAX and _LABEL_SAFE.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:LABEL_HASH_LENGTH]
    readable = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[: LABEL_VALUE_MAX - LABEL_HASH_LENGTH - 1]
    readable = readable.rstrip("-")
    return f"{readable}-{digest}" if readable else digest


def elsewhere(mark: str, here: str) -> bool:
    """Whether a resource or lease holder marked ``mark`` belongs to another environment than ``here``, so that
    this Airflow must not judge its run. Unmarked ("") is judged here: made before marks were written (by this
    environment, the upgrade case) or by an unnamed one. Marked by a name this environment does not bear is
    someone else's, also when this environment is unnamed."""
    return bool(mark) and mark != here


def called(name: str) -> str:
    """The environment as a person reads it in a message."""
    return name or "unnamed"
