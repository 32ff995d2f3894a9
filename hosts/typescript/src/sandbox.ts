// The Node host's sandbox: V8 has no fuel and jco no memory limit, so every
// core module of the component is rewritten at load, before it is compiled:
//
// - fuel: a mutable i64 global is charged at every function entry (the function's
//   instructions outside its loops) and at the head of every loop (the loop's own
//   instructions, each time round). When it goes below zero the guest executes
//   `unreachable` and traps. The host refills it before each call
//   (`fuelPerCall`, plus `fuelPerConfigByte` a byte for a configuration's load,
//   as in the Rust and Python hosts, about one unit per wasm
//   instruction, counted as an upper bound: branches not taken are charged too).
//   A bulk operation is charged its length too, before it runs (`memory.fill`,
//   `.copy`, `.init` a unit a byte; `table.fill`, `.copy`, `.init`, `.grow` a
//   unit an element), as the default costs of wasmtime 48.0.8 (the Rust host's)
//   do (`VariableOperatorCost::new` in crates/environ/src/tunables.rs, charged by
//   `pre_translate_bulk_op` in crates/cranelift/src/func_environ.rs): otherwise a
//   loop of 20 MB fills would cost a few units a round. `memory.grow` is charged
//   a unit a page asked for, up to the cap: wasmtime 48 charges nothing a page,
//   wasmtime-py 50 (the Python host's) a unit a page granted. A 64-bit table (i64
//   lengths) is refused at load.
//   Every endless computation passes a loop head or a function entry without
//   end, so none outlasts its fuel.
// - memory: each memory's declared maximum is lowered to the cap (`maxMemoryBytes`,
//   64 MiB by default): `memory.grow` past it returns -1 inside the guest, as in
//   wasmtime with a store limit. A memory that starts above the cap, a 64-bit
//   memory, or pages of another size are refused at load. Each `memory.grow` also
//   sets a flag global when it fails, so that the trap that usually follows is
//   reported as `PolicyMemoryExceeded`, not as a bare trap.
//
// An instruction this rewriter does not know (GC, exception handling) refuses the
// component at load (`ComponentLoadError`) rather than running it unmetered.
import { ComponentLoadError } from './errors.js';
import { BinaryReader } from './binary-reader.js';

/** Fuel for one call into the component: the Rust and Python hosts' default. */
export const FUEL_PER_CALL = 20_000_000;
/** Fuel `policy.from-json` gets on top of `FUEL_PER_CALL`, per UTF-8 byte of the
 *  configuration (as in the Rust and Python hosts): loading one costs time linear
 *  in its text and happens off the decision path (once per update), so a large
 *  but valid configuration (10,000 tools) must not run out of a call's fuel. */
export const FUEL_PER_CONFIG_BYTE = 2_000;
/** The most linear memory one instance may grow to: the Rust and Python hosts' cap. */
export const MAX_MEMORY_BYTES = 64 * 1024 * 1024;
export const PAGE_BYTES = 65536;

/** The exports the rewriter adds to each core module. */
export const FUEL_EXPORT = 'agent-retry:sandbox/fuel';
export const GROW_FAILED_EXPORT = 'agent-retry:sandbox/grow-failed';

/** A core module's bytes. */
class Bytes extends BinaryReader {
  constructor(b: Uint8Array, end = b.length) {
    super(b, end, 'a core module');
  }
  /** Any signed or unsigned LEB128 up to 64 bits, skipped. */
  leb(): void {
    this.skipLeb(10);
  }
  name(): string {
    const n = this.u32();
    const text = new TextDecoder().decode(this.b.subarray(this.offset, this.offset + n));
    this.skip(n);
    return text;
  }
}

/** Appends without spreading (a spread of a large array overflows the stack). */
function append(out: number[], items: ArrayLike<number>): void {
  for (let i = 0; i < items.length; i++) out.push(items[i]);
}

function u32leb(n: number): number[] {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n = Math.floor(n / 128);
    if (n !== 0) b |= 0x80;
    out.push(b);
  } while (n !== 0);
  return out;
}

function s64leb(n: number): number[] {
  // n is a non-negative safe integer here.
  const out: number[] = [];
  for (;;) {
    const b = n % 128;
    n = Math.floor(n / 128);
    if (n === 0 && !(b & 0x40)) {
      out.push(b);
      return out;
    }
    out.push(b | 0x80);
  }
}

const nameBytes = (s: string): number[] => {
  const b = [...new TextEncoder().encode(s)];
  return [...u32leb(b.length), ...b];
};

/** A block type: 0x40, a value type, or an s33 type index. */
function blockType(r: Bytes): void {
  const b = r.b[r.offset];
  if (b === 0x40 || (b >= 0x7b && b <= 0x7f) || b === 0x70 || b === 0x6f) r.offset++;
  else r.leb();
}

