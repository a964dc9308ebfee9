"""The troubleshooting page names every failure the package reports to a user, and the reference of what validation
refuses is what its script writes from the sources now.

A failure message is found in the sources (``src/tpu_rl``, read with ``ast``): the message argument of every ``raise``
of an exception built with one (the operators' ``AirflowFailException`` and ``AirflowException``, the sensors'
``AirflowSensorTimeout``, ``JobSetFailedError``, ``GkeRefusedError``, a program file's ``ProgramError``, the Training
tab's ``HTTPException``, a Kubernetes ``ApiException``, the ``ValueError`` a user can meet, ...), and every string
containing ``fix:`` (the helpers that build a message's fix). A message whose text is only placeholders
(``raise AirflowFailException(str(error))``) is followed to the functions that build its text (:data:`FOLLOWED`),
whose strings are then messages too.

A message's identifying text: cut the message at every placeholder (an f-string's ``{...}``, a variable, a call) and
normalise each constant piece (whitespace runs become one space, curly quotes straight ones). When the longest piece
has at least :data:`MIN_RUN` characters, that piece is the identifying text, and the page must contain it. Otherwise
the whole message is, with each placeholder matching any ``<...>`` on the page, quoted or not (the page writes
placeholders so). The page is normalised the same way before it is searched.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts import docs_validation

pytestmark = pytest.mark.core

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "tpu_rl"
TROUBLESHOOTING = REPO / "docs" / "troubleshooting" / "index.md"
VALIDATION = REPO / "docs" / "reference" / "validation.md"

#: The shortest constant piece that identifies a message on its own.
MIN_RUN = 20

#: Exceptions whose raises are not failure messages of their own: validation problems (their page is generated and
#: checked by test_validation_page_is_what_the_script_writes; ConfigError's own text is followed from validate_config),
#: an abstract method, and a skip (the task is skipped on purpose; its reason is logged, not a failure).
NOT_MESSAGES = {"SliceError", "ConfigError", "NotImplementedError", "AirflowSkipException"}

#: Where the message is not the first argument.
MESSAGE_ARGUMENT = {"GkeRefusedError": 1, "ProgramError": 2, "HTTPException": 1}
MESSAGE_KEYWORD = {"ApiException": "reason"}

#: Raises left out, by module and a fragment of the message's source: errors only a programming mistake can cause,
#: and errors caught before they reach a user.
LEFT_OUT = {
    ("operators/jobset.py", "give the cluster as cluster="): "an operator given two clusters: a programming mistake",
    ("operators/jobset.py", "no JobSet manifest given"): "an operator built without a manifest: a programming mistake",
    ("operators/jobset.py", "no cluster given"): "an operator built without a cluster: a programming mistake",
    ("operators/jobset.py", "needs metadata.name"): "a manifest built without a name: a programming mistake",
    ("operators/jobset.py", "Pathways JobSet name"): (
        "validate_config refuses a workload_prefix that makes such a name first (validation.md, workload_prefix)"
    ),
    ("hooks/kubernetes.py", "Give either kubernetes_conn_id"): "a ClusterTarget built wrong: a programming mistake",
    ("hooks/kubernetes.py", "A GKE cluster needs project_id"): "a ClusterTarget built wrong: a programming mistake",
    ("hooks/kubernetes.py", "endpoint is not resolved"): "a trigger given an unresolved cluster: a programming mistake",
    ("triggers/jobset.py", "Give the cluster as cluster="): "a trigger built with two clusters: a programming mistake",
    ("operators/publish.py", "must be folders ending in"): "prefixes the run's layout builds: a programming mistake",
    ("operators/publish.py", "overlap"): "prefixes the run's layout builds: a programming mistake",
    ("run_scope.py", "read before bind_scope"): "an operator that reads its scope too early: a programming mistake",
    ("retention.py", "is not one of"): "validate_config refuses keep_checkpoints outside its choices first",
    ("config_rules.py", "ValueError(value)"): "caught by RunConfig.from_params: the problem 'must be <type>'",
    ("config_rules.py", "TypeError(value)"): "caught by RunConfig.from_params: the problem 'must be <type>'",
    ("hub_datasets.py", "Unrecognized instruction format"): "caught by validate_training_rows: a validation problem",
    ("hub_datasets.py", "Unknown split"): "caught by validate_training_rows: a validation problem",
    ("event_files.py", "unsupported protobuf wire type"): "caught where progress is read: a warning in the task log",
    ("triggers/workload_log.py", "while this trigger claimed it"): "caught by the trigger: a warning, the wait goes on",
    ("triggers/workload_log.py", "LogUnavailable"): "caught by the trigger: the log is read again later",
}

#: Messages that are only placeholders, by module and the message's source (``ast.unparse``): the functions (module,
#: qualified name) that build their text, or why the text is not the package's.
FOLLOWED: dict[tuple[str, str], tuple[tuple[str, str], ...] | str] = {
    ("operators/setup.py", "str(error)"): (("config_rules.py", "ConfigError.__init__"),),
    ("operators/setup.py", "str(problem)"): (
        "a validation problem of conversion_cpu or conversion_memory (config_rules.conversion_fit_problems), on "
        "validation.md"
    ),
    ("operators/jobset.py", "failure"): (("jobset_status.py", "explain_failure"),),
    ("operators/preflight.py", "result.failure()"): (
        ("preflight.py", "Preflight.failure"),
        ("preflight.py", "_reservation"),
        ("preflight.py", "_reservation_fit"),
        ("preflight.py", "_tpu_quota"),
        ("preflight.py", "_quota"),
    ),
    ("operators/jobset.py", "event['message']"): (
        ("triggers/jobset.py", "JobSetTrigger._deleted_message"),
        ("triggers/jobset.py", "JobSetTrigger._stuck_event"),
        ("watchdog.py", "_start_message"),
        ("watchdog.py", "_first_step_message"),
        ("watchdog.py", "_stall_message"),
        ("jobset_status.py", "explain_failure"),
    ),
    ("operators/tpu_pools.py", "failure"): (
        ("operators/tpu_pools.py", "TpuPoolPass._refused_at_once"),
        ("operators/tpu_pools.py", "TpuPoolPass.operation_done"),
        ("operators/tpu_pools.py", "TpuPoolPass._create_failed"),
    ),
    ("operators/workloads.py", "f\"{message}\\n{event['message']}\""): (
        ("preemption.py", "budget_spent_message"),
        ("watchdog.py", "repeated_message"),
        ("jobset_status.py", "explain_failure"),
    ),
    ("sensors/checkpoints.py", "event['message']"): (("triggers/checkpoints.py", "GcsOutputTrigger.run"),),
    ("programs.py", "problems"): (
        ("programs.py", "ProgramError.__init__"),
        ("programs.py", "parse_program"),
        ("programs.py", "_data_end_problems"),
    ),
    ("hooks/gke.py", "self._denied(refused)"): (("gke.py", "permission_fix"),),
    ("hooks/kubernetes.py", "self._with_permission_fix(refused)"): (("gke.py", "permission_fix"),),
    ("hooks/gke.py", "str(refused.message)"): "GKE's own words; the operators that read the refusal add theirs",
    ("hooks/kubernetes.py", "(await response.text())[:2000]"): "the Kubernetes API server's own answer",
}

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
#: A placeholder on the page: any text in angle brackets, in quotes where the message shows its value quoted.
_PLACEHOLDER = "['\"]?<[^<>]*>['\"]?"


@dataclass(frozen=True)
class Message:
    """A failure message found in the sources: where, and its pieces (None: a placeholder)."""

    module: str
    line: int
    pieces: tuple[str | None, ...]

    @property
    def shown(self) -> str:
        return normalise("".join("<...>" if piece is None else piece for piece in self.pieces))

    @property
    def only_placeholders(self) -> bool:
        return not any(piece and re.search(r"[A-Za-z]", piece) for piece in self.pieces)

    @property
    def skeleton(self) -> str:
        """The whole message as the page must hold it when no piece identifies it: placeholders as ``<...>``."""
        return normalise("".join("<...>" if piece is None else piece for piece in _merged(self)))

    def identifying(self) -> tuple[str, str]:
        """("text", its longest constant piece) or ("pattern", the whole message, placeholders as ``<...>``)."""
        runs = [normalise(piece) for piece in self.pieces if piece]
        longest = max(runs, key=len, default="")
        if len(longest) >= MIN_RUN:
            return "text", longest
        pattern = "".join(_PLACEHOLDER if piece is None else re.escape(_collapse(piece)) for piece in _merged(self))
        return "pattern", pattern.strip()

    def found_in(self, page: str) -> bool:
        kind, identifying = self.identifying()
        return identifying in page if kind == "text" else re.search(identifying, page) is not None


def normalise(text: str) -> str:
    return _collapse(text).strip()


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text.translate(_QUOTES))


def _merged(message: Message) -> list[str | None]:
    """The pieces with adjacent placeholders as one, and the ends' whitespace dropped."""
    merged: list[str | None] = []
    for piece in message.pieces:
        if piece is None and merged and merged[-1] is None:
            continue
        merged.append(piece)
    if merged and merged[0] is not None:
        merged[0] = merged[0].lstrip()
    if merged and merged[-1] is not None:
        merged[-1] = merged[-1].rstrip()
    return merged


