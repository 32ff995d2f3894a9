"""The signed publication (issue 24, row 2): tests/vectors/fleet/manifests.json,
the Rust and Node hosts' too. `sign_publication` writes the same manifest as
they do (Ed25519 is deterministic), and `verify_publication` accepts the good
cases and refuses each refusal with the same words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_retry_policy.manifest import ManifestError, check_covers, parse_manifest, sign_publication, statement, verify_publication

MANIFESTS = Path(__file__).resolve().parents[3] / "tests" / "vectors" / "fleet" / "manifests.json"
DOC = json.loads(MANIFESTS.read_text(encoding="utf-8"))
SEED = bytes.fromhex(DOC["test_only_seed"])
PUBLIC = bytes.fromhex(DOC["public_key"])
AT = DOC["manifest_at"]


@pytest.mark.parametrize("case", DOC["cases"], ids=[c["description"] for c in DOC["cases"]])
def test_the_manifest_vectors_sign_and_verify(case: dict) -> None:
    wasm = bytes.fromhex(case["wasm"])
    assert statement(wasm, case["config"], case["vectors"], case["revision"]) == case["statement"]
    manifest = sign_publication(SEED, wasm, case["config"], case["vectors"], case["revision"])
    assert manifest == case["manifest"]
    verify_publication(PUBLIC, manifest.encode(), AT, wasm, case["config"].encode(), case["vectors"], case["revision"])


@pytest.mark.parametrize("case", DOC["refusals"], ids=[c["description"] for c in DOC["refusals"]])
def test_the_manifest_vectors_refusals(case: dict) -> None:
    with pytest.raises(ManifestError) as refused:
        verify_publication(
            PUBLIC,
            case["manifest"],
            AT,
            bytes.fromhex(case["wasm"]),
            case["config"],
            case["vectors"],
            case["revision"],
            legacy_signature_at=case["legacy_signature_at"],
        )
    for word in case["error"]:
        assert word in str(refused.value), (case["description"], str(refused.value))


def test_the_vector_file_has_every_kind_of_case() -> None:
    assert len(DOC["cases"]) >= 5 and len(DOC["refusals"]) >= 20
    assert "TEST-ONLY" in DOC["description"]


def test_publishing_checks_the_manifest_covers_the_parts() -> None:
    manifest = sign_publication(bytes(32), b"wasm", "{}", None, 5)
    parsed = parse_manifest(manifest, "m")
    assert parsed.revision == 5
    check_covers(parsed, "m", b"wasm", "{}", None)
    with pytest.raises(ManifestError, match="config-sha256 .* changed after signing"):
        check_covers(parsed, "m", b"wasm", '{"max-attempts-per-call": 100}', None)
    with pytest.raises(ValueError, match="from 1 to 9007199254740991"):
        sign_publication(bytes(32), b"wasm", "{}", None, 0)
    with pytest.raises(ValueError, match="32 bytes"):
        sign_publication(bytes(31), b"wasm", "{}", None, None)
