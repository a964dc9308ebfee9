"""Writes the config keys MaxText's ``train_rl`` accepts, read from the release's wheel, to the package's data file
(``src/tpu_rl/maxtext_keys_<version>.json``), which ``tpu_rl.config_rules`` checks ``extra_train_args`` against.

Why: MaxText refuses an unknown key only at ``train_rl``'s start, after the run created and paid for its TPU slice,
and again on every retry. What it accepts (MaxText 0.2.4):

- ``train_rl`` builds its config with ``config_class=types.RLConfig`` (trainers/post_train/rl/train_rl.py:696);
- pyconfig loads ``post_train/rl.yml`` for that module (configs/pyconfig.py:55), merges the model's config and
  the command line's ``key=value`` overrides (OmegaConf: ``rl.num_iterations=2`` is the key ``rl`` holding
  ``{num_iterations: 2}``), and refuses every top-level key that is not a field of ``RLConfig`` or of a model
  nested in it (configs/pyconfig.py:239 ``_check_for_invalid_keys``, :271 the ValueError, :382 "MAXTEXT CONFIG
  ERROR", :398 exit code 2);
- a nested model ignores an inner key it lacks (pydantic's default): ``rl.num_iteratons`` would be dropped
  silently, so the package refuses it too, which needs each nested model's fields;
- ``RLConfig.map_flat_fields_to_nested_models`` copies a flat key over the nested field of the same name
  (configs/types.py:4585), so ``dataset.num_test_batches`` is replaced by the flat ``num_test_batches`` that rl.yml
  sets: the file keeps rl.yml's top-level keys (``defaults``).

The fields are read from ``configs/types.py`` by its syntax tree (pydantic's rule: the annotated class attributes,
inherited along the MRO), so nothing of MaxText (jax, flax) is imported. The keys of rl.yml and of every model
config must come out known, or the script stops: a sign that the release validates differently.

When the MaxText pin moves (the image tag, ``tpu_rl.config_rules.MAXTEXT_RELEASE``, the contract tests), add the
new release's GitHub tag and commit to RELEASES and run::

    python -m scripts.maxtext_keys 0.2.5

tests/unit/test_maxtext_keys.py checks that the shipped file is what this script writes from the pinned wheel.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpu-rl"
#: The GitHub tag and commit of each release (AI-Hypercomputer/maxtext); their src/maxtext/ files read here are
#: byte for byte the wheel's.
RELEASES = {"0.2.4": ("maxtext-v0.2.4", "538fe7a3f3376d94cf3f04e77741aa6d7e8efa45")}
TYPES, PYCONFIG, TRAIN_RL, RL_YML = (
    "maxtext/configs/types.py",
    "maxtext/configs/pyconfig.py",
    "maxtext/trainers/post_train/rl/train_rl.py",
    "maxtext/configs/post_train/rl.yml",
)
#: What the derivation relies on, as the release writes it; a missing one stops the script.
MARKERS = {
    PYCONFIG: (
        '"maxtext.trainers.post_train.rl.train_rl": "post_train/rl.yml"',
        "def _check_for_invalid_keys(key: str, valid_fields: set[str]) -> bool:",
        "raise ValueError(f\"{key!r} not in {', '.join(map(repr, valid_fields))}.\")",
    ),
    TRAIN_RL: ("config_class=types.RLConfig",),
    TYPES: ("def map_flat_fields_to_nested_models(cls, data: Any) -> Any:", "nested_dict[inner_key] = data[inner_key]"),
}
CONFIG_CLASS = "RLConfig"


def data_file(version: str) -> Path:
    return REPO / "src" / "tpu_rl" / f"maxtext_keys_{version}.json"


def wheel_path(version: str) -> Path:
    """The release's wheel, downloaded once into ~/.cache/tpu-rl/maxtext-<version>/ (where the tests read it)."""
    folder = CACHE / f"maxtext-{version}"
    found = sorted(folder.glob("*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
            + ["--python-version", "3.12", f"maxtext=={version}", "-d", str(folder)],
            check=True,
        )
        found = sorted(folder.glob("*.whl"))
    return found[0]


def model_classes(tree: ast.Module) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Every class of the module: its base names, and its own fields (annotated attributes) with their
    annotation's source."""
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            fields = {
                item.target.id: ast.unparse(item.annotation)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                if not item.target.id.startswith("_") and not ast.unparse(item.annotation).startswith("ClassVar")
            }
            classes[node.name] = ([ast.unparse(base) for base in node.bases], fields)
    return classes


def mro(name: str, classes: dict) -> list[str]:
    """C3 linearisation over the module's classes (bases defined elsewhere, such as BaseModel, are left out)."""
    bases = [b for b in classes[name][0] if b in classes]
    pending = [mro(b, classes) for b in bases] + [bases]
    order = [name]
    while any(pending):
        head = next(s[0] for s in pending if s and not any(s[0] in t[1:] for t in pending))
        order.append(head)
        pending = [[c for c in s if c != head] for s in pending]
    return order


def fields_of(name: str, classes: dict) -> dict[str, str]:
    """A model's fields and their annotations, the most derived class's annotation winning."""
    fields: dict[str, str] = {}
    for cls in reversed(mro(name, classes)):
        fields.update(classes[cls][1])
    return fields


def is_model(annotation: str, classes: dict) -> bool:
    return annotation in classes and "BaseModel" in {b for c in mro(annotation, classes) for b in classes[c][0]}


def is_mapping(annotation: str) -> bool:
    return annotation == "dict" or annotation.startswith("dict[")


def key_set(types_source: str) -> dict:
    """The keys pyconfig accepts for RLConfig (its fields, and the fields of the models nested in it, recursively:
    _check_for_invalid_keys), each nested model's fields, and the fields whose value is a free mapping."""
    classes = model_classes(ast.parse(types_source))
    fields = fields_of(CONFIG_CLASS, classes)
    nested = {name: fields_of(ann, classes) for name, ann in fields.items() if is_model(ann, classes)}
    keys, stack = set(fields), list(nested.values())
    while stack:
        inner = stack.pop()
        keys |= set(inner)
        stack += [fields_of(ann, classes) for ann in inner.values() if is_model(ann, classes)]
    mappings = {name for name, ann in fields.items() if is_mapping(ann)}
    mappings |= {f"{outer}.{name}" for outer, inner in nested.items() for name, ann in inner.items() if is_mapping(ann)}
    return {
        "keys": sorted(keys),
        "nested": {name: sorted(inner) for name, inner in sorted(nested.items())},
        "mappings": sorted(mappings),
    }


def document(version: str, wheel: Path) -> dict:
    """The data file's content: the release, where it was read, and its keys. Stops when the release no longer
    validates the way this script reads it."""
    with zipfile.ZipFile(wheel) as archive:
        text = {name: archive.read(name).decode() for name in (TYPES, PYCONFIG, TRAIN_RL, RL_YML)}
        model_keys = {
            name: set(yaml.safe_load(archive.read(name)) or {})
            for name in archive.namelist()
            if name.startswith("maxtext/configs/models/") and name.endswith(".yml")
        }
    missing = [
        f"{path}: {marker}" for path, markers in MARKERS.items() for marker in markers if marker not in text[path]
    ]
    found = key_set(text[TYPES])
    loaded = {RL_YML: set(yaml.safe_load(text[RL_YML])), **model_keys}
    unknown = [
        f"{path}: {sorted(keys - set(found['keys']))}" for path, keys in loaded.items() if keys - set(found["keys"])
    ]
    if missing or unknown:
        raise SystemExit(
            "MaxText validates its config otherwise than this script reads it:\n" + "\n".join(missing + unknown)
        )
    tag, commit = RELEASES[version]
    return {
        "maxtext": version,
        "module": "maxtext.trainers.post_train.rl.train_rl",
        "config_class": f"maxtext.configs.types.{CONFIG_CLASS}",
        "source": {
            "wheel": wheel.name,
            "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "tag": tag,
            "commit": commit,
            "files": {name: hashlib.sha256(text[name].encode()).hexdigest() for name in sorted(text)},
        },
        **found,
        "defaults": sorted(loaded[RL_YML]),
    }


def render(doc: dict) -> str:
    return json.dumps(doc, indent=1) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", nargs="?", default=next(iter(RELEASES)), help="MaxText release, e.g. 0.2.4")
    parser.add_argument("--wheel", type=Path, help="the release's wheel (default: downloaded into the cache)")
    args = parser.parse_args()
    if args.version not in RELEASES:
        parser.error(f"add MaxText {args.version}'s GitHub tag and commit to RELEASES first")
    doc = document(args.version, args.wheel or wheel_path(args.version))
    out = data_file(args.version)
    out.write_text(render(doc))
    print(f"{out.relative_to(REPO)}: {len(doc['keys'])} keys of MaxText {args.version}'s train_rl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
