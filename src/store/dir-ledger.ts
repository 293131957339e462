import { createHash } from 'node:crypto';
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { decodeLedger, encodeLedger, type LedgerEntry, type LedgerSnapshot, type LedgerStore } from '../core/issuance/issuance-budget.ts';
import { writeFileAtomically } from './atomic-file.ts';

const FILE = 'ledger.json';

/**
 * The issuance budget's ledger standalone: `<store>/.state/ledger.json`, replaced atomically (fsync, rename)
 * like the per-domain state, so a restart keeps every slot taken. The version is a hash of the file's
 * bytes: a write checks that the file is still what was read (one writer per directory is the rule; the
 * check catches a second process pointed at the same directory).
 */
export class DirLedgerStore implements LedgerStore {
  readonly kind = 'dir';
  readonly #dir: string;

  constructor(storeRoot: string) {
    this.#dir = join(storeRoot, '.state');
  }

  get path(): string {
    return join(this.#dir, FILE);
  }

  async read(): Promise<LedgerSnapshot> {
    let text: string;
    try {
      text = await readFile(this.path, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { entries: [], version: undefined };
      throw new CertshareError(
        'CERTSHARE_STORE_UNAVAILABLE',
        { action: 'read', object: `the issuance ledger ${this.path}`, cause: errorMessage(err) },
        { cause: err },
      );
    }
    return { entries: decodeLedger(text, this.path), version: versionOf(text) };
  }

  async write(entries: LedgerEntry[], previous: LedgerSnapshot): Promise<void> {
    const current = await this.read();
    if (current.version !== previous.version)
      throw new CertshareError('CERTSHARE_STORE_CONFLICT', { object: `issuance ledger ${this.path}`, detail: 'its version is not the one read' });
    await mkdir(this.#dir, { recursive: true, mode: 0o700 });
    await writeFileAtomically(this.#dir, FILE, encodeLedger(entries), 0o600);
  }
}

function versionOf(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}
