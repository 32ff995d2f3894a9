#!/usr/bin/env python3
"""Removes the custom sections no host reads from the release component.

`wasm-tools component new` writes a `component-name` section (3.2 KB: the names
of every type, function and instance, for debuggers) and each core module keeps
a `producers` section (the toolchain's versions). Hosts load, gate and run the
component from its types, imports and exports only, so the release build drops
them. Every other byte is kept in order: the component still validates, and its
SHA-256 stays reproducible from the same build.

Usage: strip_custom_sections.py COMPONENT.wasm (rewritten in place).
"""

import sys

DROPPED = {"component-name", "producers", "name"}
COMPONENT_PREAMBLE = b"\x00asm\x0d\x00\x01\x00"
MODULE_PREAMBLE = b"\x00asm\x01\x00\x00\x00"
CUSTOM, CORE_MODULE = 0, 1


def read_leb(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def write_leb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def sections(binary: bytes):
    """(id, body) of each section after the 8-byte preamble."""
    at = 8
    while at < len(binary):
        section_id = binary[at]
        size, at = read_leb(binary, at + 1)
        if at + size > len(binary):
            raise ValueError(f"section {section_id} at byte {at} runs past the end")
        yield section_id, binary[at : at + size]
        at += size


def custom_name(body: bytes) -> str:
    length, at = read_leb(body, 0)
    return body[at : at + length].decode("utf-8", errors="replace")


def strip(binary: bytes) -> bytes:
    preamble = binary[:8]
    if preamble not in (COMPONENT_PREAMBLE, MODULE_PREAMBLE):
        raise ValueError("not a WebAssembly component or module")
    out = bytearray(preamble)
    for section_id, body in sections(binary):
        if section_id == CUSTOM and custom_name(body) in DROPPED:
            continue
        if preamble == COMPONENT_PREAMBLE and section_id == CORE_MODULE:
            body = strip(body)
        out.append(section_id)
        out += write_leb(len(body))
        out += body
    return bytes(out)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    path = sys.argv[1]
    with open(path, "rb") as f:
        before = f.read()
    after = strip(before)
    with open(path, "wb") as f:
        f.write(after)
    print(f"{path}: custom sections for debuggers removed, {len(before) - len(after)} bytes")


if __name__ == "__main__":
    main()
