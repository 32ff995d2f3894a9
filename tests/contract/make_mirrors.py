#!/usr/bin/env python3
"""Writes the hosts' mirrors of the contract from wit/: the TypeScript type
descriptors (hosts/typescript/src/wit-types.ts) and the Python TypedDicts
(hosts/python/src/agent_retry_policy/wit_types.py), so that a change to the WIT
cannot leave a host's copy behind; and, from the Rust host's Redis account
budget (hosts/rust/src/accounts/), the Lua scripts, key prefix, timeout and
retry interval the Python and Node Redis backends share with it
(hosts/python/src/agent_retry_policy/redis_scripts.py,
hosts/typescript/src/redis-scripts.ts), so that workers of every host run the
same script (the same SHA1) on the same keys; and, from the Rust host's
hosts/rust/src/limits.rs, the input limits every host applies before a value
crosses the boundary (hosts/python/src/agent_retry_policy/limits_generated.py,
hosts/typescript/src/limits-generated.ts).

    python3 tests/contract/make_mirrors.py          # rewrite the files
    python3 tests/contract/make_mirrors.py --check  # fail if they are stale (make test runs it)

The parser reads the subset of WIT the contract uses: interfaces with records,
variants, enums, resources and functions; types bool, u16, u32, s32, u64,
string, list, tuple, option, result and named types.
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WIT = ROOT / "wit"
TS_OUT = ROOT / "hosts/typescript/src/wit-types.ts"
PY_OUT = ROOT / "hosts/python/src/agent_retry_policy/wit_types.py"

RUST_ACCOUNTS = ROOT / "hosts/rust/src/accounts"
RUST_SHARED_STATE = ROOT / "hosts/rust/src/shared_state"
TS_SCRIPTS_OUT = ROOT / "hosts/typescript/src/redis-scripts.ts"
PY_SCRIPTS_OUT = ROOT / "hosts/python/src/agent_retry_policy/redis_scripts.py"

RUST_FLEET = ROOT / "hosts/rust/src/fleet.rs"
TS_FLEET_OUT = ROOT / "hosts/typescript/src/fleet-scripts.ts"
PY_FLEET_OUT = ROOT / "hosts/python/src/agent_retry_policy/fleet_scripts.py"

RUST_LIMITS = ROOT / "hosts/rust/src/limits.rs"
TS_LIMITS_OUT = ROOT / "hosts/typescript/src/limits-generated.ts"
PY_LIMITS_OUT = ROOT / "hosts/python/src/agent_retry_policy/limits_generated.py"
# The limits the hosts share, in the order they are written out.
LIMIT_NAMES = ("MAX_BODY_BYTES", "MAX_STRUCTURED_BYTES", "MAX_HEADERS", "MAX_HEADER_VALUE_BYTES", "MAX_ID_BYTES", "MAX_SERVER_BYTES", "MAX_CONFIG_BYTES",
               "MAX_LIFTED_TEXT_BYTES", "MAX_SNAPSHOT_BYTES", "MAX_ARGUMENTS_BYTES")

# The configuration's defaults the wrappers' run-time guard reads (the caps no
# policy may break), from the guest's field tables in guest/src/config.rs.
GUEST_CONFIG = ROOT / "guest/src/config.rs"
RUST_DEFAULTS_OUT = ROOT / "hosts/rust/src/config_defaults.rs"
TS_DEFAULTS_OUT = ROOT / "hosts/typescript/src/config-defaults.ts"
PY_DEFAULTS_OUT = ROOT / "hosts/python/src/agent_retry_policy/config_defaults.py"
# (configuration field, its table in config.rs)
DEFAULT_FIELDS = (
    ("max-delay-ms", "INT_FIELDS"),
    ("max-hint-ms", "INT_FIELDS"),
    ("max-attempts-per-call", "INT_FIELDS"),
    ("max-retries-per-run", "INT_FIELDS"),
    ("max-steps-per-run", "INT_FIELDS"),
    ("task-poll-max-delay-ms", "INT_FIELDS"),
    ("max-polls-per-task", "INT_FIELDS"),
    ("max-wait-ms", "ACCOUNT_FIELDS"),
    ("hint-cap-over-backoff-ms", "INT_FIELDS"),
)

PRIMITIVES = {"bool", "u16", "u32", "s32", "u64", "string"}


def tokens(text):
    text = re.sub(r"//[^\n]*", "", text)  # doc comments and comments
    return re.findall(r"->|[A-Za-z_][A-Za-z0-9_-]*|[{}()<>,:;.@/\[\]=*]|\d+", text)


class Parser:
    def __init__(self, toks):
        self.toks, self.i = toks, 0

    def peek(self, k=0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else None

    def next(self):
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, tok):
        got = self.next()
        if got != tok:
            raise SystemExit(f"WIT: expected {tok!r}, got {got!r} at token {self.i}")

    def type(self):
        name = self.next()
        if name in ("list", "option"):
            self.expect("<")
            of = self.type()
            self.expect(">")
            return (name, of)
        if name == "tuple":
            self.expect("<")
            items = [self.type()]
            while self.peek() == ",":
                self.next()
                items.append(self.type())
            self.expect(">")
            return ("tuple", items)
        if name == "result":
            ok = err = None
            if self.peek() == "<":
                self.next()
                ok = None if self.peek() == "_" else self.type()
                if ok is None:
                    self.next()
                if self.peek() == ",":
                    self.next()
                    err = self.type()
                self.expect(">")
            return ("result", ok, err)
        return ("prim", name) if name in PRIMITIVES else ("named", name)

    def block(self):
        """Items between { and }, split on the top-level commas."""
        self.expect("{")
        items = []
        while self.peek() != "}":
            items.append(self.item())
            if self.peek() == ",":
                self.next()
        self.expect("}")
        return items

    def item(self):
        name = self.next()
        if self.peek() == ":":
            self.next()
            return (name, self.type())
        if self.peek() == "(":
            self.next()
            t = self.type()
            self.expect(")")
            return (name, t)
        return (name, None)

    def params(self):
        self.expect("(")
        out = []
        while self.peek() != ")":
            name = self.next()
            self.expect(":")
            out.append((name, self.type()))
            if self.peek() == ",":
                self.next()
        self.expect(")")
        result = None
        if self.peek() == "->":
            self.next()
            result = self.type()
        self.expect(";")
        return out, result


def parse():
    types, funcs, resources = {}, {}, set()
    for path in sorted(WIT.glob("*.wit")):
        p = Parser(tokens(path.read_text()))
        interface = None
        while p.peek() is not None:
            tok = p.next()
            if tok == "interface":
                interface = p.next()
            elif tok in ("record", "variant", "enum"):
                name = p.next()
                types[name] = (tok, p.block())
            elif tok == "resource":
                resource = p.next()
                resources.add(resource)
                p.expect("{")
                while p.peek() != "}":
                    fname = p.next()
                    p.expect(":")
                    static = p.peek() == "static"
                    if static:
                        p.next()
                    p.expect("func")
                    params, result = p.params()
                    if interface == "policy":
                        funcs[f"[{'static' if static else 'method'}]{resource}.{fname}"] = (params, result)
                p.expect("}")
            elif tok == ":" and p.peek() == "func":
                fname = p.toks[p.i - 2]
                p.next()
                params, result = p.params()
                if interface == "policy":
                    funcs[fname] = (params, result)
    # A resource is a handle, not data: the descriptors say null for it.
    for name in resources:
        types.pop(name, None)
    return types, funcs, resources


def camel(name):
    head, *rest = name.split("-")
    return head + "".join(w.capitalize() for w in rest)


def ts_type(t, names):
    kind = t[0]
    if kind == "prim":
        return t[1]
    if kind == "named":
        return names.get(t[1], "null")
    if kind in ("list", "option"):
        return f"{kind}({ts_type(t[1], names)})"
    if kind == "tuple":
        return "tuple(" + ", ".join(ts_type(x, names) for x in t[1]) + ")"
    if kind == "result":
        ok = "null" if t[1] is None else ts_type(t[1], names)
        err = "null" if t[2] is None else ts_type(t[2], names)
        return f"result({ok}, {err})"
    raise ValueError(t)


def order(types):
    """Definitions before use."""
    done, out = set(), []

    def deps(t):
        if t is None:
            return []
        if t[0] == "named":
            return [t[1]]
        if t[0] in ("list", "option"):
            return deps(t[1])
        if t[0] == "tuple":
            return [d for x in t[1] for d in deps(x)]
        if t[0] == "result":
            return deps(t[1]) + deps(t[2])
        return []

    def visit(name):
        if name in done:
            return
        done.add(name)
        for _, t in types[name][1]:
            for d in deps(t):
                visit(d)
        out.append(name)

    for name in types:
        visit(name)
    return out


def typescript(types, funcs):
    names = {n: ("enumOf" if False else camel(n)) for n in types}
    lines = [
        "// Generated by tests/contract/make_mirrors.py from wit/: do not edit.",
        "// The contract's types as data, for the conversion in wit.ts.",
        "",
        "import { list, option, result, tuple, record, variant, enumOf, bool, u16, u32, s32, u64, string, type WitType } from './wit-kinds.js';",
        "",
    ]
    for name in order(types):
        kind, items = types[name]
        if kind == "enum":
            lines.append(f"export const {names[name]}: WitType = enumOf('{name}', " + ", ".join(f"'{c}'" for c, _ in items) + ");")
        elif kind == "record":
            fields = ", ".join(f"['{f}', {ts_type(t, names)}]" for f, t in items)
            lines.append(f"export const {names[name]}: WitType = record('{name}', [{fields}]);")
        else:
            cases = ", ".join(f"['{c}', {'null' if t is None else ts_type(t, names)}]" for c, t in items)
            lines.append(f"export const {names[name]}: WitType = variant('{name}', [{cases}]);")
    lines += ["", "/** Parameter and result types of the policy interface's functions (resources excluded). */", "export const FUNCTIONS = {"]
    for fname, (params, result) in funcs.items():
        ps = ", ".join(ts_type(t, names) for _, t in params)
        r = "null" if result is None else ts_type(result, names)
        lines.append(f"  '{fname}': {{ params: [{ps}], result: {r} }},")
    lines.append("} as const satisfies Record<string, { params: readonly WitType[]; result: WitType | null }>;")
    return "\n".join(lines) + "\n"


def py_type(t):
    kind = t[0]
    if kind == "prim":
        return {"bool": "bool", "string": "str"}.get(t[1], "int")
    if kind == "named":
        return "".join(w.capitalize() for w in t[1].split("-"))
    if kind == "option":
        return f"Optional[{py_type(t[1])}]"
    if kind == "list":
        return f"list[{py_type(t[1])}]"
    if kind == "tuple":
        return "tuple[" + ", ".join(py_type(x) for x in t[1]) + "]"
    if kind == "result":
        return "dict"
    raise ValueError(t)


def python(types, funcs):
    lines = [
        '"""Generated by tests/contract/make_mirrors.py from wit/: do not edit.',
        "",
        "The contract's enum cases and record fields, in WIT order, for checks and",
        "for code that lists them (the typed mirror for readers is types.py, which a",
        "test keeps equal to these).",
        '"""',
        "",
        "ENUMS: dict[str, tuple[str, ...]] = {",
    ]
    for name in order(types):
        kind, items = types[name]
        if kind == "enum":
            lines.append(f"    {name!r}: (" + ", ".join(repr(c) for c, _ in items) + ",),")
    lines += ["}", "", "RECORDS: dict[str, tuple[str, ...]] = {"]
    for name in order(types):
        kind, items = types[name]
        if kind == "record":
            lines.append(f"    {name!r}: (" + ", ".join(repr(f) for f, _ in items) + ",),")
    lines += ["}", "", "VARIANTS: dict[str, tuple[str, ...]] = {"]
    for name in order(types):
        kind, items = types[name]
        if kind == "variant":
            lines.append(f"    {name!r}: (" + ", ".join(repr(c) for c, _ in items) + ",),")
    lines += ["}", "", "FUNCTIONS: tuple[str, ...] = ("]
    for fname in funcs:
        lines.append(f"    {fname!r},")
    lines.append(")")
    return "\n".join(lines) + "\n"


