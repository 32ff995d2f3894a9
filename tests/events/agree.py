"""The events scenario's cross-host check (docs/events.md, "One scenario, three hosts").

Each host's own test runs tests/events/scenario.json through its any-call
helper and writes what it emitted to target/events/<host>.json; this script
fails unless every host wrote its dump and every dump equals
tests/events/expected.json (events and metrics; spans for the hosts that
record them: every host's tests record them, with the OpenTelemetry SDK's
in-memory exporter; an empty span list is compared only when it is not empty).

    python3 tests/events/agree.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("python", "node", "rust")


def main() -> int:
    expected = json.loads((ROOT / "tests/events/expected.json").read_text())
    failed = 0
    for host in HOSTS:
        path = ROOT / "target/events" / f"{host}.json"
        if not path.exists():
            print(f"{host}: no dump at {path.relative_to(ROOT)} (its events scenario test did not run)")
            failed += 1
            continue
        dump = json.loads(path.read_text())
        parts = ["events", "metrics"] + (["spans"] if dump.get("spans") else [])
        differing = [part for part in parts if dump.get(part) != expected.get(part)]
        if differing:
            print(f"{host}: {', '.join(differing)} DIFFER from tests/events/expected.json")
            failed += 1
        else:
            print(f"{host}: {', '.join(parts)} identical to tests/events/expected.json")
    print(f"events agreement: {len(HOSTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
