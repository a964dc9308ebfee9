"""How the simulated GKE cluster's bootstrap reads a CustomResourceDefinition's state (sim/control_plane.py).

A cluster's create failed with "Control plane failed to start: 'NoneType' object is not iterable" when kwok's
Logs CRD was read before the apiserver's establishing controller had written its first condition: the status
then reads ``"conditions": null`` (apiextensions/v1 ``CustomResourceDefinitionStatus.Conditions`` has no
omitempty). Pure: no simulation."""

from __future__ import annotations

import pytest

from sim.control_plane import crd_established

ESTABLISHED = {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}
NAMES_ACCEPTED = {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"}


@pytest.mark.parametrize(
    "status",
    [
        None,  # created, no status yet
        {"conditions": None, "acceptedNames": {"plural": ""}, "storedVersions": ["v1alpha1"]},
        {"conditions": [NAMES_ACCEPTED]},
        {"conditions": [NAMES_ACCEPTED, {**ESTABLISHED, "status": "False", "reason": "Installing"}]},
    ],
    ids=["no-status", "conditions-null", "names-accepted-only", "establishing"],
)
def test_a_crd_not_yet_established_is_waited_for_not_an_error(status):
    crd = {"metadata": {"name": "logs.kwok.x-k8s.io"}, **({"status": status} if status is not None else {})}
    assert crd_established(crd) is False


def test_an_established_crd_is_ready():
    assert crd_established({"status": {"conditions": [NAMES_ACCEPTED, ESTABLISHED]}}) is True
