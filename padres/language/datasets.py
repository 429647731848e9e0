"""Where the real stock-quote data lives.

The full set (245,090 quotes of 100 symbols, one ``SYMBOL.txt`` file each) is looked for in
``$PADRES_STOCKQUOTES``, then in ``../shared/data/stockquotes`` beside the source checkout. A
1,000-quote sample ships with the package so that everything runs on a fresh machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["SAMPLE", "find_stockquotes", "stockquote_files"]

SAMPLE: Final = Path(__file__).resolve().parent.parent / "data" / "stockquotes-sample.txt"
_CHECKOUT_DEFAULT: Final = Path(__file__).resolve().parents[3] / "shared/data/stockquotes"


def find_stockquotes() -> Path | None:
    """The directory of the full data set, or None when it is not on this machine."""
    configured = os.environ.get("PADRES_STOCKQUOTES")
    for candidate in (Path(configured) if configured else None, _CHECKOUT_DEFAULT):
        if candidate is not None and candidate.is_dir() and any(candidate.glob("*.txt")):
            return candidate
    return None


def stockquote_files(path: Path | None = None) -> list[Path]:
    """The quote files of ``path`` (file or directory), else of the full set, else the sample."""
    root = path or find_stockquotes() or SAMPLE
    if root.is_dir():
        return sorted(root.glob("*.txt"))
    return [root]
