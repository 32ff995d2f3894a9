// Which contract a component speaks, read from its export names
// (`agent-retry:policy/policy@X.Y.Z`), and whether this host speaks it too.
//
// Compatibility is semver's: the same major version, where for 0.x the minor
// counts as the major (0.2.0 and 0.2.5 are compatible, 0.2.0 and 0.3.0 are not,
// and every 0.0.z stands alone), as Cargo reads versions.
import { ComponentImportRefused, ComponentLoadError, ContractVersionMismatch } from './errors.js';
import { BinaryReader } from './binary-reader.js';

/** The contract this host is written for (wit/, `package agent-retry:policy@...`). */
export const CONTRACT_VERSION = '0.9.0';
/** The interface every policy component exports, without its version. */
export const POLICY_INTERFACE = 'agent-retry:policy/policy';

const SEMVER = /^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:[-+].*)?$/;

/** The part of a version that must match: `1` for 1.4.2, `0.2` for 0.2.7, `0.0.3` for 0.0.3. */
export function compatibilityKey(version: string): string {
  const m = SEMVER.exec(version);
  if (!m) throw new ComponentLoadError(`"${version}" is not a semantic version`);
  const [major, minor, patch] = [m[1], m[2], m[3]];
  if (major !== '0') return major;
  if (minor !== '0') return `0.${minor}`;
  return `0.0.${patch}`;
}

/** The version of the policy interface among a component's export names, or
 *  `null` if it exports the interface without a version; `undefined` if it does
 *  not export it at all. */
export function contractVersionOf(exportNames: readonly string[]): string | null | undefined {
  for (const name of exportNames) {
    if (name === POLICY_INTERFACE) return null;
    if (name.startsWith(`${POLICY_INTERFACE}@`)) return name.slice(POLICY_INTERFACE.length + 1);
  }
  return undefined;
}

/** Throws `ContractVersionMismatch` (a `ComponentLoadError`) unless the component
 *  with these export names speaks a contract compatible with `hostVersion`.
 *  Returns the component's version. `where` names the component in the message. */
export function checkContractVersion(exportNames: readonly string[], where = 'the component',
  hostVersion = CONTRACT_VERSION): string {
  const version = contractVersionOf(exportNames);
  if (version === undefined) {
    throw new ComponentLoadError(`${where} is not an agent-retry policy component: it exports no ${POLICY_INTERFACE} ` +
      `(its exports: ${exportNames.length ? exportNames.join(', ') : 'none'}); this host speaks @${hostVersion}`);
  }
  if (version === null) {
    throw new ContractVersionMismatch(`${where} speaks an unversioned ${POLICY_INTERFACE} but this host speaks @${hostVersion}`,
      '', hostVersion);
  }
  let compatible: boolean;
  try {
    compatible = compatibilityKey(version) === compatibilityKey(hostVersion);
  } catch {
    compatible = false;
  }
  if (!compatible) {
    throw new ContractVersionMismatch(`${where} speaks agent-retry:policy@${version} but this host speaks @${hostVersion}: ` +
      'use a component built from the contract this host was written for, or a host for its version', version, hostVersion);
  }
  return version;
}

/** A component binary's bytes. */
class Reader extends BinaryReader {
  constructor(bytes: Uint8Array, end = bytes.length) {
    super(bytes, end, 'the component binary');
  }
  /** An s33 (a value type): only its length matters here. */
  s33(): void {
    this.skipLeb(5);
  }
  string(): string {
    const length = this.u32();
    if (this.offset + length > this.end) this.fail('ends early');
    const text = new TextDecoder('utf-8', { fatal: true }).decode(this.b.subarray(this.offset, this.offset + length));
    this.offset += length;
    return text;
  }
  /** sort, or `externdesc`'s kind: 0x00 0x11 is a core module. */
  kind(): number {
    const b = this.byte();
    if (b === 0x00) this.byte();
    return b;
  }
}

/** An export's name (`exportname'`): 0x00 or 0x01 then the name; 0x02 then the
 *  name and options, of which a version suffix is appended as wasm-tools does. */
