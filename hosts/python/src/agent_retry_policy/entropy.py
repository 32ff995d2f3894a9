"""Jitter randomness, supplied by the host: the OS by default, or SplitMix64 from
a seed for runs that must replay exactly (the algorithm of
hosts/rust/src/entropy.rs, so a seed gives the same sequence in every host)."""

from __future__ import annotations

import os
import threading
from typing import Protocol

_MASK = 0xFFFF_FFFF_FFFF_FFFF

# The guest never asks for more than a few bytes; cap what a bad one could ask.
MAX_RANDOM_BYTES = 4096


class EntropySource(Protocol):
    def next_u64(self) -> int:
        """The next 64 bits, as an int in [0, 2^64)."""
        ...


class OsEntropy:
    """The operating system's randomness (`os.urandom`)."""

    def next_u64(self) -> int:
        return int.from_bytes(os.urandom(8), "little")


def splitmix64_mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK
    return z ^ (z >> 31)


class SplitMix64:
    """SplitMix64 from a seed: `x += 0x9E3779B97F4A7C15`, then the mix, mod 2^64."""

    def __init__(self, seed: int) -> None:
        if not 0 <= seed <= _MASK:
            raise ValueError(f"a SplitMix64 seed is a u64, got {seed}")
        self._state = seed
        self._lock = threading.Lock()

    def next_u64(self) -> int:
        with self._lock:
            self._state = (self._state + 0x9E37_79B9_7F4A_7C15) & _MASK
            return splitmix64_mix(self._state)


def random_bytes(source: EntropySource, length: int) -> bytes:
    """`length` bytes (at most MAX_RANDOM_BYTES): whole u64 draws, little-endian, as
    the Rust host fills `get-random-bytes`."""
    length = min(length, MAX_RANDOM_BYTES)
    words = (length + 7) // 8
    return b"".join(source.next_u64().to_bytes(8, "little") for _ in range(words))[:length]
