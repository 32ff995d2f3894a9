// The kinds of WIT types the contract uses, as data (wit-types.ts is generated
// from wit/ with these).

export type WitType =
  | { kind: 'bool' | 'u16' | 'u32' | 's32' | 'u64' | 'string' }
  | { kind: 'list'; of: WitType }
  | { kind: 'tuple'; of: WitType[] }
  | { kind: 'record'; name: string; fields: Array<[string, WitType]> }
  | { kind: 'variant'; name: string; cases: Array<[string, WitType | null]> }
  | { kind: 'enum'; name: string; names: string[] }
  | { kind: 'option'; of: WitType }
  | { kind: 'result'; ok: WitType | null; err: WitType | null };

export const bool: WitType = { kind: 'bool' };
export const u16: WitType = { kind: 'u16' };
export const u32: WitType = { kind: 'u32' };
export const s32: WitType = { kind: 's32' };
export const u64: WitType = { kind: 'u64' };
export const string: WitType = { kind: 'string' };
export const list = (of: WitType): WitType => ({ kind: 'list', of });
export const tuple = (...of: WitType[]): WitType => ({ kind: 'tuple', of });
export const option = (of: WitType): WitType => ({ kind: 'option', of });
export const record = (name: string, fields: Array<[string, WitType]>): WitType => ({ kind: 'record', name, fields });
export const variant = (name: string, cases: Array<[string, WitType | null]>): WitType => ({ kind: 'variant', name, cases });
export const enumOf = (name: string, ...names: string[]): WitType => ({ kind: 'enum', name, names });
export const result = (ok: WitType | null, err: WitType | null): WitType => ({ kind: 'result', ok, err });
