"""`limits.cut_lifted_text`: a text lifted from the policy is at most
`MAX_LIFTED_TEXT_BYTES` UTF-8 bytes when the host logs or returns it, cut at a
character boundary, with ` … [cut: N bytes]` (N the bytes removed)."""

from __future__ import annotations

from agent_retry_policy.limits import MAX_LIFTED_TEXT_BYTES, cut_lifted_text, utf8_size


def test_a_text_within_the_limit_is_kept_as_it_is() -> None:
    text = "x" * MAX_LIFTED_TEXT_BYTES
    assert cut_lifted_text(text) is text
    assert cut_lifted_text("") == ""


def test_a_longer_text_is_cut_and_says_how_much_was_removed() -> None:
    cut = cut_lifted_text("y" * (MAX_LIFTED_TEXT_BYTES + 10))
    assert cut == "y" * MAX_LIFTED_TEXT_BYTES + " … [cut: 10 bytes]"


def test_the_cut_falls_on_a_character_boundary() -> None:
    # 3-byte characters: 65,536 is not a multiple of 3, so the last whole one ends at 65,535.
    text = "€" * 30_000  # 90,000 bytes
    cut = cut_lifted_text(text)
    kept, _, suffix = cut.partition(" … ")
    assert kept == "€" * (MAX_LIFTED_TEXT_BYTES // 3)
    assert suffix == f"[cut: {90_000 - utf8_size(kept)} bytes]"


def test_20_mb_comes_out_at_the_limit_plus_the_suffix() -> None:
    cut = cut_lifted_text("z" * 20_971_520)
    assert utf8_size(cut) == MAX_LIFTED_TEXT_BYTES + utf8_size(f" … [cut: {20_971_520 - MAX_LIFTED_TEXT_BYTES} bytes]")
