"""The trigger form: one Airflow ``Param`` per config field, with its section, title and description."""

from __future__ import annotations

from airflow.sdk import Param

from tpu_rl.config import field_specs

_JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "dict": "object"}


def trigger_params() -> dict[str, Param]:
    params = {}
    for spec in field_specs():
        meta = spec.metadata
        json_type = _JSON_TYPES[spec.type]
        # An empty default means "none": the form must accept the field empty (null), not require it.
        schema = {"type": [json_type, "null"] if spec.default == "" else json_type, **meta["schema"]}
        if spec.default is None:
            # Required: no default, so the form asks for it and the run cannot start without it.
            params[spec.name] = Param(title=meta["title"], description=meta["description"], section=meta["section"], minLength=1, **schema)
        else:
            default = spec.default_factory() if spec.type == "dict" else spec.default
            params[spec.name] = Param(default, title=meta["title"], description=meta["description"], section=meta["section"], **schema)
    return params
