"""What ``make deploy-composer`` refuses before any call: above all a deploy without its environment, which would
upload DAG files that import tpu_rl while nothing installs it (and delete the plugins/ copy older ones import), and one
without the virtual repository the environment installs from, which would leave the repository beside PyPI."""

from __future__ import annotations

import pytest

from scripts import deploy_composer as deploy

pytestmark = pytest.mark.core

#: The index the environment installs from: without it, the repository would sit beside PyPI.
VIRTUAL = ["--virtual-repository", "rl-index"]


@pytest.fixture
def no_calls(monkeypatch):
    """Any command, request or upload fails the test."""

    def called(*args, **kwargs):
        raise AssertionError(f"called before the arguments were checked: {args}")

    monkeypatch.setattr(deploy.subprocess, "run", called)
    monkeypatch.setattr(deploy.urllib.request, "urlopen", called)
    monkeypatch.setattr(deploy, "sync", called)


@pytest.mark.parametrize(
    "args",
    [
        ["--bucket", "composer-bucket", "--repository-url", "http://127.0.0.1:8080/"],
        ["--bucket", "composer-bucket", "--repository", "rl", "--location", "us-east5", "--service-account", "sa@p"],
        ["--location", "us-east5", "--repository", "rl"],
    ],
)
def test_a_deploy_without_its_environment_is_refused_naming_env(args, no_calls, capsys):
    with pytest.raises(SystemExit) as refused:
        deploy.main(args)

    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "ENV=<environment>" in err and "cannot import" in err and "LOCATION=" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "e", "--bucket", "b", "--repository", "r", "--location", "us-east5", *VIRTUAL], "--service-account"),
        (["--env", "e", "--bucket", "b", "--repository-url", "http://127.0.0.1:8080/"], "region"),
        (["--env", "e", "--location", "us-east5", "--bucket", "b"], "needs --repository"),
        (["--env", "e", "--location", "us-east5", "--repository", "r"], "VIRTUAL_REPOSITORY="),
        (["--env", "e", "--location", "us-east5", "--repository-url", "http://127.0.0.1:8080/", *VIRTUAL], "upstream"),
    ],
)
def test_an_environment_without_its_region_repository_or_account_is_refused_before_any_call(
    args, message, no_calls, capsys
):
    """Given the bucket, nothing describes the environment: the reader role would go to no account."""
    with pytest.raises(SystemExit):
        deploy.main(args)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["--env", "e", "--location", "us-east5", "--repository", "r", *VIRTUAL],
        ["--env", "e", "--location", "us-east5", "--bucket", "b", "--repository-url", "http://127.0.0.1:8080/"]
        + ["--virtual-repository-url", "http://127.0.0.1:8081/"],
        ["--env", "e", "--location", "us-east5", "--bucket", "b", "--repository", "r", "--service-account", "sa@p"]
        + VIRTUAL,
    ],
)
def test_a_deploy_that_names_its_environment_passes(args):
    parser = deploy.argument_parser()
    deploy.check_arguments(parser, parser.parse_args(args))
