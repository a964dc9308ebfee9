"""Writes the reference pages the code defines: docs/reference/parameters.md from the run's configuration
(``tpu_rl.config.RunConfig``: every field with its form section, title, type, default, bounds and description, as
the trigger form shows them) and docs/reference/xcoms.md from the tasks' contract (``tpu_rl.contract``: every XCom a
task or the Training tab reads from another task). The pages are never edited by hand;
``tests/unit/test_docs_site.py`` fails while one differs from what this writes.

Usage: ``python -m scripts.docs_reference`` (``make docs-pages`` runs it).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from tpu_rl.config import field_specs

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "reference"

_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "dict": "object", "list": "list"}

INTRO = """\
# Parameters

<!-- Generated from src/tpu_rl/config.py by `python -m scripts.docs_reference` (make docs-pages): do not edit. -->

Every parameter of the trigger form, in the form's sections and order. The same names are the keys of a run's
conf (`airflow dags trigger --conf`, the REST API, `make plan CONF=...`) and of a program's `params`. Every
default is the tutorial's value. A required parameter has no default: the form asks for it, and a run
triggered without it fails in `validate_config` before anything is created. What validation refuses, value by
value: [validation.md](validation.md).
"""


def default_text(spec: dataclasses.Field) -> str:
    if spec.default is None:
        return "**required**"
    value = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
    if value == "" or value == [] or value == {}:
        return "default empty" if value == "" else f"default `{json.dumps(value)}`"
    return f"default `{json.dumps(value)}`"


def bounds_text(schema: dict[str, Any]) -> list[str]:
    lines = []
    if "enum" in schema:
        lines.append("one of " + ", ".join(f"`{choice}`" for choice in schema["enum"]))
    if "minimum" in schema and "maximum" in schema:
        lines.append(f"from {schema['minimum']} to {schema['maximum']}")
    elif "minimum" in schema:
        lines.append(f"at least {schema['minimum']}")
    if "pattern" in schema:
        lines.append(f"matches `{schema['pattern']}`")
    if "examples" in schema:
        lines.append("e.g. " + ", ".join(f"`{example}`" for example in schema["examples"]))
    if "items" in schema:
        item = schema["items"]
        keys = ", ".join(
            f"`{key}`" + (" (required)" if key in item.get("required", ()) else "") for key in item["properties"]
        )
        lines.append(f"each item an object of {keys}")
    return lines


def parameter_entry(spec: dataclasses.Field) -> str:
    meta = spec.metadata
    facts = [f"**{meta['title']}**", _TYPES[spec.type], default_text(spec), *bounds_text(meta["schema"])]
    return f"### `{spec.name}`\n\n{' · '.join(facts)}\n\n{meta['description']}\n"


def parameters_page() -> str:
    sections: dict[str, list[dataclasses.Field]] = {}
    for spec in field_specs():
        sections.setdefault(spec.metadata["section"], []).append(spec)
    contents = [
        "## Sections\n",
        *(
            f"- [{name}](#{_slug(name)}): " + ", ".join(f"[`{spec.name}`](#{spec.name})" for spec in specs)
            for name, specs in sections.items()
        ),
        "",
    ]
    body = [f"## {name}\n\n" + "\n".join(parameter_entry(spec) for spec in specs) for name, specs in sections.items()]
    return "\n".join([INTRO, "\n".join(contents), *body]).rstrip("\n") + "\n"


def _slug(title: str) -> str:
    """The anchor MkDocs' table of contents gives a heading (its default slugify: lower case, spaces to dashes)."""
    return "-".join(title.lower().split())


XCOMS_INTRO = """\
# XComs

<!-- Generated from src/tpu_rl/contract.py by `python -m scripts.docs_reference` (make docs-pages): do not edit. -->

The XComs one task of a run pushes and another task, or the run's Training tab, reads. Each is declared once, in
`tpu_rl/contract.py`, whose test checks every pair against the DAG the factory builds. Read them in the UI (a
task's XCom tab), through the REST API (the task instance's `xcomEntries/{key}`) or from a task of your own with
`ti.xcom_pull(task_ids=..., key=...)`. What the figures mean: [outputs and reports](outputs.md).

| task | key | what it holds |
|---|---|---|
"""


def xcoms_page() -> str:
    """One row per ``Pull`` of ``contract.PULLED``, described by the ``#:`` comment above its declaration."""
    from tpu_rl import contract

    source = (REPO / "src" / "tpu_rl" / "contract.py").read_text()
    lines = source.splitlines()
    described = {}
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "Pull"
        ):
            comment, line = [], node.lineno - 2
            while line >= 0 and lines[line].startswith("#:"):
                comment.insert(0, lines[line][2:].strip())
                line -= 1
            described[node.targets[0].id] = " ".join(comment)
    rows = []
    for name, pull in vars(contract).items():
        if isinstance(pull, contract.Pull) and pull in contract.PULLED:
            text = described.get(name)
            if not text:
                raise SystemExit(f"tpu_rl/contract.py: {name} has no #: comment saying what the XCom holds")
            text = re.sub(r"^``\w+``,?:? ", "", text)  # the comment opens with the pushing task, a column here
            text = (text[0].upper() + text[1:]).replace("``", "`").replace("|", "\\|")
            rows.append(f"| `{pull.task}` | `{pull.key}` | {text} |")
    return XCOMS_INTRO + "\n".join(rows) + "\n"


PAGES = {"parameters.md": parameters_page, "xcoms.md": xcoms_page}


def main() -> None:
    for name, write in PAGES.items():
        (REFERENCE / name).write_text(write())
        print(f"wrote docs/reference/{name}")


if __name__ == "__main__":
    main()
