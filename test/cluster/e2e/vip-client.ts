// A tailnet client of a Tailscale Service, for the end-to-end tier: a tailscaled outside the cluster
// (E2eCluster.startTailnetClient) opens a new connection to the Service's VIP every N ms through the tailnet and
// makes a TLS handshake with the Service's name as SNI, the chain checked against the test CA; and, every 250 ms,
// which peer carries the VIP in the client's own netmap (its AllowedIPs): where control routes the client's
// connections, and when that moves. What a client of the Service gets, beside what the replicas' prefs say.
import type { Socket } from 'node:net';
import { connect } from 'node:tls';
import { setTimeout as sleep } from 'node:timers/promises';
import { getJson } from '../../support/emulator.ts';
import type { TailnetClient } from '../e2e-cluster.ts';

/** One connection: when it started and ended (epoch ms), and the leaf the handshake got or why there was none. */
export interface VipAttempt {
  start: number;
  end: number;
  serial?: string;
  notBefore?: number;
  notAfter?: number;
  /** Whether the leaf covers the Service's name. */
  nameOk?: boolean;
  /** The chain's or the name's verification error (expired, another issuer, another name); none when valid. */
  authorizationError?: string;
  /** No handshake: the dial or TLS failed. */
  error?: string;
}

/** The peers carrying the VIP in the client's netmap, from `at` on (their node keys; none: no route). */
export interface VipCarriers {
  at: number;
  carriers: string[];
}

const ATTEMPT_TIMEOUT_MS = 5000;

async function attempt(client: TailnetClient, vip: string, sni: string, ca: string): Promise<VipAttempt> {
  const start = Date.now();
  const dial = client.dial(vip, 443);
  const conn = await Promise.race([
    dial,
    sleep(ATTEMPT_TIMEOUT_MS).then(() => {
      dial.then((late) => late.destroy()).catch(() => {});
      throw new Error(`no connection within ${ATTEMPT_TIMEOUT_MS} ms`);
    }),
  ]).catch((err: Error) => err);
  if (conn instanceof Error) return { start, end: Date.now(), error: conn.message };
  // One deadline for the handshake, whatever the socket does (a connection closed before TLS wraps it says nothing).
  return new Promise((resolve) => {
    let settled = false;
    const finish = (outcome: Omit<VipAttempt, 'start' | 'end'>) => {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      tls.destroy();
      (conn as Socket).destroy();
      resolve({ start, end: Date.now(), ...outcome });
    };
    const deadline = setTimeout(() => finish({ error: `no handshake within ${ATTEMPT_TIMEOUT_MS} ms` }), ATTEMPT_TIMEOUT_MS);
    const tls = connect({ socket: conn as Socket, servername: sni, ca, rejectUnauthorized: false }, () => {
      const leaf = tls.getPeerX509Certificate();
      if (!leaf) return finish({ error: 'no certificate' });
      finish({
        serial: leaf.serialNumber.toUpperCase(),
        notBefore: Date.parse(leaf.validFrom),
        notAfter: Date.parse(leaf.validTo),
        nameOk: leaf.checkHost(sni) !== undefined,
        ...(tls.authorized ? {} : { authorizationError: String(tls.authorizationError) }),
      });
    });
    tls.on('error', (err: NodeJS.ErrnoException) => finish({ error: err.code ?? err.message }));
    tls.on('close', () => finish({ error: 'closed before the handshake' }));
  });
}

/** One verified handshake through the VIP, tried every second until one succeeds (control routes it, the host serves). */
export async function reachVip(client: TailnetClient, vip: string, sni: string, ca: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const a = await attempt(client, vip, sni, ca);
    if (a.serial && !a.authorizationError) return;
    if (Date.now() > deadline) throw new Error(`no handshake through the VIP ${vip} within ${timeoutMs} ms: ${JSON.stringify(a)}`);
    await sleep(1000);
  }
}

/** Connections through the VIP every `intervalMs` and the carriers every 250 ms, until stop(). */
export function loopThroughVip(
  client: TailnetClient,
  vip: string,
  sni: string,
  ca: string,
  intervalMs: number,
): { stop(): Promise<{ attempts: VipAttempt[]; carriers: VipCarriers[] }> } {
  let running = true;
  const attempts: VipAttempt[] = [];
  const carriers: VipCarriers[] = [];
  const connections = (async () => {
    while (running) {
      const next = Date.now() + intervalMs;
      attempts.push(await attempt(client, vip, sni, ca));
      await sleep(Math.max(0, next - Date.now()));
    }
  })();
  const route = `${vip}/32`;
  const netmap = (async () => {
    while (running) {
      const next = Date.now() + 250;
      const status = await getJson<{ Peer?: Record<string, { PublicKey: string; AllowedIPs?: string[] }> }>(client.socket, '/localapi/v0/status', {
        signal: AbortSignal.timeout(2000),
      }).catch(() => undefined);
      if (status) {
        const now = Object.values(status.Peer ?? {})
          .filter((p) => p.AllowedIPs?.includes(route))
          .map((p) => p.PublicKey)
          .sort();
        if (carriers.at(-1)?.carriers.join() !== now.join()) carriers.push({ at: Date.now(), carriers: now });
      }
      await sleep(Math.max(0, next - Date.now()));
    }
  })();
  return {
    async stop() {
      running = false;
      await Promise.all([connections, netmap]);
      return { attempts, carriers };
    },
  };
}
