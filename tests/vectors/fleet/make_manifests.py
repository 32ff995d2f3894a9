#!/usr/bin/env python3
"""Writes tests/vectors/fleet/manifests.json: the signed publication (issue 24,
row 2) every host checks the same way (Rust `manifest.rs`, Python
`manifest.py`, Node `manifest.ts`).

    python3 tests/vectors/fleet/make_manifests.py          # rewrite the file
    python3 tests/vectors/fleet/make_manifests.py --check  # fail if it is stale

The statement and the manifest are built here from the format's text, not by a
host, and signed with `cryptography` (Ed25519 is deterministic, so the
manifests are fixed). The seed is a TEST-ONLY key, published here: never sign
a real publication with it.
"""

import hashlib
import json
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

HERE = Path(__file__).resolve().parent
OUT = HERE / "manifests.json"

# TEST-ONLY: public in this repository, so anyone can sign with it.
SEED = bytes(range(1, 33))
OTHER_SEED = bytes([0x42] * 32)
AT = "test:manifest"
LEGACY_AT = "test:wasm.sig"


def sha(data):
    return hashlib.sha256(data).hexdigest()


def statement(wasm, config, vectors, revision):
    return (
        "agent-retry publication 1\n"
        f"wasm-sha256 {sha(wasm)}\n"
        f"config-sha256 {sha(config.encode('utf-8'))}\n"
        f"vectors-sha256 {'none' if vectors is None else sha(vectors.encode('utf-8'))}\n"
        f"revision {'none' if revision is None else revision}\n"
    )


def manifest(seed, wasm, config, vectors, revision):
    text = statement(wasm, config, vectors, revision)
    signature = Ed25519PrivateKey.from_private_bytes(seed).sign(text.encode("utf-8"))
    return text + f"signature {signature.hex()}\n"


WASM = bytes.fromhex("0061736d0d000100")
WASM_2 = bytes.fromhex("0061736d0d0001000000")
CONFIG = '{"max-attempts-per-call": 4}'
CONFIG_100 = '{"max-attempts-per-call": 100}'
VECTORS = '{"description": "shipped", "cases": []}'
VECTORS_2 = '{"description": "shipped, edited", "cases": []}'
REVISION = 1764460800000

GOOD = [
    ("a fleet publication with vectors", WASM, CONFIG, VECTORS, REVISION),
    ("a fleet publication without vectors", WASM, CONFIG, None, 7),
    ("files without vectors (revision none)", WASM, CONFIG, None, None),
    ("files with vectors and a configuration that is not ASCII (its UTF-8 bytes are hashed)", WASM_2, '{"note": "café ☕"}', VECTORS, None),
    ("the largest revision", WASM, CONFIG, VECTORS, 9007199254740991),
]


def good_cases():
    return [
        {
            "description": d,
            "wasm": w.hex(),
            "config": c,
            "vectors": v,
            "revision": r,
            "statement": statement(w, c, v, r),
            "manifest": manifest(SEED, w, c, v, r),
        }
        for d, w, c, v, r in GOOD
    ]


