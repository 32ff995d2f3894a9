//! The signed manifest: one Ed25519 signature over the whole publication (the
//! `.wasm`'s digest, the configuration's, the vectors' and the revision), so
//! that nothing of a publication can be changed, removed or added after
//! signing. The Python (`manifest.py`) and Node (`manifest.ts`) hosts write and
//! check the same text, replayed from `tests/vectors/fleet/manifests.json`.
//!
//! Six lines, each ending `\n`:
//! ```text
//! agent-retry publication 1
//! wasm-sha256 <64 lowercase hex>
//! config-sha256 <64 lowercase hex>
//! vectors-sha256 <64 lowercase hex, or none>
//! revision <decimal revision, or none (files)>
//! signature <128 lowercase hex: Ed25519 over the first five lines' bytes>
//! ```
//! The first five lines are the *statement*. A host builds the statement of
//! what it actually read and compares it line by line with the manifest's: the
//! first line that differs is named. Then the signature must verify.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::fleet::{MAX_REVISION, parse_revision};

/// The manifest's first line: the format and its version.
pub const MANIFEST_HEADER: &str = "agent-retry publication 1";
/// The largest manifest a host reads.
pub const MAX_MANIFEST_BYTES: usize = 4096;

/// Why a publication's manifest is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestError {
    /// No manifest where it was looked for; `legacy` is where a signature over
    /// the `.wasm` alone (before 0.7) was found, if one was.
    Unsigned { at: String, legacy: Option<String> },
    /// Not a manifest in the format.
    Malformed { at: String, why: String },
    /// What was read is not what was signed: the first line that differs.
    Mismatch { at: String, why: String },
    /// The signature does not verify under the configured key.
    BadSignature { at: String },
    /// The configured public key is not an Ed25519 key.
    BadKey(String),
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ManifestError::Unsigned { at, legacy: None } => write!(f, "unsigned: no signed manifest at {at}"),
            ManifestError::Unsigned { at, legacy: Some(legacy) } => write!(
                f,
                "unsigned: no signed manifest at {at}; the signature at {legacy} is over the .wasm alone, and a signature over the .wasm alone (before 0.7) is not accepted: sign the whole publication (agent-retry sign)"
            ),
            ManifestError::Malformed { at, why } => write!(f, "the signed manifest at {at} is malformed: {why}"),
            ManifestError::Mismatch { at, why } => write!(f, "the signed manifest at {at} covers {why}"),
            ManifestError::BadSignature { at } => {
                write!(f, "the signed manifest at {at} does not verify under the configured key: signed with another key, or edited after signing")
            }
            ManifestError::BadKey(why) => write!(f, "the configured public key is not valid: {why}"),
        }
    }
}

impl std::error::Error for ManifestError {}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The statement of a publication: the manifest's first five lines, from what
/// was read (the vectors' text and the revision, or none of either).
pub fn statement(wasm: &[u8], config: &[u8], vectors: Option<&[u8]>, revision: Option<u64>) -> String {
    format!(
        "{MANIFEST_HEADER}\nwasm-sha256 {}\nconfig-sha256 {}\nvectors-sha256 {}\nrevision {}\n",
        sha256_hex(wasm),
        sha256_hex(config),
        vectors.map_or_else(|| "none".to_string(), sha256_hex),
        revision.map_or_else(|| "none".to_string(), |r| r.to_string()),
    )
}

/// Signs a publication with the 32-byte Ed25519 seed: returns the manifest.
/// `revision`: the fleet revision it is published under (1 to
/// [`MAX_REVISION`]), or `None` for files. Panics on a revision out of range
/// (the caller's bug: `agent-retry sign` checks it first).
pub fn sign_publication(secret_key: &[u8; 32], wasm: &[u8], config: &[u8], vectors: Option<&[u8]>, revision: Option<u64>) -> String {
    assert!(revision.is_none_or(|r| (1..=MAX_REVISION).contains(&r)), "a revision is from 1 to {MAX_REVISION}");
    let text = statement(wasm, config, vectors, revision);
    let signature = SigningKey::from_bytes(secret_key).sign(text.as_bytes());
    let hex: String = signature.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("{text}signature {hex}\n")
}

/// The Ed25519 public key of a 32-byte seed (what workers are configured with).
pub fn public_key_of(secret_key: &[u8; 32]) -> [u8; 32] {
    SigningKey::from_bytes(secret_key).verifying_key().to_bytes()
}

