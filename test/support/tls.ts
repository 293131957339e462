// HTTPS clients for the tests of listeners that follow a certificate pair (the daemon's --tls, the
// injector's --metrics-tls): which certificate a connection negotiated, and a pair written as a kubelet
// updates a mounted Secret.
import { X509Certificate } from 'node:crypto';
import { rename, writeFile } from 'node:fs/promises';
import { type Agent, request } from 'node:https';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';

export interface Answer {
  status: number;
  serial: string;
  socket: TLSSocket;
  reused: boolean;
}

/** GET over `agent` (or a fresh connection), with the serial of the certificate the connection negotiated. */
export function get(url: string, agent: Agent | false): Promise<Answer> {
  return new Promise((resolve, reject) => {
    // The test checks which certificate is served, not who signed it.
    const req = request(url, { agent, rejectUnauthorized: false, timeout: 10_000 }, (res) => {
      // Read now: once the body ends, a kept-alive socket goes back to the agent's pool.
      const socket = res.socket as TLSSocket;
      const answer = { status: res.statusCode!, serial: socket.getPeerCertificate().serialNumber, socket, reused: req.reusedSocket };
      res.resume();
      res.on('end', () => resolve(answer));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

/** Writes the pair as a kubelet updates a mounted Secret: complete files, renamed into place. */
export async function writePair(dir: string, pair: { certPem: string; keyPem: string }): Promise<string> {
  await writeFile(join(dir, '.tls.key.tmp'), pair.keyPem, { mode: 0o600 });
  await writeFile(join(dir, '.tls.crt.tmp'), pair.certPem);
  await rename(join(dir, '.tls.key.tmp'), join(dir, 'tls.key'));
  await rename(join(dir, '.tls.crt.tmp'), join(dir, 'tls.crt'));
  return new X509Certificate(pair.certPem).serialNumber;
}
