"""Component values <-> canonical JSON, with the WIT types read once.

wasmtime-py's stock `Func.__call__` re-reads the function type through FFI on
every call, and its record/variant conversion re-reads field and case lists on
every value (and returns variants untagged when their payload classes do not
overlap). Here every type is read once, when an export is first looked up, into
a tree of small codec objects; a call then only walks that tree.

The Python form of every value is the canonical JSON of tests/vectors/README.md:
records are dicts with the WIT (kebab-case) names, a variant case without payload
is `"case"` and with one `{"case": payload}`, enums are `"case"`, options `None`
or the value, results `{"ok": v}` / `{"err": e}`, lists and tuples lists, and a
u64 may be given as an int or a `"0x..."` hex string. Resources are
`wasmtime.component.ResourceAny`.

Memory: this follows wasmtime-py 50.0.1's own conversion (`_types.py`) call for
call: a lowered value is owned by the C side and freed with
`wasmtime_component_val_delete` after the call; a lifted value's heap parts are
freed as they are read. It relies on private wasmtime-py modules, which is why
the package accepts only the wasmtime-py range in `_compat.py` and checks it at
import time.
"""

from __future__ import annotations

import ctypes
import re
import struct
from collections.abc import Callable
from ctypes import byref
from typing import Any

from wasmtime import WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime.component import (
    S32,
    S64,
    U8,
    U16,
    U32,
    U64,
    Bool,
    BorrowType,
    EnumType,
    ListType,
    OptionType,
    OwnType,
    RecordType,
    ResourceAny,
    ResultType,
    String,
    TupleType,
    ValType,
    VariantType,
)

from . import _compat  # first: refuses an unsupported wasmtime-py with a clear message

_compat.check_private_helpers(ffi)

_BOOL = ffi.WASMTIME_COMPONENT_BOOL.value
_U8 = ffi.WASMTIME_COMPONENT_U8.value
_U16 = ffi.WASMTIME_COMPONENT_U16.value
_U32 = ffi.WASMTIME_COMPONENT_U32.value
_U64 = ffi.WASMTIME_COMPONENT_U64.value
_S32 = ffi.WASMTIME_COMPONENT_S32.value
_S64 = ffi.WASMTIME_COMPONENT_S64.value
_STRING = ffi.WASMTIME_COMPONENT_STRING.value
_LIST = ffi.WASMTIME_COMPONENT_LIST.value
_RECORD = ffi.WASMTIME_COMPONENT_RECORD.value
_TUPLE = ffi.WASMTIME_COMPONENT_TUPLE.value
_VARIANT = ffi.WASMTIME_COMPONENT_VARIANT.value
_ENUM = ffi.WASMTIME_COMPONENT_ENUM.value
_OPTION = ffi.WASMTIME_COMPONENT_OPTION.value
_RESULT = ffi.WASMTIME_COMPONENT_RESULT.value
_RESOURCE = ffi.WASMTIME_COMPONENT_RESOURCE.value

_Val = ffi.wasmtime_component_val_t
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF

# A second prototype of `wasm_byte_vec_new` that takes `bytes` directly (c_char_p),
# so a string is copied once by C instead of through a ctypes array. The
# library's own prototype is left untouched.
_byte_vec_new = ctypes.CFUNCTYPE(None, ctypes.POINTER(ffi.wasm_byte_vec_t), ctypes.c_size_t, ctypes.c_char_p)(
    ("wasm_byte_vec_new", ffi.dll)
)
_byte_vec_delete = ffi.wasm_byte_vec_delete
_val_new = ffi.wasmtime_component_val_new
_val_free = ffi.wasmtime_component_val_free
_string_at = ctypes.string_at


# A u64 may also be written as "0x" + hex digits (JSON numbers lose precision
# above 2^53 in JavaScript); nothing else (no sign, underscores or spaces).
_HEX_U64 = re.compile(r"0x[0-9a-fA-F]{1,16}")


class ValueConversionError(TypeError):
    """A Python value does not fit the WIT type it is passed as."""


def _byte_vec(data: bytes) -> ffi.wasm_byte_vec_t:
    vec = ffi.wasm_byte_vec_t()
    _byte_vec_new(byref(vec), len(data), data)
    return vec


