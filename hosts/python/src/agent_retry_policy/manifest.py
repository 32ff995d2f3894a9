"""The signed manifest: one Ed25519 signature over the whole publication (the
`.wasm`'s digest, the configuration's, the vectors' and the revision), so that
nothing of a publication can be changed, removed or added after signing. The
Rust (`manifest.rs`) and Node (`manifest.ts`) hosts write and check the same
text, replayed from tests/vectors/fleet/manifests.json.

Six lines, each ending "\\n"::

    agent-retry publication 1
    wasm-sha256 <64 lowercase hex>
    config-sha256 <64 lowercase hex>
    vectors-sha256 <64 lowercase hex, or none>
    revision <decimal revision, or none (files)>
    signature <128 lowercase hex: Ed25519 over the first five lines' bytes>

The first five lines are the *statement*. A host builds the statement of what
it actually read and compares it line by line with the manifest's: the first
line that differs is named. Then the signature must verify. Signing and
verifying need the `cryptography` package (the `signed` extra).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from .fleet_scripts import MAX_REVISION

MANIFEST_HEADER = "agent-retry publication 1"
MAX_MANIFEST_BYTES = 4096
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")


class ManifestError(ValueError):
    """Why a publication's manifest is refused. `kind`: "unsigned", "malformed",
    "mismatch" (what was read is not what was signed), "signature" (does not
    verify under the key) or "key" (the configured key is not valid)."""

    def __init__(self, kind: Literal["unsigned", "malformed", "mismatch", "signature", "key"], message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as e:
        raise ImportError("signed publications need the `cryptography` package: pip install 'agent-retry-policy[signed]'") from e
    return ed25519


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_revision(revision: int | None) -> None:
    if revision is not None and (isinstance(revision, bool) or not isinstance(revision, int) or not 1 <= revision <= MAX_REVISION):
        raise ValueError(f"a revision is an integer from 1 to {MAX_REVISION} (or None for files), got {revision!r}")


def statement(wasm: bytes, config: bytes | str, vectors: bytes | str | None, revision: int | None) -> str:
    """The statement of a publication (the manifest's first five lines) from
    what was read: the vectors' text and the fleet's revision, or None of either."""
    config_bytes = config.encode("utf-8") if isinstance(config, str) else bytes(config)
    vectors_line = "none" if vectors is None else _sha256(vectors.encode("utf-8") if isinstance(vectors, str) else bytes(vectors))
    return (
        f"{MANIFEST_HEADER}\n"
        f"wasm-sha256 {_sha256(bytes(wasm))}\n"
        f"config-sha256 {_sha256(config_bytes)}\n"
        f"vectors-sha256 {vectors_line}\n"
        f"revision {'none' if revision is None else revision}\n"
    )


def sign_publication(
    secret_key: bytes, wasm: bytes, config: bytes | str, vectors: bytes | str | None = None, revision: int | None = None
) -> str:
    """Signs a publication with the 32-byte Ed25519 seed; returns the manifest.
    `revision`: the fleet revision it is published under (1 to MAX_REVISION),
    or None for files. Raises ValueError for a seed that is not 32 bytes or a
    revision out of range, ImportError without `cryptography`."""
    if len(secret_key) != 32:
        raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(secret_key)}")
    _check_revision(revision)
    text = statement(wasm, config, vectors, revision)
    signature = _ed25519().Ed25519PrivateKey.from_private_bytes(bytes(secret_key)).sign(text.encode("utf-8"))
    return f"{text}signature {signature.hex()}\n"


@dataclass(frozen=True)
class Manifest:
    """A manifest in the format, read."""

    lines: tuple[str, str, str, str, str]  # the statement's lines, without their newlines
    revision: int | None  # the revision line, None for `none`
    signature: bytes

    @property
    def statement(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)


def _revision_ok(value: str) -> bool:
    return value == "none" or (len(value) <= 16 and re.fullmatch(r"[1-9][0-9]*", value) is not None and int(value) <= MAX_REVISION)


def parse_manifest(data: bytes | str, at: str) -> Manifest:
    """Reads a manifest; raises `ManifestError` ("malformed") naming what is
    wrong: size, lines, first line, a field that is not lowercase hex or a revision."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)

    def malformed(why: str) -> ManifestError:
        return ManifestError("malformed", f"the signed manifest at {at} is malformed: {why}")

    if len(raw) > MAX_MANIFEST_BYTES:
        raise malformed(f"it is {len(raw)} bytes, more than {MAX_MANIFEST_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed("it is not UTF-8 text") from None
    if not text.endswith("\n"):
        raise malformed("its last line does not end with a newline")
    lines = text[:-1].split("\n")
    if len(lines) != 6:
        raise malformed(f"it has {len(lines)} lines, not 6")
    if lines[0] != MANIFEST_HEADER:
        raise malformed(f'its first line is {json.dumps(lines[0][:80])}, not "{MANIFEST_HEADER}"')

    def field(i: int, name: str, what: str, ok: Any) -> str:
        line = lines[i]
        if line.startswith(name + " ") and ok(line[len(name) + 1 :]):
            return line[len(name) + 1 :]
        raise malformed(f'line {i + 1} is {json.dumps(line[:80])}, not "{name} {what}"')

    field(1, "wasm-sha256", "<64 lowercase hex digits>", _HEX64.fullmatch)
    field(2, "config-sha256", "<64 lowercase hex digits>", _HEX64.fullmatch)
    field(3, "vectors-sha256", "<64 lowercase hex digits, or none>", lambda v: v == "none" or _HEX64.fullmatch(v))
    revision = field(4, "revision", f"<decimal digits from 1 to {MAX_REVISION}, or none>", _revision_ok)
    signature = field(5, "signature", "<128 lowercase hex digits>", _HEX128.fullmatch)
    return Manifest(
        (lines[0], lines[1], lines[2], lines[3], lines[4]),
        None if revision == "none" else int(revision),
        bytes.fromhex(signature),
    )


def _first_difference(manifest: Manifest, read: str) -> str | None:
    """The first line of `read` (a statement) that differs from the manifest's, in words."""
    for signed, actual in zip(manifest.lines, read.split("\n"), strict=False):
        if signed == actual:
            continue
        name, _, signed_value = signed.partition(" ")
        actual_value = actual.partition(" ")[2]
        if name == "wasm-sha256":
            return f"wasm-sha256 {signed_value} but the .wasm read has {actual_value}: changed after signing"
        if name == "config-sha256":
            return f"config-sha256 {signed_value} but the configuration read has {actual_value}: changed after signing"
        if name == "vectors-sha256" and actual_value == "none":
            return f"vectors-sha256 {signed_value} but no vectors were published: removed after signing"
        if name == "vectors-sha256" and signed_value == "none":
            return f"vectors-sha256 none but vectors {actual_value} were published: added after signing"
        if name == "vectors-sha256":
            return f"vectors-sha256 {signed_value} but the vectors read have {actual_value}: changed after signing"
        return f"revision {signed_value} but the publication read is revision {actual_value}: not the revision it was signed for"
    return None


def verify_publication(
    public_key: bytes,
    manifest: bytes | str | None,
    at: str,
    wasm: bytes,
    config: bytes | str,
    vectors: bytes | str | None,
    revision: int | None,
    *,
    legacy_signature_at: str | None = None,
) -> None:
    """Checks a publication against its manifest under the 32-byte `public_key`;
    raises `ManifestError` when there is none (`legacy_signature_at`: where a
    signature over the .wasm alone was found, if one was), when it is
    malformed, when what was read differs from what was signed (the first
    differing line named), or when the signature does not verify."""
    if manifest is None:
        message = f"unsigned: no signed manifest at {at}"
        if legacy_signature_at is not None:
            message += (
                f"; the signature at {legacy_signature_at} is over the .wasm alone, and a signature over the .wasm alone "
                "(before 0.7) is not accepted: sign the whole publication (agent-retry sign)"
            )
        raise ManifestError("unsigned", message)
    parsed = parse_manifest(manifest, at)
    why = _first_difference(parsed, statement(wasm, config, vectors, revision))
    if why is not None:
        raise ManifestError("mismatch", f"the signed manifest at {at} covers {why}")
    ed25519 = _ed25519()
    try:
        key = ed25519.Ed25519PublicKey.from_public_bytes(bytes(public_key))
    except ValueError as e:
        raise ManifestError("key", f"the configured public key is not valid: {e}") from None
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(parsed.signature, parsed.statement.encode("utf-8"))
    except InvalidSignature:
        raise ManifestError(
            "signature",
            f"the signed manifest at {at} does not verify under the configured key: signed with another key, or edited after signing",
        ) from None


def check_covers(manifest: Manifest, at: str, wasm: bytes, config: bytes | str, vectors: bytes | str | None) -> None:
    """Refuses (`ManifestError`, "mismatch"), before anything is written, a
    manifest that does not cover these parts: what publishing checks."""
    why = _first_difference(manifest, statement(wasm, config, vectors, manifest.revision))
    if why is not None:
        raise ManifestError("mismatch", f"the signed manifest at {at} covers {why}")


__all__ = [
    "MANIFEST_HEADER",
    "MAX_MANIFEST_BYTES",
    "Manifest",
    "ManifestError",
    "check_covers",
    "parse_manifest",
    "sign_publication",
    "statement",
    "verify_publication",
]
