"""The documentation as a reader meets it: the README is a front door (short, the real-project quickstart first, its
commands the guide's own, its links alive), the reference pages the code defines are generated from it, and every
page the package's messages send a user to exists with the section they name. ``make test`` also builds the site
strictly (mkdocs: a broken link or anchor between pages fails)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from scripts import docs_reference
from tpu_rl_testing import REPO

pytestmark = pytest.mark.core

README = REPO / "README.md"
DOCS = REPO / "docs"
GUIDE = DOCS / "getting-started" / "composer.md"


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (MkDocs's default) gives a heading: code and links reduced to their
    text, lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, outside fenced code."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.+)", line)):
            found.add(slug(heading.group(1)))
    return found


@pytest.mark.parametrize("name", sorted(docs_reference.PAGES))
def test_each_generated_reference_page_is_what_the_code_defines_now(name):
    written = (DOCS / "reference" / name).read_text()
    assert written == docs_reference.PAGES[name](), f"docs/reference/{name} is stale: run make docs-pages"


def test_the_parameter_reference_has_every_field_of_the_form():
    from tpu_rl.config import field_specs

    assert {spec.name for spec in field_specs()} <= anchors(DOCS / "reference" / "parameters.md")


def test_the_readme_is_a_front_door():
    """At most 2,000 words, and a newcomer with a project reaches "Run it on your project" on the first screen."""
    text = README.read_text()
    assert len(text.split()) <= 2000
    lines = text.splitlines()
    assert "## Run it on your project" in lines[:60]
    assert lines.index("## Run it on your project") < lines.index("## Try it locally: the two commands")
    assert "no run on real TPUs" in text  # the status says plainly what is not verified


def test_the_readme_links_resolve():
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (REPO / path) if path else README
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert broken == []


def shell_lines(text: str) -> list[str]:
    """The commands of a text's ```bash blocks, continuation lines joined, comments and blank lines dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(re.sub(r"\s+", " ", line))
    return commands


def test_the_readme_quickstart_is_the_guides_own_commands():
    """The README's commands are the Composer guide's, so the two cannot drift apart (the guide is checked against
    the example conf, the simulation's IAM policy and the deploy's arguments by its own tests)."""
    guide = set(shell_lines(GUIDE.read_text()))
    readme = shell_lines(README.read_text())
    assert readme, "the README has no ```bash quickstart"
    assert [line for line in readme if line not in guide and not line.startswith("git clone")] == []


#: Where the code sends a reader: a docs page, optionally followed by the section's title in quotes.
DOC_REFERENCE = re.compile(
    r"""(docs/(?:(?:getting-started|how-to|troubleshooting|reference|explanation|project)/[\w.-]+|measurements|index)\.md)"""
    r"""(?:,? ['"]([^'"]+)['"])?"""
)


def code_files() -> list[Path]:
    roots = ("src", "sim", "scripts", "dags", "benchmarks", "tests")
    found = [path for root in roots for path in (REPO / root).rglob("*.py")]
    return found + [REPO / "Makefile", REPO / "docker-compose.yaml", *(REPO / "scripts").glob("*.sh")]


def test_every_page_and_section_the_code_names_exists():
    """A failure message or a comment that sends the reader to a page that moved is a dead end."""
    dead = []
    for path in code_files():
        for page, section in DOC_REFERENCE.findall(path.read_text(errors="replace")):
            target = REPO / page
            if not target.exists():
                dead.append(f"{path.relative_to(REPO)}: {page}")
            elif section and target.suffix == ".md" and slug(section) not in anchors(target):
                dead.append(f"{path.relative_to(REPO)}: {page}, '{section}'")
    assert dead == []