def rust_accounts():
    """The Redis backend's shared definitions, read from the Rust source (the
    one place they are written)."""
    redis_rs = (RUST_ACCOUNTS / "redis.rs").read_text()
    shared_rs = (RUST_ACCOUNTS / "shared.rs").read_text()

    def find(pattern, text, what):
        m = re.search(pattern, text, re.S)
        if m is None:
            raise SystemExit(f"make_mirrors.py: {what} not found in {RUST_ACCOUNTS} (pattern {pattern!r}): update the pattern")
        return m

    interval = find(r"retry_interval: Duration::from_(secs|millis)\((\d+)\)", shared_rs, "the default retry interval")
    state_rs = (RUST_SHARED_STATE / "redis.rs").read_text()
    return {
        "STATE_LOAD_LUA": find(r'const STATE_LOAD_LUA: &str = r#"(.*?)"#;', state_rs, "STATE_LOAD_LUA").group(1),
        "STATE_STORE_LUA": find(r'const STATE_STORE_LUA: &str = r#"(.*?)"#;', state_rs, "STATE_STORE_LUA").group(1),
        "STATE_PREFIX": find(r'pub const STATE_PREFIX: &str = "([^"]*)";', state_rs, "STATE_PREFIX").group(1),
        "GCRA_LUA": find(r'const GCRA_LUA: &str = r#"(.*?)"#;', redis_rs, "GCRA_LUA").group(1),
        "REFUND_LUA": find(r'const REFUND_LUA: &str = r#"(.*?)"#;', redis_rs, "REFUND_LUA").group(1),
        "ACCOUNT_PREFIX": find(r'prefix: "([^"]*)"\.to_string\(\)', redis_rs, "the key prefix").group(1),
        "REDIS_TIMEOUT_MS": int(find(r"const REDIS_TIMEOUT: Duration = Duration::from_millis\((\d+)\)", redis_rs, "REDIS_TIMEOUT").group(1)),
        "RETRY_INTERVAL_MS": int(interval.group(2)) * (1000 if interval.group(1) == "secs" else 1),
    }


