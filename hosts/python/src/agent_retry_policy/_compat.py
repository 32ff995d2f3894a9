"""The wasmtime-py versions this package runs on, checked at import time.

`_codec.py` and `component.py` call a few of wasmtime-py's private helpers (its
C bindings in `wasmtime._ffi`, the trap bookkeeping in
`wasmtime.component._enter`) to convert values ~6x faster than the stock
`Func.__call__` (hosts/README.md, "Python: why a codec of its own"). Those
helpers may change in any wasmtime-py release, so the package declares the range
it was tested with and refuses, with a message that says what to install, to run
on another one: a wrong conversion would corrupt memory, not fail cleanly.
"""

from __future__ import annotations

import importlib.metadata
import re

# Keep in step with `dependencies` in pyproject.toml.
WASMTIME_TESTED = (50, 0, 1)  # the lowest version tested
WASMTIME_BELOW = (51, 0, 0)  # the first version not supported
WASMTIME_REQUIREMENT = "wasmtime>=50.0.1,<51"

# The private names the package relies on (feature detection on top of the version).
PRIVATE_FFI_NAMES = (
    "wasmtime_component_func_call",
    "wasmtime_context_set_fuel",
    "wasmtime_component_val_delete",
    "wasmtime_component_val_t",
    "wasmtime_component_linker_instance_add_func",
    "wasmtime_component_func_callback_t",
    "wasmtime_component_vallist_new_uninit",
    "wasmtime_component_valrecord_new_uninit",
    "wasm_byte_vec_new",
)


class UnsupportedWasmtime(ImportError):
    """The installed wasmtime-py is outside the range this package supports."""


def _parse(version: str) -> tuple[int, int, int] | None:
    matched = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(part) for part in matched.groups()) if matched else None  # type: ignore[return-value]


def check_wasmtime_version(version: str | None) -> None:
    """Raises `UnsupportedWasmtime` unless `version` (of the `wasmtime`
    distribution) is in [WASMTIME_TESTED, WASMTIME_BELOW)."""
    parsed = _parse(version) if version else None
    if parsed is None or not (WASMTIME_TESTED <= parsed < WASMTIME_BELOW):
        found = f"wasmtime {version}" if version else "no wasmtime distribution"
        raise UnsupportedWasmtime(
            f"agent-retry-policy needs {WASMTIME_REQUIREMENT!r} (it calls private wasmtime-py helpers that change "
            f"between releases), but {found} is installed. Install a supported one: "
            f"pip install '{WASMTIME_REQUIREMENT}'"
        )


def check_private_helpers(ffi: object) -> None:
    """Raises `UnsupportedWasmtime` if wasmtime-py lacks a private name the package calls."""
    missing = [name for name in PRIVATE_FFI_NAMES if not hasattr(ffi, name)]
    if missing:
        raise UnsupportedWasmtime(
            f"agent-retry-policy needs {WASMTIME_REQUIREMENT!r}; the installed wasmtime-py lacks {missing}. "
            f"Install a supported one: pip install '{WASMTIME_REQUIREMENT}'"
        )


def installed_wasmtime_version() -> str | None:
    try:
        return importlib.metadata.version("wasmtime")
    except importlib.metadata.PackageNotFoundError:
        return None


check_wasmtime_version(installed_wasmtime_version())
