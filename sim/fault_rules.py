"""A file of fault rules that a stand-in reads on each request and a test or the fault campaign writes: JSON, one
rule per name, read and changed under an exclusive lock (sim/gke_faults.py, sim/storage_faults.py)."""

import fcntl
import json
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked_rules(path: Path):
    """Yields the rules (a dict, changed in place) under the file's lock; written back only when changed (the
    stand-ins look for rules on every request)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            text = path.read_text() if path.exists() else ""
            rules = json.loads(text) if text else {}
        except ValueError:
            rules = {}
        yield rules
        changed = json.dumps(rules, indent=1, sort_keys=True)
        if changed != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(changed)
            tmp.replace(path)


def put_rule(path: Path, name: str, kind: str, **fields) -> dict:
    """Sets rule ``name`` of ``kind`` with the fields given (None: left out), none of its uses counted yet."""
    rule = {"kind": kind, "applied": 0, **{field: value for field, value in fields.items() if value is not None}}
    with locked_rules(path) as rules:
        rules[name] = rule
    return rule


def list_rules(path: Path) -> dict:
    with locked_rules(path) as rules:
        return dict(rules)


def clear_rules(path: Path, name: str | None = None) -> None:
    """Removes the rule ``name``, or every rule."""
    with locked_rules(path) as rules:
        if name is None:
            rules.clear()
        else:
            rules.pop(name, None)


def take_first(path: Path, matches) -> tuple[str, dict] | None:
    """The first rule (by name) for which ``matches(rule)`` is true and that has uses left (``times``), as (name,
    rule); counts the use in its ``applied``. None when none does (or there is no file)."""
    if not path.exists():
        return None
    with locked_rules(path) as rules:
        for name in sorted(rules):
            rule = rules[name]
            if not matches(rule):
                continue
            if rule.get("times") is not None and rule.get("applied", 0) >= rule["times"]:
                continue
            rule["applied"] = rule.get("applied", 0) + 1
            return name, dict(rule)
    return None
