"""The trigger form: one Airflow ``Param`` per config field, with its section, title and description."""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow.sdk import Param

from tpu_rl.config import field_specs

_JSON_TYPES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
}


def trigger_params() -> dict[str, Param]:
    params = {}
    for spec in field_specs():
        meta = spec.metadata
        json_type = _JSON_TYPES[spec.type]
        # An empty default means "none": the form must accept the field empty (null), not require it.
        schema = {"type": [json_type, "null"] if spec.default == "" else json_type, **meta["schema"]}
        if spec.default is None:
            # Required: no default, so the form asks for it and the run cannot start without it.
            params[spec.name] = Param(
                title=meta["title"], description=meta["description"], section=meta["section"], minLength=1, **schema
            )
        else:
            default = spec.default_factory() if spec.type in ("dict", "list") else spec.default
            params[spec.name] = Param(
                default, title=meta["title"], description=meta["description"], section=meta["section"], **schema
            )
    return params


def check_defaults(dag_id: str, params: dict[str, Param]) -> None:
    """What Airflow checks of a scheduled DAG's params (every default valid, none required left empty), with one
    validator per field for all DAGs: Airflow's own check validates each schema against the metaschema again
    for every DAG, which costs more than building the DAG."""
    problems = []
    for name, param in params.items():
        if not param.has_value:
            problems.append(f"{name}: required, and a scheduled run has no form to fill it")
        elif (error := next(_validators()[name].iter_errors(param.value), None)) is not None:
            problems.append(f"{name}: {param.value!r} is not valid: {error.message}")
    if problems:
        raise ValueError(f"Dag {dag_id!r} cannot be scheduled: " + "; ".join(problems))


@cache
def _validators() -> dict[str, Any]:
    """The form's field -> a JSON schema validator, as Airflow's Param builds one (latest draft, formats)."""
    from jsonschema import FormatChecker
    from jsonschema.validators import validator_for

    validators = {}
    for name, param in trigger_params().items():
        cls = validator_for(param.schema)
        cls.check_schema(param.schema)
        validators[name] = cls(param.schema, format_checker=FormatChecker())
    return validators