# -- reading the sources ---------------------------------------------------------------------------------------


def sources(root: Path = SRC) -> dict[str, str]:
    """Every module of the package: its path under ``root`` -> its text."""
    return {path.relative_to(root).as_posix(): path.read_text() for path in sorted(root.rglob("*.py"))}


def pieces(node: ast.expr) -> tuple[str | None, ...]:
    """A message expression cut into constant pieces and placeholders (None)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.JoinedStr):
        return tuple(part.value if isinstance(part, ast.Constant) else None for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return pieces(node.left) + pieces(node.right)
    return (None,)


def message_expressions(node: ast.expr) -> list[ast.expr]:
    """The messages an expression may be: both sides of a condition, each element of a list."""
    if isinstance(node, ast.IfExp):
        return message_expressions(node.body) + message_expressions(node.orelse)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [m for element in node.elts for m in message_expressions(element)]
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return message_expressions(node.elt)
    return [node]


def raised_message(node: ast.Raise) -> tuple[str, ast.expr] | None:
    """(exception class, its message argument) of ``raise X(...)``; None for a re-raise or a bare class."""
    call = node.exc
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if not name[:1].isupper():  # a helper that builds the exception: its text is the helper's
        return name, call
    if name in MESSAGE_KEYWORD:
        found = [k.value for k in call.keywords if k.arg == MESSAGE_KEYWORD[name]]
        return (name, found[0]) if found else None
    index = MESSAGE_ARGUMENT.get(name, 0)
    return (name, call.args[index]) if len(call.args) > index else None


@dataclass
class Found:
    """What the sources hold: the messages, the raises left out or followed, and what nothing explains."""

    messages: list[Message]
    unexplained: list[str]
    used_keys: set[tuple[str, str]]


def failure_messages(modules: dict[str, str]) -> Found:
    """The failure messages of ``modules`` (path under ``src/tpu_rl`` -> source), each once per module."""
    trees = {path: ast.parse(text, path) for path, text in modules.items()}
    found = Found([], [], set())
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and (raised := raised_message(node)) is not None:
                _raise(found, trees, path, node, *raised)
        found.messages += fix_strings(path, tree)
    unique: dict[tuple[str, tuple[str | None, ...]], Message] = {}
    for message in found.messages:
        unique.setdefault((message.module, message.pieces), message)
    found.messages = list(unique.values())
    return found


def _raise(found: Found, trees: dict[str, ast.Module], path: str, node: ast.Raise, kind: str, arg: ast.expr) -> None:
    """One raise: its messages, or the functions it is followed to, or why it is left out."""
    if kind in NOT_MESSAGES:
        return
    source = ast.unparse(node.exc)
    left_out = [key for key in LEFT_OUT if key[0] == path and key[1] in source]
    if left_out:
        found.used_keys.update(left_out)
        return
    for expression in message_expressions(arg):
        message = Message(path, node.lineno, pieces(expression))
        if not message.only_placeholders:
            found.messages.append(message)
            continue
        key = (path, ast.unparse(expression))
        if key not in FOLLOWED:
            found.unexplained.append(f"src/tpu_rl/{path}:{node.lineno}: raise {kind} with {key[1]!r}")
            continue
        found.used_keys.add(key)
        if not isinstance(FOLLOWED[key], str):
            found.messages += [m for builder in FOLLOWED[key] for m in built_messages(trees, *builder)]


def built_messages(trees: dict[str, ast.Module], path: str, qualname: str) -> list[Message]:
    """The strings a function builds its message from: what it returns, assigns, appends or hands to
    ``super().__init__``; each a phrase (constant text with a letter and a space)."""
    function = _function(trees[path], qualname)
    expressions = []
    for node in ast.walk(function):
        if isinstance(node, ast.Return) and node.value is not None:
            expressions.append(node.value)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            expressions.append(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("append", "__init__") and node.args:
                expressions.append(node.args[0])
    messages = [Message(path, e.lineno, pieces(e)) for x in expressions for e in message_expressions(x)]
    return [m for m in messages if not m.only_placeholders and " " in "".join(p or "" for p in m.pieces).strip()]


def _function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    for name in qualname.split("."):
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        node = next(n for n in scope if isinstance(n, kinds) and n.name == name)
        scope = node.body
    return node


def fix_strings(path: str, tree: ast.Module) -> list[Message]:
    """Every string (not a docstring, not a piece of an f-string) whose text says ``fix:``, with the strings it is
    added to (``"a" + b + "; fix: c"``)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Constant, ast.JoinedStr)):
            continue
        if isinstance(parents.get(node), (ast.JoinedStr, ast.Expr)):  # a piece of an f-string, a docstring
            continue
        whole = node
        while isinstance(parent := parents.get(whole), ast.BinOp) and isinstance(parent.op, ast.Add):
            whole = parent
        message = Message(path, whole.lineno, pieces(whole))
        if re.search(r"(?<![\w.])fix:", "".join(p or "" for p in message.pieces)):
            found.append(message)
    return found


