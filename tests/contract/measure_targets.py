#!/usr/bin/env python3
"""Measures the thin-hosts issue's targets and writes them to docs/targets.md:
the lines of host source (the three hosts' libraries, without generated files,
tests or benchmarks) and the component's size. Nothing is asserted: the
figures are printed beside their targets.

    python3 tests/contract/measure_targets.py          # print and write docs/targets.md
    python3 tests/contract/measure_targets.py --print  # print only
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTS = {
    "Rust": (ROOT / "hosts/rust/src", "*.rs"),
    "Python": (ROOT / "hosts/python/src/agent_retry_policy", "*.py"),
    "TypeScript": (ROOT / "hosts/typescript/src", "*.ts"),
}
# Written by tests/contract/make_mirrors.py from wit/ and the Rust host: not hand-kept source.
GENERATED = {"fleet-scripts.ts", "fleet_scripts.py", "config_defaults.rs", "config-defaults.ts", "config_defaults.py", "wit-types.ts", "wit_types.py", "redis-scripts.ts", "redis_scripts.py", "limits-generated.ts", "limits_generated.py"}
COMPONENT = ROOT / "target/component/agent_retry_policy.wasm"
TARGET_HOST_LINES = 12_000
TARGET_COMPONENT_BYTES = 115_000


def host_lines():
    rows = {}
    for host, (root, pattern) in HOSTS.items():
        files = [p for p in sorted(root.rglob(pattern)) if p.name not in GENERATED]
        rows[host] = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files)
    return rows


def main():
    rows = host_lines()
    total = sum(rows.values())
    size = COMPONENT.stat().st_size if COMPONENT.exists() else None
    lines = [
        "# The thin-hosts targets",
        "",
        "Written by `python3 tests/contract/measure_targets.py` (`make targets`); not edited by hand.",
        "Host source: each host's library (`hosts/rust/src`, `hosts/python/src/agent_retry_policy`,",
        "`hosts/typescript/src`), without the files `tests/contract/make_mirrors.py` generates.",
        "",
        "| what | measured | target |",
        "|---|---|---|",
    ]
    for host, count in rows.items():
        lines.append(f"| {host} host source, lines | {count:,} | |")
    lines.append(f"| three hosts together, lines | {total:,} | at most {TARGET_HOST_LINES:,} |")
    shown = f"{size:,}" if size is not None else "not built (`make wasm`)"
    lines.append(f"| the component, bytes | {shown} | at most {TARGET_COMPONENT_BYTES:,} |")
    lines.append("")
    lines.append("A fresh clone's `.ci/run` prints its own duration when it ends (target: at most 20 minutes).")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if "--print" not in sys.argv:
        (ROOT / "docs/targets.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
