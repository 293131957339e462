// The shared ledger: one JSON object per line, appended with O_APPEND so several emulator processes
// can write the same file. Lines carry a `kind`:
//   {"kind":"issuance", time, emulator, domain, serial, notBefore, notAfter, trigger}  every real issuance
//   {"kind":"request", time, end, emulator, domain, minValidity, outcome, retryAfterSeconds?, serial?}
//     every cert request (only with --ledger-requests): `time` is when it arrived, `end` when it was
//     answered; `outcome` is the HTTP status, "reset" or "hang"; `serial` is the certificate served.
// Consumers that predate `kind` read issuance lines as before (the fields they used are unchanged),
// and request lines are opt-in so they never see them unasked.
import { appendFile } from 'node:fs/promises';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/logger.ts';

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

export type LedgerLine = LedgerIssuance | LedgerRequest;

export async function appendLedger(path: string, line: LedgerLine, logger: Logger): Promise<void> {
  try {
    // One write per line with O_APPEND: lines from several processes never interleave.
    await appendFile(path, JSON.stringify(line) + '\n', { flag: 'a' });
  } catch (err) {
    logger.error({ ledger: path, err: errorMessage(err) }, 'cannot append to the ledger');
  }
}