SCRIPTS_DOC = [
    "The Redis account budget's definitions, shared by the Rust, Python and Node",
    "hosts so that their workers draw on one bucket per account: the GCRA and",
    "refund scripts (the same text, so the same SHA1 for EVALSHA), the keys'",
    "prefix, the timeout of one exchange and the default retry interval while on",
    "the local share. Their documentation is in hosts/rust/src/accounts/redis.rs.",
    "Beside them, the shared state's (the circuit breakers') read and",
    "compare-and-set scripts and key prefix: hosts/rust/src/shared_state/redis.rs.",
]


def lua_literal_ok(script):
    return all(c not in script for c in ("`", "${", "\\", '"""'))


def typescript_scripts(d):
    def lua(name):
        text = d[name]
        return f"`{text}`" if lua_literal_ok(text) else json.dumps(text)

    lines = ["// Generated by tests/contract/make_mirrors.py from hosts/rust/src/accounts/: do not edit."]
    lines += [f"// {line}" for line in SCRIPTS_DOC]
    lines += [
        "",
        f"export const GCRA_LUA = {lua('GCRA_LUA')};",
        "",
        f"export const REFUND_LUA = {lua('REFUND_LUA')};",
        "",
        f"export const ACCOUNT_PREFIX = {json.dumps(d['ACCOUNT_PREFIX'])};",
        f"export const ACCOUNTS_REDIS_TIMEOUT_MS = {d['REDIS_TIMEOUT_MS']};",
        f"export const ACCOUNTS_RETRY_INTERVAL_MS = {d['RETRY_INTERVAL_MS']};",
        "",
        f"export const STATE_LOAD_LUA = {lua('STATE_LOAD_LUA')};",
        "",
        f"export const STATE_STORE_LUA = {lua('STATE_STORE_LUA')};",
        "",
        f"export const STATE_PREFIX = {json.dumps(d['STATE_PREFIX'])};",
    ]
    return "\n".join(lines) + "\n"