/// A manifest in the format, read: its five statement lines and its signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The first five lines, without their newlines.
    pub lines: [String; 5],
    /// The revision line read ([`parse_revision`]), `None` for `none`.
    pub revision: Option<u64>,
    pub signature: [u8; 64],
}

impl Manifest {
    /// The statement the signature covers (the first five lines, newlines included).
    pub fn statement(&self) -> String {
        self.lines.iter().map(|line| format!("{line}\n")).collect()
    }
}

fn is_lower_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn shown(line: &str) -> String {
    format!("{:?}", line.chars().take(80).collect::<String>())
}

/// Reads a manifest: refused by name when it is not one (size, lines, first
/// line, a field that is not lowercase hex or a revision).
pub fn parse_manifest(bytes: &[u8], at: &str) -> Result<Manifest, ManifestError> {
    let malformed = |why: String| ManifestError::Malformed { at: at.to_string(), why };
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(malformed(format!("it is {} bytes, more than {MAX_MANIFEST_BYTES}", bytes.len())));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| malformed("it is not UTF-8 text".into()))?;
    let Some(body) = text.strip_suffix('\n') else {
        return Err(malformed("its last line does not end with a newline".into()));
    };
    let lines: Vec<&str> = body.split('\n').collect();
    if lines.len() != 6 {
        return Err(malformed(format!("it has {} lines, not 6", lines.len())));
    }
    if lines[0] != MANIFEST_HEADER {
        return Err(malformed(format!("its first line is {}, not {MANIFEST_HEADER:?}", shown(lines[0]))));
    }
    let field = |i: usize, name: &str, what: &str, ok: &dyn Fn(&str) -> bool| match lines[i].strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')) {
        Some(value) if ok(value) => Ok(value),
        _ => Err(malformed(format!("line {} is {}, not \"{name} {what}\"", i + 1, shown(lines[i])))),
    };
    field(1, "wasm-sha256", "<64 lowercase hex digits>", &|v| is_lower_hex(v, 64))?;
    field(2, "config-sha256", "<64 lowercase hex digits>", &|v| is_lower_hex(v, 64))?;
    field(3, "vectors-sha256", "<64 lowercase hex digits, or none>", &|v| v == "none" || is_lower_hex(v, 64))?;
    let revision_what = format!("<decimal digits from 1 to {MAX_REVISION}, or none>");
    let revision = field(4, "revision", &revision_what, &|v| v == "none" || parse_revision(v.as_bytes()).is_ok())?;
    let signature_hex = field(5, "signature", "<128 lowercase hex digits>", &|v| is_lower_hex(v, 128))?;
    let mut signature = [0u8; 64];
    for (i, pair) in signature_hex.as_bytes().chunks(2).enumerate() {
        signature[i] = u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("00"), 16).unwrap_or(0);
    }
    Ok(Manifest {
        lines: [0, 1, 2, 3, 4].map(|i| lines[i].to_string()),
        revision: if revision == "none" { None } else { parse_revision(revision.as_bytes()).ok() },
        signature,
    })
}

/// The first line of `read` (a statement) that differs from the manifest's,
/// in words; `None` when they are the same.
fn first_difference(manifest: &Manifest, read: &str) -> Option<String> {
    for (signed, actual) in manifest.lines.iter().zip(read.split('\n')) {
        if signed == actual {
            continue;
        }
        let (name, signed_value) = signed.split_once(' ').unwrap_or((signed, ""));
        let actual_value = actual.split_once(' ').map_or(actual, |(_, v)| v);
        return Some(match name {
            "wasm-sha256" => format!("wasm-sha256 {signed_value} but the .wasm read has {actual_value}: changed after signing"),
            "config-sha256" => format!("config-sha256 {signed_value} but the configuration read has {actual_value}: changed after signing"),
            "vectors-sha256" if actual_value == "none" => {
                format!("vectors-sha256 {signed_value} but no vectors were published: removed after signing")
            }
            "vectors-sha256" if signed_value == "none" => {
                format!("vectors-sha256 none but vectors {actual_value} were published: added after signing")
            }
            "vectors-sha256" => format!("vectors-sha256 {signed_value} but the vectors read have {actual_value}: changed after signing"),
            _ => format!("revision {signed_value} but the publication read is revision {actual_value}: not the revision it was signed for"),
        });
    }
    None
}