def missing(messages: list[Message], page: str) -> list[str]:
    """Each message the page lacks: where it is raised, how it reads, and the text the page must hold."""
    text = normalise(page)
    return [
        f"src/tpu_rl/{m.module}:{m.line}: {m.shown}\n    the page needs: "
        + (m.identifying()[1] if m.identifying()[0] == "text" else f"{m.skeleton} (any <...> for each <...>)")
        for m in messages
        if not m.found_in(text)
    ]


# -- the checks ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def found() -> Found:
    return failure_messages(sources())


def test_every_failure_message_is_on_the_troubleshooting_page(found):
    gaps = missing(found.messages, TROUBLESHOOTING.read_text())
    assert not gaps, f"{len(gaps)} failure message(s) are not on {TROUBLESHOOTING.relative_to(REPO)}:\n" + "\n".join(
        gaps
    )


def test_every_message_of_placeholders_is_followed_or_explained(found):
    assert not found.unexplained, (
        "Messages with no text of their own: add the functions that build them to FOLLOWED (or say in LEFT_OUT why "
        "no user meets them):\n" + "\n".join(found.unexplained)
    )


def test_every_exception_left_out_or_followed_is_still_raised(found):
    stale = [key for key in [*LEFT_OUT, *FOLLOWED] if key not in found.used_keys]
    assert not stale, f"LEFT_OUT or FOLLOWED name raises the sources no longer make: {stale}"