def python_scripts(d):
    def lua(name):
        text = d[name]
        return f'"""{text}"""' if lua_literal_ok(text) else json.dumps(text)

    lines = ['"""Generated by tests/contract/make_mirrors.py from hosts/rust/src/accounts/: do not edit.', ""]
    lines += SCRIPTS_DOC
    lines += [
        '"""',
        "",
        f"GCRA_LUA = {lua('GCRA_LUA')}",
        "",
        f"REFUND_LUA = {lua('REFUND_LUA')}",
        "",
        f"ACCOUNT_PREFIX = {json.dumps(d['ACCOUNT_PREFIX'])}",
        f"REDIS_TIMEOUT_S = {d['REDIS_TIMEOUT_MS'] / 1000!r}",
        f"RETRY_INTERVAL_S = {d['RETRY_INTERVAL_MS'] / 1000!r}",
        "",
        f"STATE_LOAD_LUA = {lua('STATE_LOAD_LUA')}",
        "",
        f"STATE_STORE_LUA = {lua('STATE_STORE_LUA')}",
        "",
        f"STATE_PREFIX = {json.dumps(d['STATE_PREFIX'])}",
    ]
    return "\n".join(lines) + "\n"


def rust_fleet():
    """The fleet publication's script and the largest revision, from hosts/rust/src/fleet.rs."""
    text = RUST_FLEET.read_text()
    script = re.search(r'pub const PUBLISH_LUA: &str = r#"(.*?)"#;', text, re.S)
    largest = re.search(r"pub const MAX_REVISION: u64 = \(1 << (\d+)\) - 1;", text)
    if script is None or largest is None:
        raise SystemExit(f"make_mirrors.py: PUBLISH_LUA or MAX_REVISION not found in {RUST_FLEET}: update the pattern")
    return {"PUBLISH_LUA": script.group(1), "MAX_REVISION": (1 << int(largest.group(1))) - 1}