function memarg(r: Bytes): void {
  const align = r.u32();
  if (align & 0x40) r.u32(); // multi-memory: a memory index follows
  r.leb(); // offset
}

interface Scan {
  /** Offsets (in the body) just after each `loop`'s block type, with the charge of that loop. */
  loops: Array<{ at: number; cost: number }>;
  /** Offsets just after each `memory.grow` (its memory index included). */
  grows: number[];
  /** Offsets of each bulk operation (and `memory.grow`), charged by its length (the stack's top). */
  bulks: Array<{ at: number; grow: boolean }>;
  /** The charge of the function's instructions outside any loop. */
  entryCost: number;
}

/** Decodes one function body's instructions (from `r.offset` to `r.end`). */
function scanBody(r: Bytes): Scan {
  const loops: Scan['loops'] = [];
  const grows: number[] = [];
  const bulks: Scan['bulks'] = [];
  // One frame per open block: loop frames collect their own instruction counts.
  const frames: Array<{ loop: number | null }> = [{ loop: null }];
  let entryCost = 0;
  const counts: number[] = [];
  const charge = () => {
    for (let i = frames.length - 1; i >= 0; i--) {
      const loop = frames[i].loop;
      if (loop !== null) {
        counts[loop] += 1;
        return;
      }
    }
    entryCost += 1;
  };
  while (r.offset < r.end) {
    const at = r.offset;
    const op = r.byte();
    charge();
    switch (op) {
      case 0x00: case 0x01: case 0x0f: case 0x1a: case 0x1b: case 0xd1: case 0xd3: case 0xd5:
        break;
      case 0x02: case 0x04:
        blockType(r);
        frames.push({ loop: null });
        break;
      case 0x03:
        blockType(r);
        loops.push({ at: r.offset, cost: 0 });
        counts.push(1); // the loop instruction itself, each time round
        frames.push({ loop: counts.length - 1 });
        break;
      case 0x05:
        break;
      case 0x0b:
        frames.pop();
        break;
      case 0x0c: case 0x0d: case 0x10: case 0x12: case 0x14: case 0x15: case 0xd2: case 0xd4: case 0xd6:
      case 0x20: case 0x21: case 0x22: case 0x23: case 0x24: case 0x25: case 0x26:
        r.u32();
        break;
      case 0x0e:
        for (let n = r.u32(); n >= 0; n--) r.u32(); // the targets and the default
        break;
      case 0x11: case 0x13:
        r.u32();
        r.u32();
        break;
      case 0x1c:
        for (let n = r.u32(); n > 0; n--) r.byte();
        break;
      case 0x3f:
        r.u32();
        break;
      case 0x40:
        bulks.push({ at, grow: true });
        r.u32();
        grows.push(r.offset);
        break;
      case 0x41: case 0x42: case 0xd0:
        r.leb();
        break;
      case 0x43:
        r.skip(4);
        break;
      case 0x44:
        r.skip(8);
        break;
      case 0xfc: {
        const sub = r.u32();
        if (sub <= 7) break;
        // memory.init, .copy, .fill; table.init, .copy, .grow, .fill: the length is on top.
        if (sub >= 8 && sub <= 17 && sub !== 9 && sub !== 13 && sub !== 16) bulks.push({ at, grow: false });
        if (sub === 8 || sub === 10 || sub === 12 || sub === 14) { r.u32(); r.u32(); break; }
        if (sub <= 17) { r.u32(); break; }
        throw new ComponentLoadError(`a core module uses an instruction the sandbox cannot meter (0xfc ${sub})`);
      }
      case 0xfd: {
        const sub = r.u32();
        if (sub <= 11 || sub === 92 || sub === 93) memarg(r);
        else if (sub === 12 || sub === 13) r.skip(16);
        else if (sub >= 21 && sub <= 34) r.byte();
        else if (sub >= 84 && sub <= 91) { memarg(r); r.byte(); }
        break;
      }
      case 0xfe: {
        const sub = r.u32();
        if (sub === 3) r.byte();
        else memarg(r);
        break;
      }
      default:
        if (op >= 0x28 && op <= 0x3e) { memarg(r); break; }
        if (op >= 0x45 && op <= 0xc4) break;
        throw new ComponentLoadError(`a core module uses an instruction the sandbox cannot meter (opcode 0x${op.toString(16)})`);
    }
  }
  if (frames.length !== 0) throw new ComponentLoadError('a core module has an unbalanced function body');
  loops.forEach((loop, i) => { loop.cost = counts[i]; });
  return { loops, grows, bulks, entryCost };
}

/** What was added to a module: the indices of the new globals. */
interface Added { fuel: number; tmp: number; growFailed: number }

