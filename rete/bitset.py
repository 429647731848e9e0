"""Bitsets over slot numbers: numpy arrays of little-endian 64-bit words, or Python ints.

Cell tables that are updated in bulk live in numpy words; sparse, rarely changed sets (keyed
and residual tests) are Python ints, which need no resizing. ``to_words`` joins the two.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["Words", "from_positions", "pairs", "positions", "to_words", "words_for"]

Words = npt.NDArray[np.uint64]
WORD_DTYPE = np.dtype("<u8")


def words_for(bits: int) -> int:
    return (bits + 63) >> 6


def to_words(bits: int, nwords: int) -> Words:
    """A Python int bitset as ``nwords`` words."""
    return np.frombuffer(bits.to_bytes(nwords * 8, "little"), dtype=WORD_DTYPE)


def from_positions(numbers: list[int]) -> int:
    """A Python int bitset of ``numbers`` (one big int built once, not one per number)."""
    if len(numbers) == 1:
        return 1 << numbers[0]
    mask = np.zeros(max(numbers) + 1, dtype=bool)
    mask[numbers] = True
    return int.from_bytes(np.packbits(mask, bitorder="little").tobytes(), "little")


def positions(words: Words) -> npt.NDArray[np.int64]:
    """The numbers of the set bits, in increasing order."""
    if words.size <= 2048:  # unpacking everything is cheapest for small sets
        return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little").view(bool))
    nonzero = np.flatnonzero(words != 0)  # (flatnonzero is slower on integers than booleans)
    bits = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little").view(bool)
    at, bit = np.divmod(np.flatnonzero(bits), 64)
    return nonzero[at] * 64 + bit


def pairs(rows: Words) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The set bits of a 2-D array of bitsets (one per row) as (row, bit number) pairs, in
    increasing order of row, then bit (``positions`` of every row at once)."""
    rows = np.ascontiguousarray(rows)
    width = rows.shape[1]
    nonzero = np.flatnonzero(rows != 0)
    if nonzero.size * 4 > rows.size:  # dense: unpacking every word is cheapest
        bits = np.unpackbits(rows.view(np.uint8), axis=1, bitorder="little").view(bool)
        row, bit = np.divmod(np.flatnonzero(bits), width * 64)
        return row, bit
    row, word = np.divmod(nonzero, width)
    words = rows.reshape(-1)[nonzero].view(np.uint8)
    at, bit = np.divmod(np.flatnonzero(np.unpackbits(words, bitorder="little").view(bool)), 64)
    return row[at], word[at] * 64 + bit
