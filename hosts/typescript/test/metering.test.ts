// The sandbox's fuel metering of bulk operations (issue 24 row 11): wasmtime
// charges `memory.fill`, `memory.copy`, `memory.init` one unit a byte and
// `table.fill`, `table.copy`, `table.init`, `table.grow` one a element, on top of
// the instruction (wasmtime-py 50 also `memory.grow` one a page granted); Node's
// count must not be below it, or a guest filling 20 MB in a loop spends almost
// nothing here where wasmtime stops it. Each module is built by hand: one
// function that runs one bulk operation `ROUNDS` times in a loop.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ComponentLoadError } from '../src/errors.js';
import { FUEL_EXPORT, instrumentCoreModule } from '../src/sandbox.js';

const u32 = (n: number): number[] => {
  const out: number[] = [];
  do {
    out.push((n & 0x7f) | (n >= 0x80 ? 0x80 : 0));
    n = Math.floor(n / 128);
  } while (n > 0);
  return out;
};
/** `i32.const n` (a signed LEB128; n below 2^31). */
const i32 = (n: number): number[] => {
  const out = [0x41];
  for (;;) {
    const b = n & 0x7f;
    n = Math.floor(n / 128);
    if (n === 0 && !(b & 0x40)) return [...out, b];
    out.push(b | 0x80);
  }
};
const section = (id: number, body: number[]) => [id, ...u32(body.length), ...body];

const ROUNDS = 320;
const PAGE = 65536;
const TABLE = 1024;
const SEGMENT = 4096;

/** A module exporting `run`: a loop of ROUNDS rounds, each running `op` once.
 *  It has one memory page, a table of TABLE funcrefs, a passive data segment of
 *  SEGMENT bytes and a passive element segment of one function. */
function bulkModule(op: number[]): Uint8Array<ArrayBuffer> {
  const counted = [0x20, 0, 0x41, 1, 0x6a, 0x22, 0, ...i32(ROUNDS), 0x49, 0x0d, 0]; // ++i < ROUNDS: br_if 0
  const body = [1, 1, 0x7f, 0x03, 0x40, ...op, ...counted, 0x0b, 0x0b];
  const data = Array<number>(SEGMENT).fill(7);
  return Uint8Array.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0,
    ...section(1, [1, 0x60, 0, 0]),
    ...section(3, [1, 0]),
    ...section(4, [1, 0x70, 0x00, ...u32(TABLE)]),
    ...section(5, [1, 0x00, 1]),
    ...section(7, [1, 3, ...new TextEncoder().encode('run'), 0x00, 0]),
    ...section(9, [1, 0x01, 0x00, 1, 0]),
    ...section(12, [1]),
    ...section(10, [1, ...u32(body.length), ...body]),
    ...section(11, [1, 0x01, ...u32(SEGMENT), ...data])]);
}

/** Each operation with a length of n (its other operands fixed), the n the test uses, and its unit. */
const BULK: Record<string, { op: (n: number) => number[]; units: number; unit: string }> = {
  'memory.fill': { op: (n) => [...i32(0), ...i32(0), ...i32(n), 0xfc, 11, 0], units: PAGE, unit: 'byte' },
  'memory.copy': { op: (n) => [...i32(0), ...i32(PAGE / 2), ...i32(n), 0xfc, 10, 0, 0], units: PAGE / 2, unit: 'byte' },
  'memory.init': { op: (n) => [...i32(0), ...i32(0), ...i32(n), 0xfc, 8, 0, 0], units: SEGMENT, unit: 'byte' },
  'table.fill': { op: (n) => [...i32(0), 0xd0, 0x70, ...i32(n), 0xfc, 17, 0], units: TABLE, unit: 'element' },
  'table.copy': { op: (n) => [...i32(0), ...i32(0), ...i32(n), 0xfc, 14, 0, 0], units: TABLE, unit: 'element' },
  'table.init': { op: (n) => [...i32(0), ...i32(0), ...i32(n), 0xfc, 12, 0, 0], units: 1, unit: 'element' },
  'table.grow': { op: (n) => [0xd0, 0x70, ...i32(n), 0xfc, 15, 0, 0x1a], units: TABLE, unit: 'element' },
  // 960 pages granted in all, under the 1,024 of the default cap.
  'memory.grow': { op: (n) => [...i32(n), 0x40, 0, 0x1a], units: 3, unit: 'page' },
};

