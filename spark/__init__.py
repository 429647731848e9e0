"""Historic publications in a Parquet archive: loaded and queried with Apache Spark, indexed by a
catalog of per-file statistics in SQL, and answered for historic subscriptions without Spark
(see ``docs/archives.md``)."""

from typing import TYPE_CHECKING, Final

from rete.lazy import lazy

if TYPE_CHECKING:  # what ``__getattr__`` loads, for type checkers: the same names and homes
    from spark.archive import Archive as Archive
    from spark.archive import Plan as Plan
    from spark.catalog import Catalog as Catalog
    from spark.catalog import LoadRecord as LoadRecord
    from spark.errors import AlreadyLoaded as AlreadyLoaded
    from spark.errors import ArchiveError as ArchiveError
    from spark.errors import CatalogError as CatalogError
    from spark.errors import InputError as InputError
    from spark.errors import JavaMissing as JavaMissing
    from spark.errors import UnknownLoad as UnknownLoad
    from spark.inputs import Format as Format
    from spark.inputs import Period as Period
    from spark.inputs import Reading as Reading
    from spark.load import LoadReport as LoadReport
    from spark.load import load as load
    from spark.plan import may_match as may_match
    from spark.plan import prune as prune

_HOMES: Final = {
    "Archive": "spark.archive",
    "Plan": "spark.archive",
    "Catalog": "spark.catalog",
    "LoadRecord": "spark.catalog",
    "AlreadyLoaded": "spark.errors",
    "ArchiveError": "spark.errors",
    "CatalogError": "spark.errors",
    "InputError": "spark.errors",
    "JavaMissing": "spark.errors",
    "UnknownLoad": "spark.errors",
    "Format": "spark.inputs",
    "Period": "spark.inputs",
    "Reading": "spark.inputs",
    "LoadReport": "spark.load",
    "load": "spark.load",
    "may_match": "spark.plan",
    "prune": "spark.plan",
}
"""Where each public name lives: imported on first use, as PyArrow and pandas take a second
to load, and the command line, which imports ``spark.cli``, needs neither."""

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy(globals(), _HOMES)
