"""Historic publications in a Parquet archive: loaded and queried with Apache Spark, indexed by a
catalog of per-file statistics in SQL, and answered for historic subscriptions without Spark
(see ``docs/archives.md``)."""

from spark.archive import Archive, Plan
from spark.catalog import Catalog
from spark.errors import ArchiveError, CatalogError, InputError, JavaMissing
from spark.inputs import Format, Period, Reading
from spark.load import LoadReport, load
from spark.plan import may_match, prune

__all__ = [
    "Archive",
    "ArchiveError",
    "Catalog",
    "CatalogError",
    "Format",
    "InputError",
    "JavaMissing",
    "LoadReport",
    "Period",
    "Plan",
    "Reading",
    "load",
    "may_match",
    "prune",
]
