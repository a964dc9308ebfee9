"""MkDocs hooks of the documentation site (mkdocs.yml). Three files keep their one home at the repository's root,
where a reader of the repository looks for them, and the site shows them unchanged: README.md as the site's home
page, CHANGELOG.md as changelog.md, and LICENSE. Their links are written from the root (``docs/how-to/upgrade.md``);
on the site those pages sit at the docs' root, so the links lose their ``docs/``."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
#: The site's page -> the repository file it shows.
FROM_THE_ROOT = {"index.md": "README.md", "changelog.md": "CHANGELOG.md", "LICENSE": "LICENSE"}


def on_files(files, config):
    for page, source in FROM_THE_ROOT.items():
        files.append(File.generated(config, page, abs_src_path=str(REPO / source)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri in FROM_THE_ROOT:
        for page_name, source in FROM_THE_ROOT.items():
            markdown = markdown.replace(f"]({source})", f"]({page_name})")
        return markdown.replace("](docs/", "](")
    return markdown
