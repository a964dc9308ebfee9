"""The export carries the model's generation_config.json: MaxText 0.2.4's converter writes none, the export's script
copies it from the repository after the conversion, the export's check requires it for the repositories that have
one, and the MaxText emulator behaves as the script does."""

import sys
import types
from datetime import UTC, datetime, timedelta

import pytest

from sim import maxtext_stages
from sim.maxtext_stages import copy_generation_config, generation_config_copy, parse_invocation
from tpu_rl import checkpoints, manifests, maxtext
from tpu_rl.checkpoints import StoredObject
from tpu_rl.config import RunConfig
from tpu_rl.config_rules import ships_generation_config
from tpu_rl.output_checks import HfExport, OutputCheck

#: The pure core's tests: make core runs them without PostgreSQL or a cluster.
pytestmark = pytest.mark.core

ATTEMPT = "qwen3-30b-a3b/hf-staging/run/attempt-1/"
START = datetime(2026, 12, 1, tzinfo=UTC)


def export_container(config: RunConfig, run) -> dict:
    jobset = manifests.maxtext_to_hf_jobset(config, run, 50, ATTEMPT)
    [container] = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    return container


def environment(container: dict) -> dict:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_maxtext_0_2_4_writes_no_generation_config():
    """checkpoint_conversion/utils/utils.py save_model_files: the tokenizer's files, config.json, the shards."""
    from tests.unit.test_maxtext_contract import read

    saving = read("checkpoint_conversion/utils/utils.py")
    assert "tokenizer.save_pretrained(current_save_path)" in saving
    assert "save_config_file(config, current_save_path, output_dir, SAFE_TENSORS_CONFIG_FILE" in saving
    assert "generation_config" not in saving + read("checkpoint_conversion/to_huggingface.py")


@pytest.mark.parametrize("on_tpu", [False, True])
def test_the_export_copies_the_repositorys_file_after_the_conversion(tutorial_conf, run, on_tpu):
    tpu = {"conversion_on_tpu": True, "tpu_pool_mode": "cluster"} if on_tpu else {}
    config = RunConfig.from_params({**tutorial_conf, **tpu})
    container = export_container(config, run)
    script = container["command"][2]
    uri = f"gs://{config.gcs_bucket}/{ATTEMPT}"
    assert f'&& python3 -c "$TPU_RL_COPY_GENERATION_CONFIG" {config.hf_model_path} {uri}' in script
    assert environment(container)[maxtext.COPY_GENERATION_CONFIG_ENV] == maxtext.COPY_GENERATION_CONFIG_PROGRAM
    assert "hf_access_token" not in script and "HF_TOKEN" not in maxtext.COPY_GENERATION_CONFIG_PROGRAM
    # The emulator reads the same command: the conversion, then the copy into the attempt's folder.
    assert parse_invocation(container["command"])[0] == "to_huggingface"
    assert generation_config_copy(container["command"], environment(container)) == (config.hf_model_path, uri)
    if on_tpu:  # The other hosts of the slice skip both.
        assert script.startswith('[ "$JOB_COMPLETION_INDEX" != "0" ] || { ') and script.endswith("; }")


def test_without_the_program_in_its_environment_the_emulated_copy_does_nothing(tutorial_config, run):
    container = export_container(tutorial_config, run)
    assert generation_config_copy(container["command"], {}) is None


class FakeStorage:
    """google.cloud.storage as the program uses it: what it uploads, by object name."""

    def __init__(self):
        self.uploads: dict[tuple[str, str], str] = {}

    def Client(self):  # noqa: N802 - the library's name
        return self

    def bucket(self, name):
        return types.SimpleNamespace(blob=lambda blob: FakeBlob(self, name, blob))


class FakeBlob:
    def __init__(self, storage, bucket, name):
        self.storage, self.bucket, self.name = storage, bucket, name

    def upload_from_filename(self, path, content_type):
        self.storage.uploads[(self.bucket, self.name)] = open(path).read()


class RemoteEntryNotFoundError(Exception):
    pass


def run_program(monkeypatch, repo, download):
    """Runs the copy program with its libraries replaced: ``download`` stands for hf_hub_download."""
    import google.cloud

    storage = FakeStorage()
    hub = types.SimpleNamespace(hf_hub_download=download)
    errors = types.SimpleNamespace(RemoteEntryNotFoundError=RemoteEntryNotFoundError)
    monkeypatch.setattr(google.cloud, "storage", storage, raising=False)
    monkeypatch.setitem(sys.modules, "google.cloud.storage", storage)
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    monkeypatch.setitem(sys.modules, "huggingface_hub.errors", errors)
    monkeypatch.setattr(sys, "argv", ["-c", repo, f"gs://models/{ATTEMPT}"])
    exec(compile(maxtext.COPY_GENERATION_CONFIG_PROGRAM, "<program>", "exec"), {"__name__": "__main__"})
    return storage.uploads


