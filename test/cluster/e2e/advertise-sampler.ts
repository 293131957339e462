// What every replica's tailscaled advertises, sampled every --interval-ms, for the end-to-end tier. Run inside
// the cluster's network namespace (the Pods' addresses are reachable there only) by root, who may read any
// tailscaled's prefs: each replica's LocalAPI socket is a file in its Pod's emptyDir under the kubelet's root.
//
//   advertise-sampler.ts --kubectl BIN --kubeconfig FILE --namespace NS --pods-dir DIR --socket-volume NAME
//                        --service svc:X --ca FILE --sni NAME [--port N] [--interval-ms N]
//
// It watches the namespace's Pods (uid and address) and samples until stdin ends. Each tick: the socket of
// every Pod with an address, `GET /localapi/v0/prefs`; for each replica whose AdvertiseServices lists the
// Service, a TLS handshake with its proxy (`<pod IP>:<port>`, the SNI, the chain checked against the CA, the
// name and dates checked as a client does), and when that fails its prefs again: advertised before and after
// a failed handshake is a sample advertised while not served. A tailscaled refusing connections (stopped)
// advertises nothing; one slow to answer (over 2 s) keeps its last state; a tick counts once some Pod's
// prefs were read. At the end one JSON line: every tick's time and count of advertisers, each unserved sample
// (pod, time, the handshake's error), each change of a replica's state, and each change of a replica's whole
// AdvertiseServices list (null while no tailscaled answers: not started yet, or stopped).
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { connect } from 'node:tls';
import { parseArgs } from 'node:util';
import { getJson } from '../../support/emulator.ts';

const { values } = parseArgs({
  options: {
    kubectl: { type: 'string' },
    kubeconfig: { type: 'string' },
    namespace: { type: 'string' },
    'pods-dir': { type: 'string' },
    'socket-volume': { type: 'string' },
    service: { type: 'string' },
    ca: { type: 'string' },
    sni: { type: 'string' },
    port: { type: 'string', default: '8443' },
    'interval-ms': { type: 'string', default: '100' },
  },
});
const podsDir = values['pods-dir'];
const socketVolume = values['socket-volume'];
const { service, sni } = values;
if (!values.kubectl || !values.kubeconfig || !values.namespace || !podsDir || !socketVolume || !service || !values.ca || !sni) {
  console.error('usage: see the comment at the top of advertise-sampler.ts');
  process.exit(2);
}
const ca = await readFile(values.ca, 'utf8');
const port = Number(values.port);
const interval = Number(values['interval-ms']);
/** A busy tailscaled (or this process, cold) may take longer than the interval: its state stays unknown until then. */
const PREFS_TIMEOUT_MS = 2000;

/** The namespace's Pods that have an address, by uid (a deleted Pod stays: its stopped tailscaled refuses). */
const podIps = new Map<string, string>();
const watch = spawn(
  values.kubectl,
  [`--kubeconfig=${values.kubeconfig}`, 'get', 'pods', '-n', values.namespace, '--watch', '-o', 'jsonpath={.metadata.uid} {.status.podIP}{"\\n"}'],
  { stdio: ['ignore', 'pipe', 'inherit'] },
);
createInterface({ input: watch.stdout }).on('line', (line) => {
  const [uid, ip] = line.trim().split(/\s+/);
  if (uid && ip) podIps.set(uid, ip);
});
let stopping = false;
createInterface({ input: process.stdin }).on('close', () => (stopping = true));
process.stdin.resume();

type Advertised = boolean | 'unknown';
/** Each change of a replica's AdvertiseServices (sorted), every Service it lists: who changed what, beyond the one Service. */
const lists: Array<{ pod: string; at: number; services: string[] | null }> = [];
const lastList = new Map<string, string>();
const noteList = (uid: string, services: string[] | null): void => {
  const key = JSON.stringify(services);
  if (lastList.get(uid) !== key) lists.push({ pod: uid, at: Date.now(), services });
  lastList.set(uid, key);
};
/** Why each Pod's last read told nothing (a timeout, an HTTP error), for a Pod never read. */
const lastError = new Map<string, string>();

async function advertises(uid: string, socket: string): Promise<Advertised> {
  try {
    const prefs = await getJson<{ AdvertiseServices?: string[] | null }>(socket, '/localapi/v0/prefs', { signal: AbortSignal.timeout(PREFS_TIMEOUT_MS) });
    noteList(uid, [...(prefs.AdvertiseServices ?? [])].sort());
    return (prefs.AdvertiseServices ?? []).includes(service!);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    lastError.set(uid, code ?? String(err));
    // Refused or gone: no tailscaled behind the socket, nothing advertised through it.
    const gone = code === 'ECONNREFUSED' || code === 'ENOENT';
    if (gone) noteList(uid, null);
    return gone ? false : 'unknown';
  }
}

/** A handshake as a tailnet client would make it: undefined when the proxy served a valid certificate for the name. */
function handshakeError(ip: string): Promise<string | undefined> {
  return new Promise((resolve) => {
    const socket = connect({ host: ip, port, servername: sni, ca, timeout: 5000 }, () => {
      socket.destroy();
      resolve(undefined);
    });
    socket.on('timeout', () => {
      socket.destroy();
      resolve('timeout');
    });
    socket.on('error', (err: NodeJS.ErrnoException) => {
      socket.destroy();
      resolve(err.code ?? err.message);
    });
  });
}

const ticks: Array<[at: number, advertisers: number]> = [];
const unserved: Array<{ pod: string; at: number; error: string }> = [];
const last = new Map<string, boolean>();
/** Each change of a replica's state, for the diagnosis of a gap. */
const changes: Array<{ pod: string; at: number; advertises: boolean }> = [];
const note = (uid: string, advertises: boolean): void => {
  if (last.get(uid) !== advertises) changes.push({ pod: uid, at: Date.now(), advertises });
  last.set(uid, advertises);
};

/**
 * A short link to each Pod's socket: the path under the kubelet's root is longer than a unix socket address
 * may be (108 bytes: connect answers EINVAL); connect follows the link.
 */
const links = await mkdtemp(join(tmpdir(), 'adv-'));
const linked = new Map<string, Promise<string>>();
const socketOf = (uid: string): Promise<string> => {
  let link = linked.get(uid);
  if (!link) {
    const path = join(links, String(linked.size));
    link = symlink(join(podsDir!, uid, 'volumes/kubernetes.io~empty-dir', socketVolume!, 'tailscaled.sock'), path).then(() => path);
    linked.set(uid, link);
  }
  return link;
};

async function sampleOne(uid: string): Promise<void> {
  const socket = await socketOf(uid);
  const before = await advertises(uid, socket);
  if (before !== 'unknown') note(uid, before);
  if (before !== true) return;
  const error = await handshakeError(podIps.get(uid)!);
  if (error === undefined) return;
  const after = await advertises(uid, socket);
  if (after !== 'unknown') note(uid, after);
  if (after === true) unserved.push({ pod: uid, at: Date.now(), error });
}

while (!stopping) {
  const next = performance.now() + interval;
  await Promise.all([...podIps.keys()].map(sampleOne));
  // Until some Pod's prefs were read there is nothing to count.
  if (last.size > 0) ticks.push([Date.now(), [...last.values()].filter(Boolean).length]);
  const wait = next - performance.now();
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
}
watch.kill('SIGKILL');
await rm(links, { recursive: true, force: true });
const neverRead = [...podIps.keys()].filter((uid) => !last.has(uid)).map((uid) => ({ pod: uid, error: lastError.get(uid) }));
console.log(JSON.stringify({ ticks, unserved, changes, lists, neverRead }));
