"""The memory cap, with its cause known: linear memories allocated by the host.

wasmtime's store limiter (`Store.set_limits(memory_size=...)`) makes a
`memory.grow` past the cap return -1, and the guest then traps on its own (a
failed allocation aborts: `unreachable`), which reads like any other trap. The
C API offers no limiter callback, so this host gives the engine a memory creator
(`wasmtime_config_host_memory_creator_set`) whose `grow` refuses past the
instance's cap and remembers that it did: a trap in a call during which a growth
was refused is `PolicyMemoryExceeded`.

Each memory is one anonymous mapping reserved up front (wasmtime's reservation
plus its guard, at least the cap; `PROT_NONE`) of which the first `size` bytes
are made readable and writable, so a memory never moves and an access past its
end faults inside the guard as wasmtime expects. The engine must not use
copy-on-write memory images with a host memory creator (`memory_init_cow =
False`): data segments are copied in at instantiation.

Which instance a new memory belongs to: memories are created during
`linker.instantiate`, on the calling thread, so the instance being created is
kept in a thread-local for that time (`creating`).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import threading
from collections.abc import Iterator
from typing import Any

from wasmtime import Config
from wasmtime import _ffi as ffi

_PROT_NONE = 0
_PROT_READ_WRITE = getattr(mmap, "PROT_READ", 1) | getattr(mmap, "PROT_WRITE", 2)
_MAP_FLAGS = getattr(mmap, "MAP_PRIVATE", 2) | getattr(mmap, "MAP_ANONYMOUS", 0x20) | getattr(mmap, "MAP_NORESERVE", 0)

# POSIX only (mmap, mprotect, munmap from the C library). Elsewhere (Windows)
# AVAILABLE is False and the host falls back to wasmtime's store limiter: the
# same cap, but a refused growth then reads as a plain `PolicyTrap`.
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _mmap = _libc.mmap
    _mprotect = _libc.mprotect
    _munmap = _libc.munmap
    AVAILABLE = hasattr(mmap, "MAP_ANONYMOUS")
except (OSError, AttributeError, TypeError):  # pragma: no cover - not POSIX
    AVAILABLE = False
if AVAILABLE:
    _mmap.restype = ctypes.c_void_p
    _mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    _mprotect.restype = ctypes.c_int
    _mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _munmap.restype = ctypes.c_int
    _munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_PAGE = mmap.PAGESIZE


class MemoryLimits:
    """One instance's cap, and what its memories did during the current call."""

    __slots__ = ("max_bytes", "refused", "largest", "memories")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.refused: int | None = None  # the size a refused growth asked for, during the current call
        self.largest = 0  # the largest memory's size, in bytes
        self.memories: list[_Memory] = []


class _Memory:
    __slots__ = ("base", "mapped", "usable", "size", "limits")

    def __init__(self, base: int, mapped: int, usable: int, size: int, limits: MemoryLimits) -> None:
        self.base, self.mapped, self.usable, self.size, self.limits = base, mapped, usable, size, limits


# The cap of a memory created outside `creating` (component.MAX_MEMORY_BYTES).
FALLBACK_MAX_BYTES = 64 << 20

_MEMORIES: dict[int, _Memory] = {}
_memory_ids = itertools.count(1)
_creating = threading.local()


@contextlib.contextmanager
def creating(limits: MemoryLimits) -> Iterator[None]:
    """Memories created on this thread in this block belong to `limits`."""
    _creating.limits = limits
    try:
        yield
    finally:
        _creating.limits = None


def _error(message: str) -> int:
    """A new wasmtime_error_t, owned by wasmtime once returned."""
    return ctypes.cast(ffi.wasmtime_error_new(message.encode("utf-8")), ctypes.c_void_p).value or 0


def _round_up(n: int) -> int:
    return (n + _PAGE - 1) // _PAGE * _PAGE


@ffi.wasmtime_memory_get_callback_t  # type: ignore[untyped-decorator]
def _get_memory(env: Any, byte_size: Any, byte_capacity: Any) -> int:
    memory = _MEMORIES[env or 0]
    byte_size[0] = memory.size
    byte_capacity[0] = memory.usable
    return memory.base


@ffi.wasmtime_memory_grow_callback_t  # type: ignore[untyped-decorator]
def _grow_memory(env: Any, new_size: int) -> int:
    try:
        memory = _MEMORIES[env or 0]
        limits = memory.limits
        if new_size > limits.max_bytes or new_size > memory.usable:
            limits.refused = new_size
            return _error(f"the memory would grow to {new_size} bytes, over the sandbox's cap of {limits.max_bytes} bytes")
        if new_size > memory.size and _mprotect(memory.base, _round_up(new_size), _PROT_READ_WRITE) != 0:
            return _error(f"mprotect failed (errno {ctypes.get_errno()})")
        memory.size = max(memory.size, new_size)
        limits.largest = max(limits.largest, memory.size)
        return 0
    except BaseException as e:  # never let an exception cross into wasmtime
        return _error(f"growing the memory failed: {e!r}")


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # type: ignore[untyped-decorator]
def _free_memory(env: Any) -> None:
    memory = _MEMORIES.pop(env or 0, None)
    if memory is not None:
        _munmap(memory.base, memory.mapped)
        with contextlib.suppress(ValueError):
            memory.limits.memories.remove(memory)


@ffi.wasmtime_new_memory_callback_t  # type: ignore[untyped-decorator]
def _new_memory(_env: Any, _ty: Any, minimum: int, _maximum: int, reserved: int, guard: int, out: Any) -> int:
    try:
        limits: MemoryLimits | None = getattr(_creating, "limits", None)
        if limits is None:  # the engine used directly (e.g. bench.py's stock path): the default cap
            limits = MemoryLimits(FALLBACK_MAX_BYTES)
        if minimum > limits.max_bytes:
            return _error(f"a core module's memory starts at {minimum} bytes, over the sandbox's cap of {limits.max_bytes} bytes")
        usable = _round_up(max(reserved, limits.max_bytes, minimum))
        mapped = usable + _round_up(guard)
        base = _mmap(None, mapped, _PROT_NONE, _MAP_FLAGS, -1, 0)
        if base is None or base == _MAP_FAILED:
            return _error(f"cannot reserve {mapped} bytes of address space (errno {ctypes.get_errno()})")
        if minimum and _mprotect(base, _round_up(minimum), _PROT_READ_WRITE) != 0:
            _munmap(base, mapped)
            return _error(f"mprotect failed (errno {ctypes.get_errno()})")
        key = next(_memory_ids)
        memory = _Memory(base, mapped, usable, minimum, limits)
        _MEMORIES[key] = memory
        limits.memories.append(memory)
        limits.largest = max(limits.largest, minimum)
        out[0].env = key
        out[0].get_memory = _get_memory
        out[0].grow_memory = _grow_memory
        out[0].finalizer = _free_memory
        return 0
    except BaseException as e:
        return _error(f"creating the memory failed: {e!r}")


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # type: ignore[untyped-decorator]
def _no_finalizer(_env: Any) -> None:
    pass


_CREATOR = ffi.wasmtime_memory_creator_t(None, _new_memory, _no_finalizer)


def configure(config: Config) -> None:
    """Makes the engine allocate linear memories through this module (where it can)."""
    if not AVAILABLE:  # pragma: no cover - not POSIX
        return
    config.memory_init_cow = False
    ffi.wasmtime_config_host_memory_creator_set(config.ptr(), ctypes.byref(_CREATOR))
