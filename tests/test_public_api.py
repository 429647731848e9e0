"""The curated public API: what ``import padres`` offers, and nothing private leaking."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import historic
import historic.errors
import padres
import padres.errors


def test_public_names_are_exported_and_exist() -> None:
    assert sorted(padres.__all__) == padres.__all__
    for name in padres.__all__:
        assert not name.startswith("_")
        assert getattr(padres, name) is not None


def test_core_api_is_present() -> None:
    for name in (
        "Publication",
        "Subscription",
        "Advertisement",
        "CompositeSubscription",
        "Unsubscribe",
        "Unadvertise",
        "parse_message",
        "parse_batch",
        "encode",
        "decode",
        "ReferenceMatcher",
        "ParseError",
        "DecodeError",
    ):
        assert name in padres.__all__


def test_every_error_is_one_tree_and_exported() -> None:
    errors = [
        value
        for name, value in vars(padres.errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and not name.startswith("_")
    ]
    assert len(errors) >= 14
    for error in errors:
        assert issubclass(error, padres.PadresError), error
        assert error.__name__ in padres.__all__, error
    assert issubclass(padres.ConnectError, padres.ConnectionLost)


def test_historic_errors_extend_the_one_tree() -> None:
    for name in historic.errors.__all__:
        error = getattr(historic, name)
        assert issubclass(error, padres.StorageError), error
    assert issubclass(historic.StoreUnavailable, historic.StoreError)


def test_the_packages_above_padres_resolve_every_public_name_on_first_use() -> None:
    import spark

    for package in (historic, spark):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)


@pytest.mark.parametrize("name", ["padres", "rete", "historic", "spark"])
def test_type_checkers_see_the_names_that_load_on_first_use(name: str) -> None:
    """Each package imports its public names on first use (``__getattr__``); the imports under
    ``TYPE_CHECKING``, all that mypy and editors see, name the same ones, and ``dir`` lists
    them."""
    package = importlib.import_module(name)
    tree = ast.parse(Path(str(package.__file__)).read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    seen = {
        alias.asname or alias.name
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == set(package.__all__)
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        package.Nothing  # noqa: B018
