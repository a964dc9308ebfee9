"""Releases a user can find and trust. CHANGELOG.md names every release ever made with the commit that set its
version and the SHA-256 of the wheel that commit builds, so a deployed wheel can be traced to its release and a
rollback can rebuild it from a fresh clone (the deploy refuses a second, different wheel under a version the
repository already has). The procedure these checks hold a release to: docs/project/releases.md."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import date
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest

import tpu_rl

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "CHANGELOG.md"
INIT = "src/tpu_rl/__init__.py"
#: What a release's package is made of: a commit that changes one of them changes the wheel it builds.
PACKAGE_PATHS = ("src", "pyproject.toml")
PROCEDURE = "docs/project/releases.md"

_HEADING = re.compile(r"^## \[(?P<version>[^\]]*)\] - (?P<date>.*)$", re.M)
_IDENTITY = re.compile(
    r"^Commit: `(?P<commit>[0-9a-f]{40})` · Wheel SHA-256: (?:`(?P<sha>[0-9a-f]{64})`|not reproducible \(.+\))$", re.M
)
_SAME_NUMBER = re.compile(
    r"^Same number, later package: `(?P<first>[0-9a-f]{12})`\.\.`(?P<last>[0-9a-f]{12})` \((?P<count>\d+) commits?\)",
    re.M,
)
_SUBSECTIONS = {"Upgrading", "Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
_VERSION = re.compile(r"\d+\.\d+\.\d+")
_VERSION_LINE = re.compile(r'^__version__ = "(?P<version>[^"]+)"$', re.M)


@dataclass(frozen=True)
class Release:
    version: str
    date: str
    commit: str
    #: None where the release's commit cannot rebuild its wheel (it predates scripts/build_wheel.py).
    wheel_sha256: str | None
    #: The first and last commits (abbreviated) that changed the package under this number after its commit, and
    #: how many did.
    later_package: tuple[str, str, int] | None


def parse(text: str) -> tuple[list[Release], list[str]]:
    """The releases, newest first as written, and what in a section is not in the changelog's form."""
    releases, problems = [], []
    headings = list(_HEADING.finditer(text))
    for heading, following in pairwise([*headings, None]):
        body = text[heading.end() : following.start() if following else len(text)]
        version = heading["version"]
        identity = _IDENTITY.search(body)
        if not identity or body.strip().splitlines()[0] != identity.group(0):
            problems.append(f"{version}: its first line is not 'Commit: `<40 hex>` · Wheel SHA-256: ...'")
            continue
        subsections = re.findall(r"^### (.+)$", body, re.M)
        if subsections[:1] != ["Upgrading"] or not set(subsections) <= _SUBSECTIONS:
            problems.append(f"{version}: subsections {subsections}: '### Upgrading' first, then {sorted(_SUBSECTIONS)}")
        same = _SAME_NUMBER.search(body)
        later = (same["first"], same["last"], int(same["count"])) if same else None
        releases.append(Release(version, heading["date"], identity["commit"], identity["sha"], later))
    return releases, problems


def order_problems(releases: list[Release], package_version: str) -> list[str]:
    """The newest release is the package's version; versions descend strictly and dates never rise going down."""
    if not releases:
        return ["CHANGELOG.md has no release section ('## [X.Y.Z] - YYYY-MM-DD')"]
    problems = []
    if releases[0].version != package_version:
        problems.append(
            f"the newest release in CHANGELOG.md is {releases[0].version}, the package is {package_version} "
            "(tpu_rl.__version__ as installed: make venv installs the checkout's)"
        )
    for release in releases:
        if not _VERSION.fullmatch(release.version):
            problems.append(f"'{release.version}' is not a version X.Y.Z")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", release.date) or not _is_date(release.date):
            problems.append(f"{release.version}: '{release.date}' is not a date YYYY-MM-DD")
    for newer, older in pairwise(releases):
        if _version_key(newer.version) <= _version_key(older.version):
            problems.append(f"{newer.version} is above {older.version}: versions must descend strictly, each once")
        if _is_date(newer.date) and _is_date(older.date) and newer.date < older.date:
            problems.append(f"{newer.version} ({newer.date}) is dated before {older.version} ({older.date})")
    return problems