def _read_str(vec: ffi.wasm_byte_vec_t) -> str:
    """Reads a C-owned name or string and frees it."""
    text = _string_at(vec.data, vec.size).decode("utf-8") if vec.size else ""
    _byte_vec_delete(byref(vec))
    return text


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Codec:
    """Converts one WIT type. `lower` writes into a C value that it finds empty
    and leaves empty if it raises; `lift` reads a C value and frees its parts."""

    # Returned for an omitted record field; `None` means the field is required.
    absent: Callable[[], Any] | None = None

    def lower(self, value: Any, out: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def lift(self, c: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class _BoolCodec(Codec):
    absent = staticmethod(lambda: False)

    def lower(self, value: Any, out: Any) -> None:
        if not isinstance(value, bool):
            raise ValueConversionError(f"{_describe(value)} is not a boolean")
        out.of.boolean = value
        out.kind = _BOOL

    def lift(self, c: Any) -> Any:
        return bool(c.of.boolean)


class _IntCodec(Codec):
    def __init__(self, kind: int, field: str, lo: int, hi: int, hex_ok: bool) -> None:
        self.kind, self.field, self.lo, self.hi, self.hex_ok = kind, field, lo, hi, hex_ok

    def lower(self, value: Any, out: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            if self.hex_ok and isinstance(value, str) and _HEX_U64.fullmatch(value):
                value = int(value[2:], 16)
            else:
                raise ValueConversionError(f"{_describe(value)} is not an integer")
        if not self.lo <= value <= self.hi:
            raise ValueConversionError(f"{value} is out of range")
        setattr(out.of, self.field, value)
        out.kind = self.kind

    def lift(self, c: Any) -> Any:
        return int(getattr(c.of, self.field))


class _StringCodec(Codec):
    absent = staticmethod(lambda: "")

    def lower(self, value: Any, out: Any) -> None:
        if not isinstance(value, str):
            raise ValueConversionError(f"{_describe(value)} is not a string")
        out.of.string = _byte_vec(value.encode("utf-8"))
        out.kind = _STRING

    def lift(self, c: Any) -> Any:
        return _read_str(c.of.string)


class _ListCodec(Codec):
    absent: Callable[[], Any] | None = staticmethod(list)

    def __init__(self, element: Codec) -> None:
        self.element = element

    def lower(self, value: Any, out: Any) -> None:
        if not isinstance(value, (list, tuple)):
            raise ValueConversionError(f"{_describe(value)} is not a list")
        raw = ffi.wasmtime_component_vallist_t()
        ffi.wasmtime_component_vallist_new_uninit(raw, len(value))
        _lower_items([self.element] * len(value), value, raw)
        out.of.list = raw
        out.kind = _LIST

    def lift(self, c: Any) -> Any:
        lift = self.element.lift
        raw = c.of.list
        data = raw.data
        items = []
        for i in range(raw.size):
            item = data[i]
            items.append(lift(item))
            item.kind = _BOOL
        ffi.wasmtime_component_vallist_delete(byref(raw))
        return items


def _lower_items(codecs: list[Codec], values: Any, raw: Any) -> None:
    """Lowers `values` into the uninitialised items of a C list or tuple; on an
    error the items not written are made booleans so the whole can be freed."""
    data = raw.data
    i = 0
    try:
        for codec, value in zip(codecs, values, strict=False):
            codec.lower(value, data[i])
            i += 1
    except BaseException:
        for j in range(i, len(codecs)):
            data[j].kind = _BOOL
            data[j].of.boolean = False
        ffi.wasmtime_component_vallist_delete(byref(raw))
        raise


class _TupleCodec(Codec):
    def __init__(self, elements: list[Codec]) -> None:
        self.elements = elements

    def lower(self, value: Any, out: Any) -> None:
        if not isinstance(value, (list, tuple)) or len(value) != len(self.elements):
            raise ValueConversionError(f"{_describe(value)} is not a tuple of {len(self.elements)} items")
        raw = ffi.wasmtime_component_vallist_t()
        ffi.wasmtime_component_vallist_new_uninit(raw, len(value))
        _lower_items(self.elements, value, raw)
        # A tuple has the same C layout as a list (size, data).
        out.of.tuple = ffi.wasmtime_component_valtuple_t(raw.size, raw.data)
        out.kind = _TUPLE

    def lift(self, c: Any) -> Any:
        raw = c.of.tuple
        data = raw.data
        items = []
        for i, codec in enumerate(self.elements):
            item = data[i]
            items.append(codec.lift(item))
            item.kind = _BOOL
        ffi.wasmtime_component_valtuple_delete(byref(raw))
        return items


class _RecordCodec(Codec):
    def __init__(self, fields: list[tuple[str, Codec]]) -> None:
        self.fields = fields
        self.names = frozenset(name for name, _ in fields)
        self.encoded = [(name, name.encode("utf-8"), codec) for name, codec in fields]

    def lower(self, value: Any, out: Any) -> None:
        if not isinstance(value, dict):
            raise ValueConversionError(f"{_describe(value)} is not a record (a dict)")
        if len(value) > len(self.names) or not self.names.issuperset(value):
            unknown = sorted(set(value) - self.names)
            raise ValueConversionError(f"{unknown} are not fields of {sorted(self.names)}")
        raw = ffi.wasmtime_component_valrecord_t()
        ffi.wasmtime_component_valrecord_new_uninit(raw, len(self.fields))
        data = raw.data
        i = 0
        try:
            for name, encoded, codec in self.encoded:
                entry = data[i]
                if name in value:
                    field_value = value[name]
                elif codec.absent is not None:
                    field_value = codec.absent()
                else:
                    raise ValueConversionError(f"{name}: is required")
                try:
                    codec.lower(field_value, entry.val)
                except ValueConversionError as e:
                    raise ValueConversionError(f"{name}: {e}") from None
                entry.name = _byte_vec(encoded)
                i += 1
        except BaseException:
            for j in range(i, len(self.fields)):
                data[j].name = ffi.wasm_byte_vec_t()
                data[j].val.kind = _BOOL
                data[j].val.of.boolean = False
            ffi.wasmtime_component_valrecord_delete(byref(raw))
            raise
        out.of.record = raw
        out.kind = _RECORD

    def lift(self, c: Any) -> Any:
        raw = c.of.record
        data = raw.data
        result = {}
        for i, (name, codec) in enumerate(self.fields):
            entry = data[i]
            result[name] = codec.lift(entry.val)
            entry.val.kind = _BOOL
        ffi.wasmtime_component_valrecord_delete(byref(raw))  # frees the names too
        return result


def _lift_boxed(codec: Codec, ptr: Any) -> Any:
    """Lifts the heap-allocated payload of a variant, option or result and frees the box."""
    value = codec.lift(ptr.contents)
    ptr.contents.kind = _BOOL
    _val_free(ptr)
    return value


def _lower_boxed(codec: Codec, value: Any) -> Any:
    raw = _Val()
    codec.lower(value, raw)
    return _val_new(byref(raw))  # moves the value into a box the C side owns


class _VariantCodec(Codec):
    def __init__(self, cases: list[tuple[str, Codec | None]]) -> None:
        self.cases = {name: (name.encode("utf-8"), codec) for name, codec in cases}
        self.by_encoded = {name.encode("utf-8"): (name, codec) for name, codec in cases}

    def lower(self, value: Any, out: Any) -> None:
        if isinstance(value, str):
            name, payload, has_payload = value, None, False
        elif isinstance(value, dict) and len(value) == 1:
            ((name, payload),) = value.items()
            has_payload = True
        else:
            raise ValueConversionError(f'{_describe(value)} is not a variant case ("case" or {{"case": payload}})')
        case = self.cases.get(name)
        if case is None:
            raise ValueConversionError(f"{name!r} is not a case of {sorted(self.cases)}")
        encoded, codec = case
        if codec is None and has_payload:
            raise ValueConversionError(f"case {name!r} takes no payload")
        if codec is not None and not has_payload:
            raise ValueConversionError(f"case {name!r} needs a payload: {{{name!r}: ...}}")
        boxed = _lower_boxed(codec, payload) if codec is not None else None
        out.of.variant.val = boxed
        out.of.variant.discriminant = _byte_vec(encoded)
        out.kind = _VARIANT

    def lift(self, c: Any) -> Any:
        variant = c.of.variant
        disc = variant.discriminant
        name, codec = self.by_encoded[_string_at(disc.data, disc.size)]
        _byte_vec_delete(byref(disc))
        if codec is None:
            return name
        return {name: _lift_boxed(codec, variant.val)}


class _EnumCodec(Codec):
    def __init__(self, names: list[str]) -> None:
        self.names = {name: name.encode("utf-8") for name in names}

    def lower(self, value: Any, out: Any) -> None:
        encoded = self.names.get(value) if isinstance(value, str) else None
        if encoded is None:
            raise ValueConversionError(f"{_describe(value)} is not one of {sorted(self.names)}")
        out.of.enumeration = _byte_vec(encoded)
        out.kind = _ENUM

    def lift(self, c: Any) -> Any:
        return _read_str(c.of.enumeration)


class _OptionCodec(Codec):
    absent = staticmethod(lambda: None)

    def __init__(self, payload: Codec) -> None:
        self.payload = payload

    def lower(self, value: Any, out: Any) -> None:
        out.of.option = None if value is None else _lower_boxed(self.payload, value)
        out.kind = _OPTION

    def lift(self, c: Any) -> Any:
        ptr = c.of.option
        return _lift_boxed(self.payload, ptr) if ptr else None


class _ResultCodec(Codec):
    def __init__(self, ok: Codec | None, err: Codec | None) -> None:
        self.ok, self.err = ok, err

    def lower(self, value: Any, out: Any) -> None:
        if not (isinstance(value, dict) and len(value) == 1 and ("ok" in value or "err" in value)):
            raise ValueConversionError(f'{_describe(value)} is not {{"ok": ...}} or {{"err": ...}}')
        is_ok = "ok" in value
        codec = self.ok if is_ok else self.err
        payload = value["ok" if is_ok else "err"]
        out.of.result.val = _lower_boxed(codec, payload) if codec is not None else None
        out.of.result.is_ok = is_ok
        out.kind = _RESULT

    def lift(self, c: Any) -> Any:
        result = c.of.result
        key, codec = ("ok", self.ok) if result.is_ok else ("err", self.err)
        return {key: _lift_boxed(codec, result.val) if codec is not None else None}


class _ResourceCodec(Codec):
    """`own<T>` results become `ResourceAny`; `borrow<T>` parameters take one (cloned)."""

    def __init__(self, borrow: bool) -> None:
        self.borrow = borrow

    def lower(self, value: Any, out: Any) -> None:
        if not isinstance(value, ResourceAny):
            raise ValueConversionError(f"{_describe(value)} is not a resource handle")
        if self.borrow:
            out.of.resource = ffi.wasmtime_component_resource_any_clone(value.ptr())
        else:
            out.of.resource = value._consume()
        out.kind = _RESOURCE

    def lift(self, c: Any) -> Any:
        return ResourceAny._from_ptr(ffi.take_pointer(c.of, "resource"))


def build(ty: ValType) -> Codec:
    """The codec of a WIT type, reading the type (through FFI) once."""
    if isinstance(ty, Bool):
        return _BoolCodec()
    if isinstance(ty, U8):
        return _IntCodec(_U8, "u8", 0, 0xFF, False)
    if isinstance(ty, U16):
        return _IntCodec(_U16, "u16", 0, 0xFFFF, False)
    if isinstance(ty, U32):
        return _IntCodec(_U32, "u32", 0, 0xFFFF_FFFF, False)
    if isinstance(ty, U64):
        return _IntCodec(_U64, "u64", 0, 0xFFFF_FFFF_FFFF_FFFF, True)
    if isinstance(ty, S32):
        return _IntCodec(_S32, "s32", -(2**31), 2**31 - 1, False)
    if isinstance(ty, S64):
        return _IntCodec(_S64, "s64", -(2**63), 2**63 - 1, False)
    if isinstance(ty, String):
        return _StringCodec()
    if isinstance(ty, ListType):
        return _ListCodec(build(ty.element))
    if isinstance(ty, TupleType):
        return _TupleCodec([build(t) for t in ty.elements])
    if isinstance(ty, RecordType):
        return _RecordCodec([(name, build(t)) for name, t in ty.fields])
    if isinstance(ty, VariantType):
        return _VariantCodec([(name, build(t) if t is not None else None) for name, t in ty.cases])
    if isinstance(ty, EnumType):
        return _EnumCodec(ty.names)
    if isinstance(ty, OptionType):
        return _OptionCodec(build(ty.payload))
    if isinstance(ty, ResultType):
        ok, err = ty.ok, ty.err
        return _ResultCodec(build(ok) if ok is not None else None, build(err) if err is not None else None)
    if isinstance(ty, BorrowType):
        return _ResourceCodec(borrow=True)
    if isinstance(ty, OwnType):
        return _ResourceCodec(borrow=False)
    raise WasmtimeError(f"agent_retry_policy does not convert values of WIT type {type(ty).__name__}")


# The flat reads (contract 0.8.0: `begin-call`'s `call-start` and every
# report's `verdict`). These answers are records of integers, booleans and enum
# cases, so instead of walking a codec tree (a ctypes object per field and per
# level) they are read straight from the C value's memory with one `struct`
# unpack, the enum cases looked up by their bytes, and the whole value freed with
# one `wasmtime_component_val_delete`. The offsets come from wasmtime-py's
# ctypes mirror of the C structs (`_bindings.py`), not from constants here; the
# shape of each record is checked against the component's own types when it is
# loaded (`FlatRecord`), so a contract change fails the load, not a call.

_VAL_SIZE = ctypes.sizeof(_Val)
_UNION = _Val.of.offset
_ENTRY = ffi.wasmtime_component_valrecord_entry_t
_ENTRY_SIZE = ctypes.sizeof(_ENTRY)
_ENTRY_UNION = _ENTRY.val.offset + _UNION
# A `result`'s (is-ok, the address of its boxed payload); where a record value
# keeps the address of its entries; an option<u64>'s box holds the u64 at _UNION.
_RESULT_HEAD = struct.Struct(
    f"={_UNION + ffi.wasmtime_component_valresult_t.is_ok.offset}x?"
    f"{ffi.wasmtime_component_valresult_t.val.offset - ffi.wasmtime_component_valresult_t.is_ok.offset - 1}xQ"
)
_RECORD_DATA = _UNION + ffi.wasmtime_component_valrecord_t.data.offset
_U64_AT = ctypes.c_uint64.from_address
_PTR_AT = ctypes.c_size_t.from_address

# The struct format of each scalar kind's union, and the codec classes it fits.
_SCALARS: dict[str, tuple[str, tuple[type, ...], int | None]] = {
    "bool": ("?", (_BoolCodec,), None),
    "u16": ("H", (_IntCodec,), _U16),
    "u32": ("I", (_IntCodec,), _U32),
    "u64": ("Q", (_IntCodec,), _U64),
    # An enum case's name: wasm_name_t (size, data).
    "enum": ("QQ", (_EnumCodec,), None),
    # An option's box (a pointer, 0 for none) of a u64.
    "option<u64>": ("Q", (_OptionCodec,), None),
}


class FlatRecord:
    """Reads one record of scalars (`fields`: (WIT name, kind) in WIT order) out
    of a C value with a single unpack. `check` compares the shape with the codec
    the component's type built; `read(address)` returns the raw tuple (an enum
    as its (size, data), an option<u64> as its box address)."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self.fields = fields
        parts, at = ["="], 0
        for i, (_, kind) in enumerate(fields):
            offset = i * _ENTRY_SIZE + _ENTRY_UNION
            parts.append(f"{offset - at}x" if offset > at else "")
            fmt = _SCALARS[kind][0]
            parts.append(fmt)
            at = offset + struct.calcsize("=" + fmt)
        self.struct = struct.Struct("".join(parts))
        # The bytes read, in place: up to the last field's end (the entries go on past it).
        self.block = ctypes.c_char * self.struct.size

    def check(self, codec: Codec | None) -> str | None:
        """None if `codec` is `result<this record, _>`, else what differs."""
        if not isinstance(codec, _ResultCodec) or not isinstance(codec.ok, _RecordCodec):
            return "the result is not result<record, _>"
        have = codec.ok.fields
        if [name for name, _ in have] != [name for name, _ in self.fields]:
            return f"the record's fields are {[name for name, _ in have]}, not {[name for name, _ in self.fields]}"
        for (name, field_codec), (_, kind) in zip(have, self.fields, strict=True):
            _, classes, int_kind = _SCALARS[kind]
            fits = isinstance(field_codec, classes)
            if fits and int_kind is not None:
                fits = isinstance(field_codec, _IntCodec) and field_codec.kind == int_kind
            if fits and kind == "option<u64>":
                payload = field_codec.payload  # type: ignore[attr-defined]
                fits = isinstance(payload, _IntCodec) and payload.kind == _U64
            if not fits:
                return f"field {name} is not a {kind}"
        return None


def enum_names(codec: Codec) -> dict[bytes, str]:
    """An enum's cases by their UTF-8 bytes (for `FlatRecord` reads)."""
    assert isinstance(codec, _EnumCodec)
    return {encoded: name for name, encoded in codec.names.items()}


def record_field(codec: Codec | None, name: str) -> Codec:
    """The codec of field `name` of a `result<record, _>` codec."""
    assert isinstance(codec, _ResultCodec) and isinstance(codec.ok, _RecordCodec)
    return dict(codec.ok.fields)[name]


def shape(codec: Codec | None) -> str:
    """A short name of a codec's WIT type, for checking a flat export's
    parameters at load: `u32`, `string`, `option<string>`, `borrow`, ..."""
    if isinstance(codec, _IntCodec):
        return codec.field
    if isinstance(codec, _BoolCodec):
        return "bool"
    if isinstance(codec, _StringCodec):
        return "string"
    if isinstance(codec, _EnumCodec):
        return "enum"
    if isinstance(codec, _VariantCodec):
        return "variant"
    if isinstance(codec, _RecordCodec):
        return "record"
    if isinstance(codec, _OptionCodec):
        return f"option<{shape(codec.payload)}>"
    if isinstance(codec, _ResourceCodec):
        return "borrow" if codec.borrow else "own"
    return type(codec).__name__