def test_the_program_copies_the_file_into_the_attempts_folder(monkeypatch, tmp_path, capsys):
    stored = tmp_path / "generation_config.json"
    stored.write_text('{"temperature": 0.7}')
    asked = []

    def download(repo, name):
        asked.append((repo, name))
        return str(stored)

    uploads = run_program(monkeypatch, "Qwen/Qwen3-30B-A3B-Instruct-2507", download)
    assert asked == [("Qwen/Qwen3-30B-A3B-Instruct-2507", "generation_config.json")]
    assert uploads == {("models", f"{ATTEMPT}generation_config.json"): '{"temperature": 0.7}'}
    assert "Copied generation_config.json" in capsys.readouterr().out


def test_a_repository_without_the_file_leaves_the_export_without_it(monkeypatch, capsys):
    def download(repo, name):
        raise RemoteEntryNotFoundError(name)

    with pytest.raises(SystemExit) as ended:
        run_program(monkeypatch, "me/my-fine-tune", download)
    assert ended.value.code == 0
    assert "me/my-fine-tune has no generation_config.json" in capsys.readouterr().out


def test_another_failure_fails_the_export(monkeypatch):
    def download(repo, name):
        raise OSError("connection reset")

    with pytest.raises(OSError):
        run_program(monkeypatch, "Qwen/Qwen3-30B-A3B-Instruct-2507", download)


def listing(*names: str, at: datetime = START + timedelta(minutes=5)) -> dict[str, StoredObject]:
    return {name: StoredObject(name, 10, at) for name in names}


def test_the_check_requires_what_it_is_told_to_and_refuses_a_stale_copy():
    written = listing("config.json", "tokenizer_config.json", "tokenizer.json", "model.safetensors")
    required = [maxtext.GENERATION_CONFIG]
    assert checkpoints.check_hf_export(written, ["model.safetensors"], [], START).complete
    missing = checkpoints.check_hf_export(written, ["model.safetensors"], [], START, required)
    assert missing.problems == ("no generation_config.json",)
    stale = {**written, **listing("generation_config.json", at=START - timedelta(days=1))}
    [problem] = checkpoints.check_hf_export(stale, ["model.safetensors"], [], START, required).problems
    assert problem.startswith("generation_config.json was written at") and "stale" in problem


def test_the_repositories_of_the_fit_table_must_give_theirs(tutorial_config):
    assert ships_generation_config(tutorial_config.hf_model_path)
    assert ships_generation_config("meta-llama/Llama-3.1-8B-Instruct")
    assert not ships_generation_config("me/my-fine-tune")


def test_the_triggers_serialised_check_keeps_the_required_files():
    check = HfExport(prefix=ATTEMPT, not_before=START.isoformat(), also_required=["generation_config.json"])
    assert OutputCheck.deserialize(check.serialize()) == check
    assert OutputCheck.deserialize({"kind": "HfExport", "prefix": ATTEMPT}).also_required == []


class FakeClient:
    """The GCS emulator's client as sim.maxtext_outputs.Bucket uses it."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def get_bucket(self, name):
        return types.SimpleNamespace(blob=lambda key: types.SimpleNamespace(upload_from_string=self.saver(key)))

    def saver(self, key):
        return lambda data, content_type: self.objects.__setitem__(key, data)


def test_the_emulated_copy_writes_the_repositorys_file_or_nothing():
    client = FakeClient()
    lines = copy_generation_config(client, "Qwen/Qwen3-30B-A3B-Instruct-2507", f"gs://models/{ATTEMPT}")
    assert lines == [f"Copied generation_config.json of Qwen/Qwen3-30B-A3B-Instruct-2507 to gs://models/{ATTEMPT}"]
    assert list(client.objects) == [f"{ATTEMPT}generation_config.json"]
    assert b'"temperature": 0.7' in client.objects[f"{ATTEMPT}generation_config.json"]
    assert copy_generation_config(FakeClient(), "me/my-fine-tune", "gs://models/x/") == [
        "me/my-fine-tune has no generation_config.json: the export has none"
    ]
    # The emulator knows the file of every repository the package requires it of that the simulation converts.
    assert all(ships_generation_config(repo) for repo in maxtext_stages.HF_GENERATION_CONFIGS)
