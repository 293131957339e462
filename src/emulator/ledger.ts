// The shared ledger: one JSON object per line, appended with O_APPEND so several emulator processes
// can write the same file. By default one line per real issuance, exactly as it always was:
//   {time, emulator, domain, serial, notBefore, notAfter}
// With --ledger-requests (EmulatorOptions.ledgerRequests) lines carry a `kind`:
//   {"kind":"issuance", time, emulator, domain, serial, notBefore, notAfter, trigger}  every real issuance
//   {"kind":"request", time, end, emulator, domain, minValidity, outcome, retryAfterSeconds?, serial?}
//     every cert request: `time` is when it arrived, `end` when it was answered (or given up on);
//     `outcome` is the HTTP status, "reset", "hang" or "aborted"; `serial` is the certificate served.
// Old consumers never see the new format unless they ask for it; a reader of the new format treats a
// line without `kind` as an issuance.
import { appendFile } from 'node:fs/promises';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';

/** @forTests */
export interface LedgerIssuance {
  kind: 'issuance';
  time: string;
  emulator: string;
  domain: string;
  serial: string;
  notBefore: string;
  notAfter: string;
  trigger: 'request' | 'background';
}

export interface LedgerRequest {
  kind: 'request';
  time: string;
  end: string;
  emulator: string;
  domain: string;
  /** The min_validity query parameter as sent ("" when absent). */
  minValidity: string;
  /** "200", "429", "500"..., "reset" or "hang". */
  outcome: string;
  retryAfterSeconds?: number;
  serial?: string;
}

/** The original issuance line (no `kind`, no `trigger`). */
type LedgerIssuanceV1 = Omit<LedgerIssuance, 'kind' | 'trigger'>;

/** @forTests */
export type LedgerLine = LedgerIssuance | LedgerRequest | LedgerIssuanceV1;

export async function appendLedger(path: string, line: LedgerLine, logger: Logger): Promise<void> {
  try {
    // One write per line with O_APPEND: lines from several processes never interleave.
    await appendFile(path, `${JSON.stringify(line)}\n`, { flag: 'a' });
  } catch (err) {
    logger.error({ ledger: path, err: errorMessage(err) }, 'cannot append to the ledger');
  }
}