function chargeCode(cost: number, g: Added): number[] {
  // global.get fuel; i64.const cost; i64.sub; global.set fuel; global.get fuel; i64.const 0; i64.lt_s; if; unreachable; end
  return [0x23, ...u32leb(g.fuel), 0x42, ...s64leb(cost), 0x7d, 0x24, ...u32leb(g.fuel),
    0x23, ...u32leb(g.fuel), 0x42, 0x00, 0x53, 0x04, 0x40, 0x00, 0x0b];
}

function bulkCode(g: Added, capPages: number | null): number[] {
  // [n] global.set tmp; global.get tmp; global.get fuel; global.get tmp; (for a grow: i32.const cap;
  // global.get tmp; i32.const cap; i32.lt_u; select, the smaller); i64.extend_i32_u; i64.sub;
  // global.set fuel; then the check of chargeCode -> [n]
  const atMost = capPages === null ? [] : [0x41, ...s64leb(capPages), 0x23, ...u32leb(g.tmp), 0x41, ...s64leb(capPages), 0x49, 0x1b];
  return [0x24, ...u32leb(g.tmp), 0x23, ...u32leb(g.tmp), 0x23, ...u32leb(g.fuel), 0x23, ...u32leb(g.tmp), ...atMost, 0xad,
    0x7d, 0x24, ...u32leb(g.fuel), 0x23, ...u32leb(g.fuel), 0x42, 0x00, 0x53, 0x04, 0x40, 0x00, 0x0b];
}

function growCode(g: Added): number[] {
  // [r] global.set tmp; global.get tmp; global.get tmp; i32.const -1; i32.eq; global.get failed; i32.or; global.set failed -> [r]
  return [0x24, ...u32leb(g.tmp), 0x23, ...u32leb(g.tmp), 0x23, ...u32leb(g.tmp), 0x41, 0x7f, 0x46,
    0x23, ...u32leb(g.growFailed), 0x72, 0x24, ...u32leb(g.growFailed)];
}

function rewriteCode(section: Uint8Array, g: Added, capPages: number): number[] {
  const r = new Bytes(section);
  const out: number[] = [];
  const n = r.u32();
  out.push(...u32leb(n));
  for (let f = 0; f < n; f++) {
    const size = r.u32();
    const start = r.offset;
    const end = start + size;
    const body = new Bytes(section, end);
    body.offset = start;
    for (let groups = body.u32(); groups > 0; groups--) {
      body.u32();
      const t = body.byte();
      if (!((t >= 0x7b && t <= 0x7f) || t === 0x70 || t === 0x6f)) {
        throw new ComponentLoadError(`a core module uses a local type the sandbox does not know (0x${t.toString(16)})`);
      }
    }
    const codeStart = body.offset;
    const scan = scanBody(body);
    const inserts = new Map<number, number[]>();
    const add = (at: number, code: number[]) => inserts.set(at, [...(inserts.get(at) ?? []), ...code]);
    add(codeStart, chargeCode(scan.entryCost, g));
    for (const loop of scan.loops) add(loop.at, chargeCode(loop.cost, g));
    for (const at of scan.grows) add(at, growCode(g));
    for (const { at, grow } of scan.bulks) add(at, bulkCode(g, grow ? capPages : null));
    const newBody: number[] = [];
    append(newBody, section.subarray(start, codeStart));
    let from = codeStart;
    for (const at of [...inserts.keys()].sort((a, b) => a - b)) {
      append(newBody, section.subarray(from, at));
      append(newBody, inserts.get(at) as number[]);
      from = at;
    }
    append(newBody, section.subarray(from, end));
    append(out, u32leb(newBody.length));
    append(out, newBody);
    r.offset = end;
  }
  return out;
}

function capMemories(section: Uint8Array, capPages: number): number[] {
  const r = new Bytes(section);
  const out: number[] = [];
  const n = r.u32();
  out.push(...u32leb(n));
  for (let i = 0; i < n; i++) {
    const flags = r.byte();
    if (flags & ~0x03) throw new ComponentLoadError(`a core module declares a memory the sandbox cannot cap (limits flags 0x${flags.toString(16)}: 64-bit or custom pages)`);
    const min = r.u32();
    const max = flags & 0x01 ? r.u32() : undefined;
    if (min > capPages) {
      throw new ComponentLoadError(`a core module's memory starts at ${min * PAGE_BYTES} bytes, over the sandbox's cap of ${capPages * PAGE_BYTES} bytes`);
    }
    out.push(flags | 0x01, ...u32leb(min), ...u32leb(Math.min(max ?? capPages, capPages)));
  }
  return out;
}

/** A table's limits, refused if 64-bit: its bulk operations' i64 lengths are not metered. */
function tableLimits(s: Bytes): void {
  const flags = s.byte();
  if (flags & 0x04) throw new ComponentLoadError('a core module declares a 64-bit table, whose bulk operations the sandbox cannot meter');
  s.u32();
  if (flags & 0x01) s.u32();
}

