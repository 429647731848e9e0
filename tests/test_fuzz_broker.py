"""A real broker process under a fuzz campaign from one connection, a client served beside it
(``padres bench fuzz`` runs the same campaign for longer)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from padres.bench import fuzz
from padres.errors import DecodeError
from padres.model.protocol import decode_frame

LATENCY_BOUND_MS = 2000.0
"""The slowest delivery to the client beside the fuzzer, at most."""


@pytest.mark.parametrize("seed", [1])
def test_bad_frames_neither_kill_nor_stall_the_broker(seed: int) -> None:
    result = fuzz.run(seconds=10, seed=seed)
    print(fuzz.report(result))  # the figures, with -s
    assert result["violations"] == []
    assert result["frames"] > 200 and result["errors"] > 100
    assert set(result["frames_by_kind"]) == {
        "bad_text",
        "bit_flips",
        "deep",
        "numbers",
        "oversized",
        "truncated",
        "valid",
        "wrong_types",
    }
    assert result["fuzzer_closed"] == "" and result["fuzzer_answered"]
    assert result["published"] > 100 and result["delivered"] == result["published"]
    assert result["latency_max_ms"] < LATENCY_BOUND_MS, fuzz.report(result)


def test_every_fuzz_frame_decodes_or_is_refused_with_a_decode_error() -> None:
    """In-process, the same frames: the codec raises nothing but ``DecodeError``."""
    rng = random.Random(7)
    for _ in range(2000):
        _, frame = fuzz.frames(rng)
        try:
            decode_frame(frame)
        except DecodeError as exc:
            assert len(str(exc)) <= fuzz.MAX_ERROR_TEXT


def test_bench_fuzz_command_reports_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "padres.cli", "bench", "fuzz", "--seconds", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"violations":[]' in done.stdout
