#!/usr/bin/env python3
"""Prints the module specifications `make docs-python` gives pdoc: the package
and each public submodule (pdoc alone follows only the package's `__all__`),
and `!module` for one whose optional dependency is not installed in this
environment (e.g. the LangChain adapter, whose `langchain-core` lives in a venv
of its own), named on stderr so the gap is visible. Run with the venv's Python.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

PACKAGE = "agent_retry_policy"


def main() -> int:
    package = importlib.import_module(PACKAGE)
    exported = set(getattr(package, "__all__", ()))
    specs, left_out = [PACKAGE], []
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{PACKAGE}."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as e:
            print(f"pdoc_modules: {info.name} left out: {e}", file=sys.stderr)
            left_out.append(f"!{info.name}")
            continue
        # pdoc follows a package's subpackages itself, and the package's
        # `__all__`: those are documented through it already.
        if info.name.count(".") == 1 and info.name.rsplit(".", 1)[1] not in exported:
            specs.append(info.name)
    specs += left_out
    print(" ".join(specs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