/** Runs the module's `run` on a tank of `tank`: the fuel it burned, or 'out of fuel'. */
async function burn(bytes: Uint8Array<ArrayBuffer>, tank: bigint): Promise<bigint | 'out of fuel'> {
  const { instance } = await WebAssembly.instantiate(instrumentCoreModule(bytes));
  const fuel = instance.exports[FUEL_EXPORT] as WebAssembly.Global;
  fuel.value = tank;
  try {
    (instance.exports.run as () => void)();
  } catch (e) {
    // The metering's trap is `unreachable` with the fuel below zero.
    if (e instanceof WebAssembly.RuntimeError && (fuel.value as bigint) < 0n) return 'out of fuel';
    throw e;
  }
  return tank - (fuel.value as bigint);
}

test('a loop of 20 MB of memory.fill runs out of a 1 M tank, as in wasmtime', async () => {
  const module = bulkModule(BULK['memory.fill'].op(PAGE));
  assert.ok(WebAssembly.validate(module));
  // 320 rounds of a 64 KiB fill: 20,971,520 bytes, so wasmtime burns over 20 M.
  assert.equal(await burn(module, 1_000_000n), 'out of fuel');
  assert.equal(await burn(module, 20_000_000n), 'out of fuel');
});

for (const [name, { op, units, unit }] of Object.entries(BULK)) {
  test(`${name} is charged a unit a${unit === 'element' ? 'n' : ''} ${unit}, as in wasmtime`, async () => {
    const [module, empty] = [bulkModule(op(units)), bulkModule(op(0))];
    assert.ok(WebAssembly.validate(module), name);
    const [used, baseline] = [await burn(module, 1n << 40n), await burn(empty, 1n << 40n)];
    assert.ok(typeof used === 'bigint' && typeof baseline === 'bigint', name);
    // The same loop with a length of 0 costs the instructions: the rest is the length.
    assert.equal(used - baseline, BigInt(ROUNDS * units), `${name}: ${used} fuel, ${baseline} with a length of 0`);
    console.log(`${name}: ${ROUNDS} rounds of ${units} -> ${used} fuel (${baseline} with a length of 0)`);
  });
}

test('a memory.grow that cannot be granted is charged at most the cap, and returns -1', async () => {
  // memory.grow(2^31 - 1 pages); unless it returned -1 (below 0): unreachable.
  const module = bulkModule([...i32(2 ** 31 - 1), 0x40, 0, ...i32(0), 0x48, 0x45, 0x04, 0x40, 0x00, 0x0b]);
  assert.ok(WebAssembly.validate(module));
  const used = await burn(module, 1n << 40n);
  assert.ok(typeof used === 'bigint');
  // 1,024 pages (64 MiB) a round at most: not the 2^31 asked for, which would run out of any tank.
  assert.ok(used >= BigInt(ROUNDS * 1024) && used <= BigInt(ROUNDS * (1024 + 40)), `${used}`);
});

test('a 64-bit table is refused at load: its bulk operations take i64 lengths, which the metering does not charge', () => {
  const header = [0, 0x61, 0x73, 0x6d, 1, 0, 0, 0];
  const defined = Uint8Array.from([...header, ...section(4, [1, 0x70, 0x04, 1])]);
  const imported = Uint8Array.from([...header, ...section(2, [1, 1, 0x6d, 1, 0x74, 0x01, 0x70, 0x05, 1, 2])]);
  for (const module of [defined, imported]) {
    assert.throws(() => instrumentCoreModule(module), (e: unknown) => e instanceof ComponentLoadError && /a 64-bit table/.test(e.message));
  }
  // The same tables with 32-bit indices are rewritten.
  assert.ok(WebAssembly.validate(instrumentCoreModule(Uint8Array.from([...header, ...section(4, [1, 0x70, 0x00, 1])]))));
  assert.ok(WebAssembly.validate(instrumentCoreModule(Uint8Array.from([...header, ...section(2, [1, 1, 0x6d, 1, 0x74, 0x01, 0x70, 0x01, 1, 2])]))));
});
