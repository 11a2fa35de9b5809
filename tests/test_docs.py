"""The docs say what the code does: the site builds strictly (a broken link, anchor or nav entry fails), its
configuration reference is written from every setting at build time, its HTTP page names every route,
ARCHITECTURE.md (the site's architecture page) names every module, and the README's quick start is the two
commands CI runs."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import docs_hooks
from extender import settings
from extender.service.context import Service
from extender.service.verbs import build_server
from tests.builders import make_cluster
from tests.conftest import make_service

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
HTTP_PAGE = DOCS / "how-it-works" / "http.md"


# ---- the site ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it: strictly, so every warning (a link to a page or an anchor that does
    not exist, a page left out of the nav) fails. About two seconds."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", "mkdocs.yml", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's notice about MkDocs 2.0, printed on every build
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-4000:]}"
    return out


def test_every_page_is_built(site: Path) -> None:
    pages = [path.relative_to(DOCS).with_suffix(".html") for path in DOCS.rglob("*.md")]
    assert not [str(page) for page in pages if not (site / page).is_file()]


def test_the_built_configuration_page_has_every_setting(site: Path) -> None:
    """The hook ran: the page the site serves, not only the generator, names each setting's variable."""
    page = (site / "configuration.html").read_text()
    missing = [settings.env_name(field) for field in settings.fields() if settings.env_name(field) not in page]
    assert not missing, f"settings missing from the built configuration page: {missing}"
    assert docs_hooks.MARKER not in page


def test_the_readmes_links_reach_files_and_anchors_that_exist(site: Path) -> None:
    """The README is outside the site, so the strict build does not check it: its links into the docs are
    checked here, anchors against the pages as built."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if not path:  # an anchor of the README itself: a heading's slug
            headings = re.findall(r"^#+ (.+)$", README, re.MULTILINE)
            if anchor not in [re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-") for heading in headings]:
                broken.append(target)
        elif not (ROOT / path).is_file():
            broken.append(target)
        elif anchor and path.startswith("docs/"):
            page = site / Path(path).relative_to("docs").with_suffix(".html")
            if f'id="{anchor}"' not in page.read_text():
                broken.append(target)
    assert not broken, f"README links to nothing: {broken}"


def test_the_architecture_page_is_architecture_md(site: Path) -> None:
    page = (site / "architecture.html").read_text()
    headings = re.findall(r"^## (.+)$", (ROOT / "ARCHITECTURE.md").read_text(), re.MULTILINE)
    assert headings and all(heading in page for heading in headings)


# ---- the configuration reference, generated from Settings -------------------------------------------------


def test_the_reference_has_a_row_for_every_setting_with_its_flag_variable_default_and_help() -> None:
    reference = docs_hooks.settings_reference()
    for field in settings.fields():
        row = docs_hooks.row(field)
        assert row in reference
        assert f"`{settings.flag(field)}`" in row and f"`{settings.env_name(field)}`" in row
        assert docs_hooks.default_text(field) in row and docs_hooks.help_text(field) in row


def test_a_new_setting_is_in_the_reference_without_editing_a_page(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass
    class New:
        frobnicate_timeout: float = dataclasses.field(default=3.0, metadata={"help": "Seconds to frobnicate."})

    known = settings.fields()
    monkeypatch.setattr(settings, "fields", lambda: (*known, *dataclasses.fields(New)))
    reference = docs_hooks.settings_reference()
    row = "| `frobnicate_timeout`<br>`--frobnicate-timeout`<br>`EXTENDER_FROBNICATE_TIMEOUT` | number | `3` |"
    assert row + " Seconds to frobnicate. |" in reference


def test_the_reference_is_grouped_as_settings_py_groups_the_fields_in_their_order() -> None:
    groups = docs_hooks.sections()
    source = Path(settings.__file__).read_text()
    titles = [title[:1].upper() + title[1:] for title in re.findall(r"^\s+# -- (.+)$", source, re.MULTILINE)]
    assert [title.replace("`", "") for title, _ in groups] == titles
    assert [field.name for _, fields in groups for field in fields] == [field.name for field in settings.fields()]


@pytest.mark.parametrize(
    ("name", "written"),
    [
        ("leader_elect", "`true`"),  # a boolean as the config file and the variable take it
        ("header_timeout", "`10`"),  # 10.0 seconds, written as one would type it
        ("protocol", "`gpushare`"),  # an enum by its value
        ("tls_cert", "(empty)"),
        ("max_body_bytes", "`33554432`"),
    ],
)
def test_defaults_are_written_as_one_would_give_them(name: str, written: str) -> None:
    field = next(field for field in settings.fields() if field.name == name)
    assert docs_hooks.default_text(field) == written


def test_a_boolean_setting_lists_its_no_flag_and_an_enum_its_choices() -> None:
    by_name = {field.name: field for field in settings.fields()}
    assert docs_hooks.flags(by_name["leader_elect"]) == ["--leader-elect", "--no-leader-elect"]
    assert docs_hooks.kind(by_name["protocol"]) == "one of `gpushare`, `hami`"


def test_flags_in_a_help_text_are_code_and_a_pipe_does_not_split_the_table() -> None:
    @dataclasses.dataclass
    class Odd:
        odd: str = dataclasses.field(default="", metadata={"help": "With --tls-cert: a | b."})

    assert docs_hooks.help_text(dataclasses.fields(Odd)[0]) == "With `--tls-cert`: a \\| b."


def test_the_reference_page_keeps_its_marker_and_the_build_fails_without_it() -> None:
    assert docs_hooks.MARKER in (DOCS / docs_hooks.REFERENCE_PAGE).read_text()
    with pytest.raises(docs_hooks.SettingsReferenceError, match="lacks the line"):
        docs_hooks.fill("# Configuration\n")


# ---- the rest of the docs against the code ----------------------------------------------------------------


def test_every_route_is_on_the_http_page() -> None:
    service: Service = make_service(make_cluster())
    page = HTTP_PAGE.read_text()
    missing = [route for route in build_server(service).router.paths if f" {route}`" not in page]
    assert not missing, f"routes missing from {HTTP_PAGE.relative_to(ROOT)}: {missing}"


def quick_start(text: str) -> list[str]:
    """The commands of the first shell block of a "Quick start" section, without their comments."""
    section = text[text.index("## Quick start\n") :] if "## Quick start\n" in text else text
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block, "no shell block in the quick start"
    return [line.split("#")[0].strip() for line in block[1].splitlines() if line.split("#")[0].strip()]


def test_the_quick_start_is_make_demo_and_make_test_and_ci_runs_make_test() -> None:
    assert quick_start(README) == ["make demo", "make test"]
    assert quick_start((DOCS / "quick-start.md").read_text()) == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_architecture_names_every_module_of_the_package() -> None:
    """ARCHITECTURE.md's tree is the newcomer's map: a module it does not name is one the map hides."""
    architecture = (ROOT / "ARCHITECTURE.md").read_text()
    modules = [path for path in (ROOT / "extender").rglob("*.py") if not path.name.startswith("__")]
    missing = [str(path.relative_to(ROOT)) for path in modules if path.stem not in architecture]
    assert not missing, f"modules missing from ARCHITECTURE.md: {missing}"
