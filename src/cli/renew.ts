// `certshare renew <domain>`: one renew request on the domain's Secret (src/kube/renew-request.ts), and with
// --wait the writer's answer. Exit 0: requested (or, with --wait, served); 1: refused or no answer in time.
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { newRenewRequestId } from '../core/renew-request.ts';
import { parseFlags, usage } from '../flags/flags.ts';
import { RENEW_FLAGS, RENEW_SUMMARY, renewOptionsFrom } from '../config/renew-options.ts';

/** How often --wait looks at the Secret's answer (one empty patch each). */
const WAIT_POLL_MS = 2000;

export async function renewCommand(argv: string[]): Promise<number> {
  const [first, ...rest] = argv;
  const values = parseFlags(RENEW_FLAGS, first?.startsWith('-') ? argv : rest, process.env);
  if (values.help) {
    console.log(usage('renew <domain>', RENEW_SUMMARY, RENEW_FLAGS));
    return 0;
  }
  const options = renewOptionsFrom(first, values);
  const { connectKube } = await import('../kube/connection.ts');
  const { renewAnswer, requestRenewal } = await import('../kube/renew-request.ts');
  const env = options.namespace === undefined ? process.env : { ...process.env, POD_NAMESPACE: options.namespace };
  const connection = await connectKube(env);
  try {
    const id = newRenewRequestId(Date.now(), randomBytes(4).toString('hex'));
    const result = await requestRenewal(connection, options.domain, id);
    const where = `Secret ${connection.namespace}/${options.domain}`;
    console.log(
      result.kind === 'requested'
        ? `renew request ${result.id} written on ${where}`
        : `renew request ${result.id} is already pending on ${where}: it stands (one request, not two)`,
    );
    if (options.waitMs === 0) return 0;
    const deadline = Date.now() + options.waitMs;
    for (;;) {
      const answer = await renewAnswer(connection, options.domain);
      if (answer.id === result.id) {
        console.log(`${options.domain}: ${answer.outcome ?? 'answered'}`);
        return answer.outcome?.startsWith('issued') ? 0 : 1;
      }
      if (Date.now() >= deadline) {
        console.error(`${options.domain}: no answer from the writer within --wait; the request stays pending`);
        return 1;
      }
      await sleep(Math.min(WAIT_POLL_MS, Math.max(0, deadline - Date.now())));
    }
  } finally {
    connection.close();
  }
}
