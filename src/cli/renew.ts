// `certshare renew <domain>`: one renew request, on the domain's Secret (src/kube/secret-renew-request.ts) or in the
// standalone store directory (src/store/dir-store.ts), and with --wait the writer's answer. Exit 0: requested
// (or, with --wait, served); 1: refused or no answer in time.
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { newRenewRequestId } from '../core/renewal/renew-request.ts';
import { commandUsage, parseFlags } from '../flags/flags.ts';
import { RENEW_FLAGS, RENEW_HELP, renewOptionsFrom, type RenewOptions } from '../config/renew-options.ts';

/** How often --wait looks at the answer (one empty patch of the Secret, or one file read). */
const WAIT_POLL_MS = 2000;

interface RequestTarget {
  where: string;
  request(id: string): Promise<{ kind: 'requested' | 'pending'; id: string; last?: string | undefined }>;
  answer(): Promise<{ id?: string | undefined; outcome?: string | undefined }>;
  close(): void;
}

async function target(options: RenewOptions): Promise<RequestTarget> {
  if (options.store.kind === 'dir') {
    const root = options.store.path;
    const { renewAnswerInDir, requestRenewalInDir } = await import('../store/dir-store.ts');
    return {
      where: `the store directory ${root}`,
      request: (id) => requestRenewalInDir(root, options.domain, id),
      answer: () => renewAnswerInDir(root, options.domain),
      close: () => {},
    };
  }
  const { connectKube } = await import('../kube/connection.ts');
  const { renewAnswer, requestRenewal } = await import('../kube/secret-renew-request.ts');
  const env = options.namespace === undefined ? process.env : { ...process.env, POD_NAMESPACE: options.namespace };
  const connection = await connectKube(env, { anyKubeconfig: true });
  return {
    where: `Secret ${connection.namespace}/${options.domain}`,
    request: (id) => requestRenewal(connection, options.domain, id),
    answer: () => renewAnswer(connection, options.domain),
    close: () => connection.close(),
  };
}

export async function renewCommand(argv: string[]): Promise<number> {
  const [first, ...rest] = argv;
  const values = parseFlags(RENEW_FLAGS, first?.startsWith('-') ? argv : rest, process.env);
  if (values.help) {
    console.log(commandUsage(RENEW_HELP));
    return 0;
  }
  const options = renewOptionsFrom(first, values);
  const t = await target(options);
  try {
    const result = await t.request(newRenewRequestId(Date.now(), randomBytes(4).toString('hex')));
    console.log(
      result.kind === 'requested'
        ? `renew request ${result.id} written on ${t.where}`
        : `renew request ${result.id} is already pending on ${t.where}: it stands (one request, not two)`,
    );
    if (result.kind === 'requested' && result.last) console.log(`the last request's answer: ${result.last}`);
    if (options.waitMs === 0) return 0;
    const deadline = Date.now() + options.waitMs;
    for (;;) {
      const answer = await t.answer();
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
    t.close();
  }
}