/// Checks a publication against its manifest under `public_key`: refused when
/// there is none (`legacy`: where a signature over the `.wasm` alone was
/// found), when it is malformed, when what was read differs from what was
/// signed (the first differing line named), or when the signature does not
/// verify. `at`: where the manifest was read, for messages.
#[allow(clippy::too_many_arguments)]
pub fn verify_publication(
    public_key: &[u8; 32],
    manifest: Option<&[u8]>,
    at: &str,
    legacy: Option<&str>,
    wasm: &[u8],
    config: &[u8],
    vectors: Option<&[u8]>,
    revision: Option<u64>,
) -> Result<(), ManifestError> {
    let bytes = manifest.ok_or_else(|| ManifestError::Unsigned { at: at.to_string(), legacy: legacy.map(str::to_string) })?;
    let manifest = parse_manifest(bytes, at)?;
    if let Some(why) = first_difference(&manifest, &statement(wasm, config, vectors, revision)) {
        return Err(ManifestError::Mismatch { at: at.to_string(), why });
    }
    let key = VerifyingKey::from_bytes(public_key).map_err(|e| ManifestError::BadKey(e.to_string()))?;
    key.verify(manifest.statement().as_bytes(), &Signature::from_bytes(&manifest.signature)).map_err(|_| ManifestError::BadSignature { at: at.to_string() })
}

/// Refuses, before anything is written, a manifest that does not cover these
/// parts (the revision is the manifest's own): what `publish` checks.
pub fn check_covers(manifest: &Manifest, at: &str, wasm: &[u8], config: &[u8], vectors: Option<&[u8]>) -> Result<(), ManifestError> {
    match first_difference(manifest, &statement(wasm, config, vectors, manifest.revision)) {
        Some(why) => Err(ManifestError::Mismatch { at: at.to_string(), why }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
    }

    fn key32(text: &str) -> [u8; 32] {
        hex(text).try_into().unwrap()
    }

    /// tests/vectors/fleet/manifests.json: what every host signs, accepts and refuses.
    #[test]
    fn the_manifest_vectors() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/fleet/manifests.json");
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let seed = key32(doc["test_only_seed"].as_str().unwrap());
        let public = key32(doc["public_key"].as_str().unwrap());
        assert_eq!(SigningKey::from_bytes(&seed).verifying_key().to_bytes(), public);
        let at = doc["manifest_at"].as_str().unwrap();
        let parts = |case: &serde_json::Value| {
            (
                hex(case["wasm"].as_str().unwrap()),
                case["config"].as_str().unwrap().to_string(),
                case["vectors"].as_str().map(str::to_string),
                case["revision"].as_u64(),
            )
        };
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() >= 5);
        for case in cases {
            let (wasm, config, vectors, revision) = parts(case);
            let vectors = vectors.as_deref().map(str::as_bytes);
            let name = case["description"].as_str().unwrap();
            assert_eq!(statement(&wasm, config.as_bytes(), vectors, revision), case["statement"].as_str().unwrap(), "{name}");
            let manifest = sign_publication(&seed, &wasm, config.as_bytes(), vectors, revision);
            assert_eq!(manifest, case["manifest"].as_str().unwrap(), "{name}");
            verify_publication(&public, Some(manifest.as_bytes()), at, None, &wasm, config.as_bytes(), vectors, revision).unwrap();
        }
        let refusals = doc["refusals"].as_array().unwrap();
        assert!(refusals.len() >= 20);
        for case in refusals {
            let (wasm, config, vectors, revision) = parts(case);
            let name = case["description"].as_str().unwrap();
            let error = verify_publication(
                &public,
                case["manifest"].as_str().map(str::as_bytes),
                at,
                case["legacy_signature_at"].as_str(),
                &wasm,
                config.as_bytes(),
                vectors.as_deref().map(str::as_bytes),
                revision,
            )
            .expect_err(name)
            .to_string();
            for word in case["error"].as_array().unwrap() {
                assert!(error.contains(word.as_str().unwrap()), "{name}: {error:?} lacks {word}");
            }
        }
    }

    #[test]
    fn publish_refuses_a_manifest_that_does_not_cover_the_parts() {
        let manifest = sign_publication(&[1; 32], b"wasm", b"{}", None, Some(5));
        let parsed = parse_manifest(manifest.as_bytes(), "m").unwrap();
        assert_eq!(parsed.revision, Some(5));
        check_covers(&parsed, "m", b"wasm", b"{}", None).unwrap();
        let error = check_covers(&parsed, "m", b"wasm", b"{\"max-attempts-per-call\": 100}", None).unwrap_err().to_string();
        assert!(error.contains("config-sha256") && error.contains("changed after signing"), "{error}");
    }
}