def test_validation_page_is_what_the_script_writes():
    assert VALIDATION.read_text() == docs_validation.page(), (
        f"{VALIDATION.relative_to(REPO)} differs from the sources: run .venv/bin/python -m scripts.docs_validation"
    )


# -- each check fails when it should ---------------------------------------------------------------------------

#: A module a contributor might add: a new failure, a short one, one of placeholders only, and a helper's fix.
SCRATCH = """from tpu_rl.compat import AirflowException, AirflowFailException

HINT = "fix: turn the slice off and on again"

def fail(name, state, error):
    raise AirflowFailException(f"cluster {name} melted in the night; fix: let it cool, then clear create_cluster")
    raise AirflowException(f"Pool {name} is {state}")
    raise AirflowFailException(str(error))
"""


def test_a_message_the_page_lacks_is_reported_where_it_is_raised(found):
    """One message identified by a piece and one by its whole text: each is on the page, and reported once its
    entry is cut from the page."""
    page = normalise(TROUBLESHOOTING.read_text())
    kinds = {message.identifying()[0]: message for message in found.messages}
    assert set(kinds) == {"text", "pattern"}
    for kind, message in kinds.items():
        identifying = message.identifying()[1]
        cut = page.replace(identifying, "") if kind == "text" else re.sub(identifying, "", page)
        assert missing([message], page) == []
        (gap,) = missing([message], cut)
        assert gap.startswith(f"src/tpu_rl/{message.module}:{message.line}: ")


