"""Where a Composer environment installs tpu-rl from: the pip.conf the deploy writes names the virtual repository
alone (pip orders no indexes, so any other index could serve a tpu-rl of its own), and the virtual repository it
accepts serves the team's repository before every other upstream."""

from __future__ import annotations

import configparser

import pytest

from scripts import deploy_composer as deploy

pytestmark = pytest.mark.core

VIRTUAL = "https://us-east5-python.pkg.dev/p1/rl-index/simple/"
TEAM = "https://us-east5-python.pkg.dev/p1/rl-packages/simple/"
OTHER_TEAM = "https://europe-python.pkg.dev/other/team/simple/"


def _global(conf: str) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(conf)
    return dict(parser["global"])


def test_the_virtual_repository_becomes_the_only_index_and_other_settings_stay():
    # What earlier deploys wrote (the team's repository as an extra index), PyPI, and other teams' settings.
    before = f"[global]\ntimeout = 60\nextra-index-url = {TEAM}\n    https://pypi.org/simple\n"
    before += "[install]\nno-compile = 1\n"

    written = deploy.environment_pip_conf(before, VIRTUAL, ours=(TEAM,))

    assert _global(written) == {"index-url": VIRTUAL, "timeout": "60"}
    assert "no-compile = 1" in written
    assert deploy.environment_pip_conf(written, VIRTUAL, ours=(TEAM,)) == written  # the next deploy changes nothing
    assert _global(deploy.environment_pip_conf("", VIRTUAL)) == {"index-url": VIRTUAL}


def test_pypi_as_the_index_is_replaced_by_the_virtual_repository_which_serves_pypi_too():
    written = deploy.environment_pip_conf("[global]\nindex-url = https://pypi.org/simple/\n", VIRTUAL)
    assert _global(written) == {"index-url": VIRTUAL}


def test_another_teams_extra_index_is_refused_naming_the_fix():
    with pytest.raises(SystemExit) as refused:
        deploy.environment_pip_conf(f"[global]\nextra-index-url = {OTHER_TEAM}\n", VIRTUAL, ours=(TEAM,))
    message = str(refused.value)
    assert OTHER_TEAM in message and "upstream of the virtual repository" in message and "remove it" in message


def test_another_index_url_is_never_replaced_silently():
    with pytest.raises(SystemExit) as refused:
        deploy.environment_pip_conf(f"[global]\nindex-url = {OTHER_TEAM}\n", VIRTUAL)
    message = str(refused.value)
    assert OTHER_TEAM in message and "will not replace it" in message and "VIRTUAL_REPOSITORY=" in message


def _virtual(*priorities: tuple[str, int], mode: str = "VIRTUAL_REPOSITORY") -> dict:
    policies = [
        {"id": name, "repository": f"projects/p1/locations/us-east5/repositories/{name}", "priority": priority}
        for name, priority in priorities
    ]
    return {"mode": mode, "virtualRepositoryConfig": {"upstreamPolicies": policies}}


def test_a_virtual_repository_is_accepted_only_when_the_teams_repository_comes_first_alone():
    policies = deploy.upstream_policies("p1", "us-east5", "rl-packages", "pypi")
    created = {"mode": "VIRTUAL_REPOSITORY", "virtualRepositoryConfig": {"upstreamPolicies": policies}}
    assert deploy.virtual_repository_refusal(created, "us-east5", "rl-packages") is None
    team_first = _virtual(("rl-packages", 5), ("other-team", 3), ("pypi", 1))
    assert deploy.virtual_repository_refusal(team_first, "us-east5", "rl-packages") is None

    for described, why in (
        (_virtual(("rl-packages", 1), ("pypi", 5)), "serves projects/p1/locations/us-east5/repositories/pypi"),
        (_virtual(("rl-packages", 5), ("pypi", 5)), "as high as rl-packages's"),
        (_virtual(("pypi", 5)), "has no upstream rl-packages"),
        ({"mode": "STANDARD_REPOSITORY"}, "not a virtual repository"),
    ):
        assert why in deploy.virtual_repository_refusal(described, "us-east5", "rl-packages")