/** Rewrites one core module for the sandbox (fuel metering, memory cap, grow flag). */
export function instrumentCoreModule(bytes: Uint8Array, maxMemoryBytes = MAX_MEMORY_BYTES): Uint8Array<ArrayBuffer> {
  if (bytes.length < 8 || bytes[0] !== 0 || bytes[1] !== 0x61 || bytes[2] !== 0x73 || bytes[3] !== 0x6d || bytes[4] !== 1) {
    throw new ComponentLoadError('a core module of the component is not a WebAssembly 1.0 module');
  }
  const capPages = Math.floor(maxMemoryBytes / PAGE_BYTES);
  const r = new Bytes(bytes);
  r.offset = 8;
  const sections: Array<{ id: number; body: Uint8Array }> = [];
  while (r.offset < bytes.length) {
    const id = r.byte();
    const size = r.u32();
    const start = r.offset;
    r.skip(size);
    sections.push({ id, body: bytes.subarray(start, start + size) });
  }
  let importedGlobals = 0;
  let definedGlobals = 0;
  const exportNames: string[] = [];
  for (const { id, body } of sections) {
    const s = new Bytes(body);
    if (id === 2) {
      for (let n = s.u32(); n > 0; n--) {
        s.name();
        s.name();
        const kind = s.byte();
        if (kind === 0x00 || kind === 0x04) { if (kind === 0x04) s.byte(); s.u32(); }
        else if (kind === 0x01) { s.byte(); tableLimits(s); }
        else if (kind === 0x02) { const f = s.byte(); s.u32(); if (f & 1) s.u32(); }
        else if (kind === 0x03) { s.byte(); s.byte(); importedGlobals++; }
        else throw new ComponentLoadError(`a core module has an import of unknown kind 0x${kind.toString(16)}`);
      }
    } else if (id === 4) {
      for (let n = s.u32(); n > 0; n--) {
        const t = s.byte();
        if (t === 0x63 || t === 0x64) s.leb(); // (ref null? heaptype)
        else if (t !== 0x70 && t !== 0x6f) throw new ComponentLoadError(`a core module declares a table the sandbox does not know (0x${t.toString(16)})`);
        tableLimits(s);
      }
    } else if (id === 6) {
      definedGlobals = s.u32();
    } else if (id === 7) {
      for (let n = s.u32(); n > 0; n--) {
        exportNames.push(s.name());
        s.byte();
        s.u32();
      }
    }
  }
  for (const name of [FUEL_EXPORT, GROW_FAILED_EXPORT]) {
    if (exportNames.includes(name)) throw new ComponentLoadError(`a core module already exports "${name}"`);
  }
  const base = importedGlobals + definedGlobals;
  const g: Added = { fuel: base, tmp: base + 1, growFailed: base + 2 };
  const newGlobals = [0x7e, 0x01, 0x42, 0x00, 0x0b, 0x7f, 0x01, 0x41, 0x00, 0x0b, 0x7f, 0x01, 0x41, 0x00, 0x0b];
  const newExports = [...nameBytes(FUEL_EXPORT), 0x03, ...u32leb(g.fuel), ...nameBytes(GROW_FAILED_EXPORT), 0x03, ...u32leb(g.growFailed)];

  const order = (id: number) => [0, 1, 2, 3, 4, 5, 13, 6, 7, 8, 9, 12, 10, 11].indexOf(id);
  const out: number[] = [];
  append(out, bytes.subarray(0, 8));
  const emit = (id: number, body: ArrayLike<number>) => {
    out.push(id);
    append(out, u32leb(body.length));
    append(out, body);
  };
  let globalsDone = false;
  let exportsDone = false;
  const ensure = (beforeId: number) => {
    if (!globalsDone && order(beforeId) > order(6)) {
      emit(6, [...u32leb(3), ...newGlobals]);
      globalsDone = true;
    }
    if (!exportsDone && order(beforeId) > order(7)) {
      emit(7, [...u32leb(2), ...newExports]);
      exportsDone = true;
    }
  };
  for (const { id, body } of sections) {
    if (id !== 0) ensure(id);
    if (id === 6) {
      const s = new Bytes(body);
      const n = s.u32();
      const section = u32leb(n + 3);
      append(section, body.subarray(s.offset));
      emit(6, [...section, ...newGlobals]);
      globalsDone = true;
    } else if (id === 7) {
      const s = new Bytes(body);
      const n = s.u32();
      const section = u32leb(n + 2);
      append(section, body.subarray(s.offset));
      append(section, newExports);
      emit(7, section);
      exportsDone = true;
    } else if (id === 5) {
      emit(5, capMemories(body, capPages));
    } else if (id === 10) {
      emit(10, rewriteCode(body, g, capPages));
    } else {
      emit(id, body);
    }
  }
  ensure(11);
  return Uint8Array.from(out);
}