def test_a_new_raise_is_reported_until_the_page_has_it():
    found = failure_messages({**sources(), "operators/scratch.py": SCRATCH})
    new = [message for message in found.messages if message.module == "operators/scratch.py"]
    gaps = missing(new, TROUBLESHOOTING.read_text())
    where = "src/tpu_rl/operators/scratch.py"
    assert sorted(gap.split("\n")[0] for gap in gaps) == [
        f"{where}:{_line('HINT')}: fix: turn the slice off and on again",
        f"{where}:{_line('melted')}: cluster <...> melted in the night; fix: let it cool, then clear create_cluster",
        f"{where}:{_line('Pool')}: Pool <...> is <...>",
    ]
    unexplained = [line for line in found.unexplained if line.startswith(where)]
    assert unexplained == [f"{where}:{_line('str(error)')}: raise AirflowFailException with 'str(error)'"]
    entries = "\n".join(
        ["", "```text", "cluster <cluster> melted in the night; fix: let it cool, then clear create_cluster"]
        + ["Pool <pool> is <state>", "fix: turn the slice off and on again", "```"]
    )
    assert missing(new, TROUBLESHOOTING.read_text() + entries) == []


def _line(words: str) -> int:
    """The line of SCRATCH that holds ``words``."""
    return next(number for number, line in enumerate(SCRATCH.splitlines(), 1) if words in line)


def test_a_new_problem_or_another_line_form_changes_the_validation_page(tmp_path):
    root = tmp_path / "tpu_rl"
    shutil.copytree(SRC, root, ignore=shutil.ignore_patterns("__pycache__"))
    rules = root / "config_rules.py"
    text = rules.read_text()
    haunted = '\n\ndef _validate_haunting(c):\n    yield Problem("project", "is haunted", "call a priest")\n'
    rules.write_text(text + haunted)
    page = docs_validation.page(root)
    assert "- `project: is haunted; fix: call a priest.` (`config_rules._validate_haunting`)" in page
    assert page != VALIDATION.read_text()
    assert '"{self.field}: {self.message}; fix: ' in text  # the line's form is Problem.__str__'s, read from it
    rules.write_text(text.replace('"{self.field}: {self.message}; fix: ', '"{self.field}: {self.message}; remedy: '))
    assert "- `project: '<project>' is not a project ID; remedy: use 6-30" in docs_validation.page(root)
