// The reading both binary parsers share (src/contract.ts reads a component's
// export sections, src/sandbox.ts rewrites its core modules): bytes, LEB128
// numbers and skips, bounds-checked, every error a ComponentLoadError that says
// which binary it was reading.
import { ComponentLoadError } from './errors.js';

export class BinaryReader {
  offset = 0;
  /** `what` names the binary in errors: `a core module`, `the component binary`. */
  constructor(
    readonly b: Uint8Array,
    readonly end = b.length,
    private readonly what = 'the binary',
  ) {}

  get done(): boolean {
    return this.offset >= this.end;
  }

  protected fail(problem: string): never {
    throw new ComponentLoadError(`${this.what} ${problem}`);
  }

  byte(): number {
    if (this.offset >= this.end) this.fail('ends early');
    return this.b[this.offset++];
  }

  u32(): number {
    let result = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      const b = this.byte();
      result += (b & 0x7f) * 2 ** shift;
      if (!(b & 0x80)) return result;
    }
    this.fail('has a malformed LEB128 number');
  }

  /** A LEB128 number of at most `maxBytes` bytes, signed or not, skipped. */
  skipLeb(maxBytes: number): void {
    for (let i = 0; i < maxBytes; i++) if (!(this.byte() & 0x80)) return;
    this.fail('has a malformed LEB128 number');
  }

  skip(n: number): void {
    if (this.offset + n > this.end) this.fail('ends early');
    this.offset += n;
  }
}
