"""Bitsets over slot numbers: numpy arrays of little-endian 64-bit words, or Python ints.

Cell tables that are updated in bulk live in numpy words; sparse, rarely changed sets (keyed
and residual tests) are Python ints, which need no resizing. ``to_words`` joins the two.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["Words", "positions", "to_words", "words_for"]

Words = npt.NDArray[np.uint64]
WORD_DTYPE = np.dtype("<u8")


def words_for(bits: int) -> int:
    return (bits + 63) >> 6


def to_words(bits: int, nwords: int) -> Words:
    """A Python int bitset as ``nwords`` words."""
    return np.frombuffer(bits.to_bytes(nwords * 8, "little"), dtype=WORD_DTYPE)


def positions(words: Words) -> npt.NDArray[np.int64]:
    """The numbers of the set bits, in increasing order."""
    if words.size <= 2048:  # unpacking everything is cheapest for small sets
        return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little").view(bool))
    nonzero = np.flatnonzero(words)
    bits = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little").view(bool)
    rows, cols = np.nonzero(bits.reshape(-1, 64))
    return nonzero[rows] * 64 + cols