def _is_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def git(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


@cache
def version_at(commit: str) -> str | None:
    """``__version__`` as the commit has it; None where it has no such file (before the distribution)."""
    shown = git("show", f"{commit}:{INIT}")
    found = _VERSION_LINE.search(shown.stdout) if shown.returncode == 0 else None
    return found["version"] if found else None


@cache
def versions_ever_set() -> frozenset[str]:
    commits = git("log", "--format=%H", "-G", "^__version__ = ", "--", INIT).stdout.split()
    return frozenset(filter(None, map(version_at, commits)))


@cache
def sets_version(commit: str, version: str) -> bool:
    """The commit is in HEAD's history, has ``version`` and no parent of it has: it set that version."""
    if git("merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
        return False
    parents = git("rev-list", "--parents", "-n", "1", commit).stdout.split()[1:]
    return version_at(commit) == version and all(version_at(parent) != version for parent in parents)


@cache
def later_package_commits(commit: str, next_commit: str) -> tuple[str, ...]:
    """The commits after ``commit`` and before ``next_commit`` that changed the package, oldest first."""
    listed = git("log", "--no-merges", "--format=%ct %H", f"{commit}..{next_commit}", "--", *PACKAGE_PATHS)
    rows = sorted((int(stamp), sha) for stamp, sha in (line.split() for line in listed.stdout.splitlines()))
    return tuple(sha for _, sha in rows if sha != next_commit)


def history_problems(releases: list[Release]) -> list[str]:
    """Every version ever set has its entry, each entry's commit set that version, and each 'Same number' line
    names the commits that changed the package under that number before the next release's commit."""
    entered = {release.version for release in releases}
    problems = [
        f"{version} was set in {INIT} but has no entry in CHANGELOG.md"
        for version in sorted(versions_ever_set() - entered, key=_version_key)
    ]
    for release in releases:
        if not sets_version(release.commit, release.version):
            problems.append(
                f"{release.version}: commit {release.commit} is not the commit in this history that set "
                f'__version__ = "{release.version}" ({PROCEDURE} says when it is filled in)'
            )
    for newer, release in pairwise(releases):
        if sets_version(newer.commit, newer.version) and sets_version(release.commit, release.version):
            problems += _same_number_problems(release, newer)
    return problems


def _same_number_problems(release: Release, newer: Release) -> list[str]:
    later = later_package_commits(release.commit, newer.commit)
    expected = (later[0][:12], later[-1][:12], len(later)) if later else None
    if release.later_package == expected:
        return []
    wanted = f"`{expected[0]}`..`{expected[1]}` ({expected[2]} commits)" if expected else "no such line"
    return [
        f"{release.version}: its 'Same number, later package' line should name {wanted}: the commits after "
        f"{release.commit[:12]} and before {newer.version}'s that changed {' or '.join(PACKAGE_PATHS)}"
    ]


def release_tags() -> dict[str, str]:
    """The clone's tags vX.Y.Z and the commits they point at (a clone need not have them)."""
    listed = git("for-each-ref", "refs/tags", "--format=%(refname:short) %(objectname) %(*objectname)").stdout
    rows = (line.split() for line in listed.splitlines())
    return {row[0]: row[-1] for row in rows if re.fullmatch(r"v\d+\.\d+\.\d+", row[0])}


def tag_problems(releases: list[Release], tags: dict[str, str]) -> list[str]:
    """A release's tag, where the clone has it, is on the commit its entry names: `git checkout vX.Y.Z` is that."""
    named = {f"v{release.version}": release.commit for release in releases}
    return [
        f"tag {tag} is on {commit}, but CHANGELOG.md names {named.get(tag, 'no such release')}"
        for tag, commit in sorted(tags.items())
        if named.get(tag) != commit
    ]


def wheel_problem(release: Release, sha256: str) -> str | None:
    """What a wheel built from the working tree says of the newest release."""
    if release.wheel_sha256 == sha256:
        return None
    return (
        f"the package differs from release {release.version} as recorded (its wheel: {release.wheel_sha256}; built "
        f"now: {sha256}); make a new release (bump __version__, add its CHANGELOG entry: {PROCEDURE})"
    )


def rollback_problem(release: Release, sha256: str) -> str | None:
    """What a rebuild of an earlier release's commit from a fresh clone says of its entry."""
    if release.wheel_sha256 == sha256:
        return None
    return (
        f"release {release.version} as recorded (commit {release.commit}, wheel {release.wheel_sha256}) is not what "
        f"that commit builds from a fresh clone ({sha256}): a rollback to it would not find its wheel; the entry's "
        "commit or SHA-256 is wrong"
    )


def built_sha256(checkout: Path, out_dir: Path) -> str:
    """The SHA-256 of what ``make wheel`` builds in ``checkout``: its own scripts/build_wheel.py, this interpreter."""
    built = subprocess.run(
        [sys.executable, "scripts/build_wheel.py", str(out_dir)], cwd=checkout, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    (wheel,) = out_dir.glob("tpu_rl-*.whl")
    return hashlib.sha256(wheel.read_bytes()).hexdigest()


def rebuilt_from_a_fresh_clone(commit: str, tmp: Path) -> str:
    """A rollback's build: a new clone, the release's commit checked out, built with that commit's own script."""
    clone = tmp / "clone"
    cloned = git("clone", "-q", "--no-checkout", str(REPO), str(clone), cwd=tmp)
    assert cloned.returncode == 0, cloned.stderr
    checked_out = git("checkout", "-q", commit, cwd=clone)
    assert checked_out.returncode == 0, checked_out.stderr
    return built_sha256(clone, tmp / "dist")


def _shallow() -> bool:
    return git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"


needs_history = pytest.mark.skipif(
    _shallow(), reason="a shallow clone lacks the commits that set the versions: history checks need a full clone"
)


@pytest.fixture(scope="module")
def changelog() -> list[Release]:
    releases, problems = parse(CHANGELOG.read_text())
    assert not problems, "\n".join(problems)
    return releases


@pytest.fixture(scope="module")
def previous_reproducible(changelog) -> Release:
    """The release a rollback from the newest goes back to: the newest earlier one with a reproducible wheel."""
    earlier = [release for release in changelog[1:] if release.wheel_sha256]
    assert earlier, "no release before the newest records a wheel SHA-256"
    return earlier[0]


@pytest.fixture(scope="module")
def builds(changelog, previous_reproducible, tmp_path_factory):
    """The two wheels the checks compare, built side by side (a build is seconds, mostly pip setting up its
    backend): the working tree's, and the previous reproducible release's from a fresh clone."""
    with ThreadPoolExecutor(2) as pool:
        now = pool.submit(built_sha256, REPO, tmp_path_factory.mktemp("now"))
        rollback = (
            None
            if _shallow()
            else pool.submit(
                rebuilt_from_a_fresh_clone, previous_reproducible.commit, tmp_path_factory.mktemp("rollback")
            )
        )
        yield {"now": now, "rollback": rollback}


def test_the_newest_release_is_the_packages_version_and_versions_descend(changelog):
    problems = order_problems(changelog, tpu_rl.__version__)
    assert not problems, "\n".join(problems)


@needs_history
def test_every_version_ever_set_has_an_entry_naming_the_commit_that_set_it(changelog):
    problems = history_problems(changelog) + tag_problems(changelog, release_tags())
    assert not problems, "\n".join(problems)


def test_the_wheel_built_now_is_the_newest_release(changelog, builds):
    """One version per released state: a change to the package fails here until it is a release of its own."""
    problem = wheel_problem(changelog[0], builds["now"].result())
    assert problem is None, problem


@needs_history
def test_the_previous_release_rebuilds_from_a_fresh_clone(previous_reproducible, builds):
    """A rollback: the release's commit as the changelog names it, built by its own scripts/build_wheel.py, gives
    the very wheel the repository holds, so the deploy finds it instead of refusing a second wheel."""
    problem = rollback_problem(previous_reproducible, builds["rollback"].result())
    assert problem is None, problem


def test_a_wrong_sha_256_is_caught(changelog, previous_reproducible, builds):
    """Both wheel checks tell the recorded SHA-256 from another: the newest release's and a rollback's."""
    another = hashlib.sha256(b"another wheel").hexdigest()
    now = builds["now"].result()
    newest = replace(changelog[0], wheel_sha256=now)
    rebuilt = previous_reproducible.wheel_sha256

    assert wheel_problem(newest, now) is None
    differs = wheel_problem(replace(newest, wheel_sha256=another), now)
    assert f"the package differs from release {newest.version} as recorded" in differs
    assert rollback_problem(previous_reproducible, rebuilt) is None
    wrong = replace(previous_reproducible, wheel_sha256=another)
    assert f"release {wrong.version} as recorded" in rollback_problem(wrong, rebuilt)


@needs_history
def test_a_missing_entry_a_wrong_commit_a_wrong_range_or_a_wrong_tag_is_caught(changelog):
    historical = [release for release in changelog if release.version in versions_ever_set()]
    assert len(historical) >= 3, "the checks below need three releases in the history"
    dropped, swapped, ranged = historical[1], historical[-1], historical[-2]
    baseline = set(history_problems(changelog))

    def new_problems(releases: list[Release]) -> str:
        return "\n".join(set(history_problems(releases)) - baseline)

    missing = [release for release in changelog if release is not dropped]
    assert f"{dropped.version} was set in {INIT} but has no entry" in new_problems(missing)
    wrong_commit = [replace(r, commit=ranged.commit) if r is swapped else r for r in changelog]
    assert f"{swapped.version}: commit {ranged.commit} is not the commit" in new_problems(wrong_commit)
    wrong_range = [replace(r, later_package=("0" * 12, "f" * 12, 1)) if r is ranged else r for r in changelog]
    assert f"{ranged.version}: its 'Same number, later package' line" in new_problems(wrong_range)
    assert not tag_problems(changelog, {f"v{ranged.version}": ranged.commit})
    assert tag_problems(changelog, {f"v{ranged.version}": swapped.commit}) == [
        f"tag v{ranged.version} is on {swapped.commit}, but CHANGELOG.md names {ranged.commit}"
    ]