FLEET_DOC = [
    "The fleet publication's script (all or nothing: the stored revision is",
    "checked before anything is written) and the largest revision, shared by the",
    "Rust, Python and Node hosts. Their documentation is in hosts/rust/src/fleet.rs.",
]


def typescript_fleet(d):
    text = d["PUBLISH_LUA"]
    lua = f"`{text}`" if lua_literal_ok(text) else json.dumps(text)
    lines = ["// Generated by tests/contract/make_mirrors.py from hosts/rust/src/fleet.rs: do not edit."]
    lines += [f"// {line}" for line in FLEET_DOC]
    lines += ["", f"export const PUBLISH_LUA = {lua};", "", f"export const MAX_REVISION = {d['MAX_REVISION']:_};"]
    return "\n".join(lines) + "\n"


def python_fleet(d):
    text = d["PUBLISH_LUA"]
    lua = f'"""{text}"""' if lua_literal_ok(text) else json.dumps(text)
    lines = ['"""Generated by tests/contract/make_mirrors.py from hosts/rust/src/fleet.rs: do not edit.', ""]
    lines += FLEET_DOC
    lines += ['"""', "", f"PUBLISH_LUA = {lua}", "", f"MAX_REVISION = {d['MAX_REVISION']:_}"]
    return "\n".join(lines) + "\n"


def rust_limits():
    """The input limits, read from hosts/rust/src/limits.rs (the one place they
    are written): {name: (value, doc line)}."""
    text = RUST_LIMITS.read_text()
    out = {}
    for name in LIMIT_NAMES:
        m = re.search(r"((?:^[ \t]*///[^\n]*\n)*)[ \t]*pub const " + name + r": usize = ([0-9_]+(?:\s*<<\s*[0-9]+)?);", text, re.M)
        if m is None:
            raise SystemExit(f"make_mirrors.py: {name} not found in {RUST_LIMITS}: update the pattern")
        expr = m.group(2).replace("_", "")
        value = int(expr.split("<<")[0]) << int(expr.split("<<")[1]) if "<<" in expr else int(expr)
        doc = " ".join(line.strip()[3:].strip() for line in m.group(1).splitlines())
        out[name] = (value, doc)
    return out


def typescript_limits(limits):
    lines = [
        "// Generated by tests/contract/make_mirrors.py from hosts/rust/src/limits.rs: do not edit.",
        "// The input limits every host applies before a value crosses the boundary (limits.ts uses them).",
        "",
    ]
    for name, (value, doc) in limits.items():
        lines += [f"/** {doc} */", f"export const {name} = {value:_};"]
    return "\n".join(lines) + "\n"


def python_limits(limits):
    lines = [
        '"""Generated by tests/contract/make_mirrors.py from hosts/rust/src/limits.rs: do not edit.',
        "",
        "The input limits every host applies before a value crosses the boundary",
        "(limits.py uses them).",
        '"""',
        "",
    ]
    for name, (value, doc) in limits.items():
        lines += [f"# {doc}", f"{name} = {value:_}"]
    return "\n".join(lines) + "\n"


