"""The property tests draw the same examples in any process: alone, in a subset, or in the whole suite.

`derandomize` fixes Hypothesis' seed, but about one draw in twenty is taken from a pool of constants Hypothesis
reads out of every local (not test, not installed) module imported so far, so the examples depended on which
modules the tests run before had imported: a machine failed only in full-suite runs. Here that pool is empty,
and Hypothesis' memo of it is cleared on the way in and out. This reaches into Hypothesis' internals: should
they be renamed, `monkeypatch.setattr` fails loudly rather than letting the examples drift again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis.internal.conjecture import providers
from hypothesis.internal.constants_ast import Constants


@pytest.fixture(autouse=True)
def no_constants_from_imported_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    providers.CONSTANTS_CACHE.cache.clear()
    monkeypatch.setattr(providers, "_get_local_constants", Constants)
    yield
    providers.CONSTANTS_CACHE.cache.clear()