def refusal_cases():
    fleet = manifest(SEED, WASM, CONFIG, VECTORS, REVISION)
    fleet_no_vectors = manifest(SEED, WASM, CONFIG, None, 7)
    files = manifest(SEED, WASM, CONFIG, None, None)
    lines = fleet.split("\n")
    flipped = fleet[:-2] + ("0" if fleet[-2] != "0" else "1") + "\n"

    def case(description, text, error, wasm=WASM, config=CONFIG, vectors=VECTORS, revision=REVISION, legacy=None):
        return {
            "description": description,
            "manifest": text,
            "legacy_signature_at": legacy,
            "wasm": wasm.hex(),
            "config": config,
            "vectors": vectors,
            "revision": revision,
            "error": error,
        }

    def line(i, value):
        copy = list(lines)
        copy[i] = value
        return "\n".join(copy)

    return [
        case("the configuration rewritten after signing (4 attempts became 100)", fleet, ["config-sha256", "the configuration read has", "changed after signing"], config=CONFIG_100),
        case("another .wasm under the manifest", fleet, ["wasm-sha256", "the .wasm read has", "changed after signing"], wasm=WASM_2),
        case("the vectors deleted after signing", fleet, ["vectors-sha256", "no vectors were published", "removed after signing"], vectors=None),
        case("vectors added after signing", fleet_no_vectors, ["vectors-sha256 none", "added after signing"], revision=7),
        case("the vectors edited after signing", fleet, ["vectors-sha256", "the vectors read have", "changed after signing"], vectors=VECTORS_2),
        case("another revision than the one signed", fleet, [f"revision {REVISION}", f"revision {REVISION + 1}", "not the revision it was signed for"], revision=REVISION + 1),
        case("a manifest for files (revision none) read from a fleet", files, ["covers revision none", "revision 9"], vectors=None, revision=9),
        case("a manifest for files read from a fleet with no revision stored (0)", files, ["covers revision none", "revision 0"], vectors=None,
             revision=0),
        case("a manifest for a fleet read from files", fleet_no_vectors, ["covers revision 7", "revision none"], vectors=None, revision=None),
        case("signed with another key", manifest(OTHER_SEED, WASM, CONFIG, VECTORS, REVISION), ["does not verify under the configured key"]),
        case("one digit of the signature changed", flipped, ["does not verify under the configured key"]),
        case("no manifest", None, ["unsigned: no signed manifest at " + AT]),
        case(
            "only a signature over the .wasm alone (before 0.7)",
            None,
            ["unsigned: no signed manifest at " + AT, LEGACY_AT, "before 0.7", "not accepted", "sign the whole publication"],
            legacy=LEGACY_AT,
        ),
        case("five lines", "\n".join(lines[:4] + lines[5:]), ["is malformed", "5 lines, not 6"]),
        case("the last line without its newline", fleet[:-1], ["is malformed", "does not end with a newline"]),
        case("another format's first line", line(0, "agent-retry publication 2"), ["is malformed", "first line", "agent-retry publication 1"]),
        case("upper-case hex in the wasm line", line(1, lines[1].upper().replace("WASM-SHA256", "wasm-sha256")), ["is malformed", "line 2", "wasm-sha256 <64 lowercase hex digits>"]),
        case("a revision with a leading zero", line(4, "revision 0" + str(REVISION)), ["is malformed", "line 5", "revision <decimal digits"]),
        case("a revision past 2^53 - 1", line(4, "revision 9007199254740992"), ["is malformed", "line 5"]),
        case("a short signature", line(5, lines[5][:-2]), ["is malformed", "line 6", "signature <128 lowercase hex digits>"]),
        case("lines in another order", "\n".join([lines[0], lines[2], lines[1], *lines[3:]]), ["is malformed", "line 2"]),
        case("more than 4096 bytes", fleet + "x" * 4096 + "\n", ["is malformed", "more than 4096"]),
    ]


def document():
    public = Ed25519PrivateKey.from_private_bytes(SEED).public_key().public_bytes_raw()
    return {
        "description": (
            "Signed publications (the manifest: issue 24, row 2): what every host's sign_publication writes and its verification "
            "accepts (cases) or refuses (refusals: the error contains every one of `error`'s words). Written by make_manifests.py. "
            "The seed is a TEST-ONLY key, public here: never sign a real publication with it."
        ),
        "test_only_seed": SEED.hex(),
        "public_key": public.hex(),
        "manifest_at": AT,
        "cases": good_cases(),
        "refusals": refusal_cases(),
    }


def main():
    text = json.dumps(document(), indent=1, ensure_ascii=False) + "\n"
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print("tests/vectors/fleet/manifests.json is out of date: run python3 tests/vectors/fleet/make_manifests.py")
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(HERE.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
