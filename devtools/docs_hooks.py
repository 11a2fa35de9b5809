"""The docs site's MkDocs hook (mkdocs.yml, `hooks:`): writes the configuration reference into
docs/configuration.md at build time, from the `Settings` fields themselves (name, help text, default, flag,
environment variable), so a new setting is documented the moment it exists and no page can say otherwise; and the
benchmark pages' tables from the benches' run records (bench/records/, bench/record.py), so a figure is what its
run measured. The README is outside the site: its figures rows that come from records are checked at each build
(the build fails when they differ from the records) and rewritten by `python -m devtools.docs_hooks`; docs/index.md
shows the README's figures table.

It lives in devtools/, not docs/: MkDocs copies every file of docs/ that is not a page into the site, and
devtools/ is linted and type-checked by `make lint` like the rest. Never imported by the service; it must
never change what it reads, only render it.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # MkDocs loads this file by its path, and bench/ is the repository's, not installed
    sys.path.insert(0, str(ROOT))

from bench import figures, figures_common, record  # noqa: E402
from extender import settings  # noqa: E402

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

REFERENCE_PAGE = "configuration.md"
INDEX_PAGE = "index.md"
README = ROOT / "README.md"
MARKER = "<!-- the settings reference: generated from extender/settings.py by devtools/docs_hooks.py -->"
"""Where in REFERENCE_PAGE the tables go; the build fails when the page lacks it."""

SECTION = re.compile(r"^\s*# -- (?P<title>.+?)\s*$")
"""The comments that group the fields of `Settings` (`# -- leader election`): the reference's headings."""
HEADER = "| setting, flag, variable | type | default | what it tunes |"
FLAG = re.compile(r"(?<![\w`-])(--[a-z][a-z0-9-]*)")
"""A flag named in a help text (`--tls-cert`), shown as code."""


class SettingsReferenceError(Exception):
    """The reference cannot be written: the page lacks its marker, or settings.py is not laid out as expected."""


def sections() -> list[tuple[str, list[dataclasses.Field[Any]]]]:
    """The fields of `Settings` in their order, under the `# -- ...` comment above each group. A field above
    the first comment is under "General"; one the class body does not declare (a test's) is in the last."""
    source = Path(settings.__file__).read_text()
    tree = ast.parse(source)
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == settings.Settings.__name__]
    if not found:
        raise SettingsReferenceError(f"no class {settings.Settings.__name__} in {settings.__file__}")
    cls = found[0]
    line_of = {
        node.target.id: node.lineno
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    titles = {
        number: match["title"]
        for number, line in enumerate(source.splitlines(), start=1)
        if cls.lineno <= number <= (cls.end_lineno or number) and (match := SECTION.match(line))
    }
    grouped: dict[str, list[dataclasses.Field[Any]]] = {}
    for field in settings.fields():
        line = line_of.get(field.name, cls.end_lineno or cls.lineno)  # not in the class body: the last group
        above = [number for number in titles if number < line]
        title = titles[max(above)] if above else "general"
        grouped.setdefault(FLAG.sub(r"`\1`", title[:1].upper() + title[1:]), []).append(field)
    return list(grouped.items())


def flags(field: dataclasses.Field[Any]) -> list[str]:
    """The command-line flags of a field: a boolean also has its `--no-` form (argparse's BooleanOptionalAction)."""
    flag = settings.flag(field)
    return [flag, "--no-" + flag[2:]] if isinstance(field.default, bool) else [flag]


def kind(field: dataclasses.Field[Any]) -> str:
    default = field.default
    if isinstance(default, enum.Enum):
        return "one of " + ", ".join(f"`{member.value}`" for member in type(default))
    if isinstance(default, bool):
        return "boolean"
    if isinstance(default, int):
        return "integer"
    if isinstance(default, float):
        return "number"
    return "string"


def default_text(field: dataclasses.Field[Any]) -> str:
    """The default as one would write it in a flag or the config file."""
    default = field.default
    if isinstance(default, enum.Enum):
        default = default.value
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    if default == "":
        return "(empty)"
    return f"`{default}`"


def help_text(field: dataclasses.Field[Any]) -> str:
    text = str(field.metadata["help"])
    return FLAG.sub(r"`\1`", text).replace("|", "\\|")


def row(field: dataclasses.Field[Any]) -> str:
    names = "<br>".join([f"`{field.name}`", *(f"`{flag}`" for flag in flags(field)), f"`{settings.env_name(field)}`"])
    return f"| {names} | {kind(field)} | {default_text(field)} | {help_text(field)} |"


def settings_reference() -> str:
    """Every setting, one table per group: the Markdown the marker is replaced with."""
    parts = []
    for title, fields in sections():
        parts += [f"### {title}", "", HEADER, "|---|---|---|---|"]
        parts += [row(field) for field in fields]
        parts.append("")
    return "\n".join(parts)


def fill(markdown: str) -> str:
    """The reference page with its marker replaced by the reference."""
    if MARKER not in markdown:
        raise SettingsReferenceError(f"docs/{REFERENCE_PAGE} lacks the line {MARKER!r}, where the reference goes")
    return markdown.replace(MARKER, settings_reference())


def on_pre_build(*, config: MkDocsConfig) -> None:
    """MkDocs' event before anything is built: the README's figures from records must be the records'."""
    stale = figures.stale_readme_rows(README.read_text()) + figures.stale_plots()
    if stale:
        from mkdocs.exceptions import PluginError

        raise PluginError(
            f"README.md's figures or the plots differ from bench/records ({stale}): run python -m devtools.docs_hooks"
        )


def on_page_markdown(markdown: str, /, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    """MkDocs' event for each page's Markdown before it is rendered."""
    try:
        if page.file.src_uri == REFERENCE_PAGE:
            markdown = fill(markdown)
        if page.file.src_uri == INDEX_PAGE:
            markdown = markdown.replace(figures.INDEX_MARKER, figures.readme_table_for_site(README.read_text()))
        return figures.fill_tables(markdown)
    except (SettingsReferenceError, figures_common.FiguresError, record.RecordError) as error:
        from mkdocs.exceptions import PluginError

        raise PluginError(str(error)) from None


if __name__ == "__main__":  # python -m devtools.docs_hooks: the README's figures and the plots from records, rewritten
    README.write_text(figures.fill_readme(README.read_text()))
    figures.write_plots()
