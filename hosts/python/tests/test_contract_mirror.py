"""types.py (the typed mirror a reader uses) agrees with wit_types.py, which
tests/contract/make_mirrors.py generates from wit/: same enum cases and record
fields, in the same order. A record mirrored as a `NamedTuple` (the flat hot
path's `verdict` and `call-start`) has the WIT names in snake_case (`class` is
`class_`)."""

import typing

import pytest

from agent_retry_policy import types, wit_types
from agent_retry_policy.component import EXPORTED_FUNCTIONS


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


@pytest.mark.parametrize("name", sorted(wit_types.ENUMS))
def test_enum_cases_match_the_wit(name: str) -> None:
    mirror = getattr(types, camel(name), None)
    if mirror is None:
        pytest.skip(f"types.py has no {camel(name)} (the host never passes or reads it)")
    assert typing.get_args(mirror) == wit_types.ENUMS[name]


@pytest.mark.parametrize("name", sorted(wit_types.RECORDS))
def test_record_fields_match_the_wit(name: str) -> None:
    mirror = getattr(types, camel(name), None)
    if mirror is None:
        pytest.skip(f"types.py has no {camel(name)} (the host never passes or reads it)")
    if hasattr(mirror, "_fields"):  # a NamedTuple
        assert tuple(field.rstrip("_").replace("_", "-") for field in mirror._fields) == wit_types.RECORDS[name]
        return
    assert tuple(typing.get_type_hints(mirror, include_extras=True)) == wit_types.RECORDS[name]


def test_the_mirror_covers_what_the_host_passes_and_reads() -> None:
    names = (
        "observation",
        "delivery",
        "transport-error",
        "tool-hints",
        "status-check-result",
        "classification",
        "decision",
        "retry-plan",
        "escalation",
        "run-report",
        "escalation-reason",
        "outcome-class",
        "probe-answer",
        "task-report",
        "task-status",
        "poll-plan",
    )
    for name in (*names, "verdict", "call-start", "action-kind"):
        assert hasattr(types, camel(name)), name


def test_the_host_binds_every_function_of_the_contract() -> None:
    # The host checks each of these at load: one the WIT adds or drops must be seen here.
    assert EXPORTED_FUNCTIONS == wit_types.FUNCTIONS
