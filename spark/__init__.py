"""Historic publications in a Parquet archive: loaded and queried with Apache Spark, indexed by a
catalog of per-file statistics in SQL, and answered for historic subscriptions without Spark
(see ``docs/archives.md``)."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark.archive import Archive, Plan
    from spark.catalog import Catalog, LoadRecord
    from spark.errors import (
        AlreadyLoaded,
        ArchiveError,
        CatalogError,
        InputError,
        JavaMissing,
        UnknownLoad,
    )
    from spark.inputs import Format, Period, Reading
    from spark.load import LoadReport, load
    from spark.plan import may_match, prune

_HOMES = {
    "Archive": "archive",
    "Plan": "archive",
    "Catalog": "catalog",
    "LoadRecord": "catalog",
    "AlreadyLoaded": "errors",
    "ArchiveError": "errors",
    "CatalogError": "errors",
    "InputError": "errors",
    "JavaMissing": "errors",
    "UnknownLoad": "errors",
    "Format": "inputs",
    "Period": "inputs",
    "Reading": "inputs",
    "LoadReport": "load",
    "load": "load",
    "may_match": "plan",
    "prune": "plan",
}
"""Where each public name lives: imported on first use, as PyArrow and pandas take a second
to load, and the command line, which imports ``spark.cli``, needs neither."""

__all__ = [
    "AlreadyLoaded",
    "Archive",
    "ArchiveError",
    "Catalog",
    "CatalogError",
    "Format",
    "InputError",
    "JavaMissing",
    "LoadRecord",
    "LoadReport",
    "Period",
    "Plan",
    "Reading",
    "UnknownLoad",
    "load",
    "may_match",
    "prune",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'spark' has no attribute {name!r}")
    return getattr(import_module(f"spark.{home}"), name)