def guest_defaults():
    """{field: default} from the guest's field tables, and `default-effect`."""
    text = GUEST_CONFIG.read_text()
    out = {}
    for field, table in DEFAULT_FIELDS:
        body = re.search(r"const " + table + r": \[IntField<[^>]*>; \d+\] = \[(.*?)\n\];", text, re.S)
        m = body and re.search(r'int\("' + re.escape(field) + r'", [0-9_]+, [A-Z0-9_ *]+, ([0-9_]+),', body.group(1))
        if m is None:
            raise SystemExit(f"make_mirrors.py: the default of {field} not found in {table} of {GUEST_CONFIG}: update the pattern")
        out[field] = int(m.group(1).replace("_", ""))
    # The aws-2026 preset's fields (Preset::fields), as "AWS_2026:<field>".
    preset = re.search(r"Preset::Aws2026 => &\[(.*?)\]", text, re.S)
    if preset is None:
        raise SystemExit(f"make_mirrors.py: Preset::Aws2026's fields not found in {GUEST_CONFIG}: update the pattern")
    for field, value in re.findall(r'\("([a-z-]+)", "([0-9]+)"\)', preset.group(1)):
        out["aws-2026-" + field] = int(value)
    m = re.search(r"default_effect: Effect::(\w+),", text)
    if m is None:
        raise SystemExit(f"make_mirrors.py: default_effect not found in {GUEST_CONFIG}")
    out["default-effect"] = m.group(1).lower()
    return out


def defaults_doc(comment):
    return [
        f"{comment}Generated by tests/contract/make_mirrors.py from guest/src/config.rs: do not edit.",
        f"{comment}The configuration's defaults the run-time guard reads when the configuration",
        f"{comment}text leaves a field out (\"account-budget.max-wait-ms\" is `max-wait-ms`).",
    ]


def rust_defaults(d):
    lines = defaults_doc("//! ") + [""]
    for field, value in d.items():
        name = field.upper().replace("-", "_")
        if isinstance(value, str):
            lines.append(f'pub const {name}: &str = "{value}";')
        else:
            lines.append(f"pub const {name}: u64 = {value:_};")
    return "\n".join(lines) + "\n"


def typescript_defaults(d):
    lines = defaults_doc("// ") + [""]
    for field, value in d.items():
        name = field.upper().replace("-", "_")
        lines.append(f'export const {name} = "{value}";' if isinstance(value, str) else f"export const {name} = {value:_};")
    return "\n".join(lines) + "\n"


def python_defaults(d):
    lines = ['"""' + defaults_doc("")[0]] + defaults_doc("")[1:] + ['"""', ""]
    for field, value in d.items():
        name = field.upper().replace("-", "_")
        lines.append(f'{name} = "{value}"' if isinstance(value, str) else f"{name} = {value:_}")
    return "\n".join(lines) + "\n"


def main():
    types, funcs, _ = parse()
    accounts = rust_accounts()
    limits = rust_limits()
    defaults = guest_defaults()
    fleet = rust_fleet()
    outputs = {
        TS_OUT: typescript(types, funcs),
        PY_OUT: python(types, funcs),
        TS_SCRIPTS_OUT: typescript_scripts(accounts),
        PY_SCRIPTS_OUT: python_scripts(accounts),
        TS_LIMITS_OUT: typescript_limits(limits),
        PY_LIMITS_OUT: python_limits(limits),
        RUST_DEFAULTS_OUT: rust_defaults(defaults),
        TS_DEFAULTS_OUT: typescript_defaults(defaults),
        PY_DEFAULTS_OUT: python_defaults(defaults),
        TS_FLEET_OUT: typescript_fleet(fleet),
        PY_FLEET_OUT: python_fleet(fleet),
    }
    stale = []
    for path, text in outputs.items():
        if "--check" in sys.argv:
            if not path.exists() or path.read_text() != text:
                stale.append(path.relative_to(ROOT))
        else:
            path.write_text(text)
    for path in stale:
        print(f"{path} is out of date: run python3 tests/contract/make_mirrors.py")
    print(f"{len(types)} types, {len(funcs)} functions from wit/; the Redis account scripts from hosts/rust/src/accounts/; {len(limits)} limits from hosts/rust/src/limits.rs; {len(defaults)} defaults from guest/src/config.rs")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
