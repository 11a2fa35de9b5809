"""The README says what the code does: every setting is in its configuration table, every route in its
HTTP table, and the quick start is the two commands CI runs."""

from __future__ import annotations

from pathlib import Path

from extender import settings
from extender.service.context import Service
from extender.service.verbs import build_server
from tests.builders import make_cluster
from tests.conftest import make_service

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_every_setting_is_documented() -> None:
    missing = [field.name for field in settings.fields() if f"`{field.name}`" not in README]
    assert not missing, f"settings missing from the README's configuration table: {missing}"


def test_every_route_is_documented() -> None:
    service: Service = make_service(make_cluster())
    routes = set(build_server(service).router.paths)
    missing = [route for route in routes if f"`{route}`" not in README and f"{route}`" not in README]
    assert not missing, f"routes missing from the README's HTTP table: {missing}"


def test_the_quick_start_is_make_demo_and_make_test_and_ci_runs_make_test() -> None:
    assert "make demo" in README and "make test" in README
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert "make test" in ci


def test_architecture_names_every_module_of_the_package() -> None:
    """ARCHITECTURE.md's tree is the newcomer's map: a module it does not name is one the map hides."""
    root = Path(__file__).parent.parent
    architecture = (root / "ARCHITECTURE.md").read_text()
    modules = [path for path in (root / "extender").rglob("*.py") if not path.name.startswith("__")]
    missing = [str(path.relative_to(root)) for path in modules if path.stem not in architecture]
    assert not missing, f"modules missing from ARCHITECTURE.md: {missing}"