function externName(r: Reader): string {
  const lead = r.byte();
  if (lead !== 0x00 && lead !== 0x01 && lead !== 0x02) throw new ComponentLoadError(`unknown name encoding 0x${lead.toString(16)}`);
  let name = r.string();
  if (lead === 0x02) {
    for (let n = r.u32(); n > 0; n--) {
      const option = r.byte();
      const value = r.string();
      if (option === 0x01 && name.includes('@')) name += value;
    }
  }
  return name;
}

/** The names a component binary imports (`which` 10) or exports (11) at its
 *  top level (the component model's import and export sections), in order.
 *  Throws `ComponentLoadError` if the bytes are not a component. */
function componentExternNames(bytes: Uint8Array, which: 10 | 11): string[] {
  const magic = [0x00, 0x61, 0x73, 0x6d];
  if (bytes.length < 8 || magic.some((b, i) => bytes[i] !== b)) throw new ComponentLoadError('not a WebAssembly binary');
  const layer = bytes[6] | (bytes[7] << 8);
  if (layer !== 1) throw new ComponentLoadError('a core WebAssembly module, not a component');
  const names: string[] = [];
  const r = new Reader(bytes);
  r.offset = 8;
  while (!r.done) {
    const id = r.byte();
    const size = r.u32();
    const end = r.offset + size;
    if (end > bytes.length) throw new ComponentLoadError('the component binary ends early');
    if (id === which) {
      const section = new Reader(bytes, end);
      section.offset = r.offset;
      for (let n = section.u32(); n > 0; n--) {
        names.push(externName(section));
        if (which === 10) {
          externDesc(section);
          continue;
        }
        section.kind();
        section.u32(); // the exported item's index
        if (section.byte() === 0x01) externDesc(section); // an ascribed type
      }
    }
    r.offset = end;
  }
  return names;
}

/** An `externdesc` (an import's type, or an export's ascribed type). */
function externDesc(section: Reader): void {
  switch (section.kind()) {
    case 0x02: // value: 0x00 index | 0x01 value type
      if (section.byte() === 0x00) section.u32(); else section.s33();
      break;
    case 0x03: // type: 0x00 index (eq) | 0x01 (sub resource)
      if (section.byte() === 0x00) section.u32();
      break;
    default: // module, func, component, instance: an index
      section.u32();
  }
}

/** The names a component binary exports at its top level (the component model's
 *  export sections, id 11), in order. Throws `ComponentLoadError` if the bytes
 *  are not a component. */
export function componentExportNames(bytes: Uint8Array): string[] {
  return componentExternNames(bytes, 11);
}

/** The names a component binary imports at its top level (import sections, id 10). */
export function componentImportNames(bytes: Uint8Array): string[] {
  return componentExternNames(bytes, 10);
}

/** What a policy component may import: the contract's own interfaces (at a
 *  version compatible with this host's) and `wasi:random/random@0.2.x`. */
export function importAllowed(name: string, hostVersion = CONTRACT_VERSION): boolean {
  const at = name.lastIndexOf('@');
  const [iface, version] = at < 0 ? [name, ''] : [name.slice(0, at), name.slice(at + 1)];
  const compatible = (wanted: string) => {
    try {
      return compatibilityKey(version) === compatibilityKey(wanted);
    } catch {
      return false;
    }
  };
  if (iface === 'agent-retry:policy/account-budget' || iface === 'agent-retry:policy/shared-state' || iface === 'agent-retry:policy/types') {
    return compatible(hostVersion);
  }
  if (iface === 'wasi:random/random') return compatible('0.2.0');
  return false;
}

/** Throws `ComponentImportRefused` (a `ComponentLoadError`) naming the first
 *  import outside the contract. */
export function checkImports(importNames: readonly string[], where = 'the component'): void {
  const refused = importNames.find((name) => !importAllowed(name));
  if (refused !== undefined) {
    throw new ComponentImportRefused(`${where} imports ${refused}, which is outside the agent-retry contract ` +
      '(a policy may import only agent-retry:policy/account-budget, agent-retry:policy/shared-state, agent-retry:policy/types and ' +
      'wasi:random/random): refused, nothing was run',
    refused);
  }
}
