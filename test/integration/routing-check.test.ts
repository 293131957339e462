// The routing check against a health endpoint standing in for a Service: each request is answered by a
// random one of `endpoints` Pods (as kube-proxy picks an endpoint per new connection).
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, describe, it } from 'node:test';
import { systemClock } from '../../src/core/ports/clock.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { until } from '../support/wait.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { checkRouting, lookupOnce } from '../../src/kube/routing-check.ts';
import { ROUTING_PROOF_HEADER } from '../../src/core/ports/routing-proof-source.ts';
import { RoutingProofs } from '../../src/http/routing-proof.ts';

const OWN = '10.201.0.10';

async function service(
  answer: (req: IncomingMessage) => { status?: number; ip: string | undefined; delayMs?: number; heldUntil?: Promise<void> },
): Promise<{ url: string; server: Server; requests: () => number }> {
  let requests = 0;
  const server = createServer((req, res) => {
    requests++;
    const { status = 200, ip, delayMs = 0, heldUntil = Promise.resolve() } = answer(req);
    if (ip) res.setHeader('Pod-IPv4', ip);
    res.statusCode = status;
    // A slow endpoint (a Pod starting on a busy node) answers late, or not before the caller gave up.
    let timer: NodeJS.Timeout | undefined;
    void heldUntil.then(() => {
      if (!res.destroyed) timer = setTimeout(() => res.end('ok'), delayMs);
    });
    res.on('close', () => clearTimeout(timer));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/healthz`, server, requests: () => requests };
}

/** n endpoints, this Pod one of them when `includesOwn`. */
const endpoints = (n: number, includesOwn = true) => {
  const ips = Array.from({ length: n }, (_, i) => (includesOwn && i === 0 ? OWN : `10.201.0.${100 + i}`));
  return () => ({ ip: ips[Math.floor(Math.random() * ips.length)] });
};

const options = { ownIPv4: OWN, probesPerRound: 9, timeoutMs: 2000, roundDelayMs: 20, patienceMs: 10_000 };

/**
 * A check whose pauses and patience run on a fake clock, moved to the end of a pause only once every call opened
 * so far has ended, its answer counted: rounds follow one another as on an idle machine, however loaded this one
 * is (on the wall clock, rounds started before any answer came back counted time, not misses).
 */
async function paced(url: string, given: Parameters<typeof checkRouting>[1]): ReturnType<typeof checkRouting> {
  const clock = new FakeClock();
  let open = 0;
  const listeners = new Set<() => void>();
  const changed = (listener: () => void) => {
    listeners.add(listener);
    return () => listeners.delete(listener);
  };
  const tell = () => {
    for (const listener of listeners) listener();
  };
  let done = false;
  const onCall = (ended: boolean) => {
    open += ended ? -1 : 1;
    tell();
  };
  const checking = checkRouting(url, { ...given, clock, onCall }).finally(() => {
    done = true;
    tell();
  });
  for (;;) {
    // Bounded by the test's timeout: how long the calls take is the machine's business.
    await until('every call ended, a pause begun', () => done || (open === 0 && clock.pendingSleeps() > 0), [changed, (l) => clock.onSleep(l)], 2 ** 31 - 1);
    if (done) return checking;
    await clock.advance(clock.nextDueIn()!);
  }
}

describe('routing check', () => {
  const servers: Server[] = [];
  after(() => {
    for (const s of servers) s.close();
  });

  it('finds this Pod behind 10 endpoints in a few parallel rounds', async () => {
    const rounds: number[] = [];
    for (let i = 0; i < 30; i++) {
      const svc = await service(endpoints(10));
      servers.push(svc.server);
      const outcome = await paced(svc.url, options);
      assert.equal(outcome.verdict, 'routed');
      assert.ok(svc.requests() <= outcome.probes, 'calls counted (those cut once the route was proven may never arrive)');
      rounds.push(outcome.rounds);
    }
    // A round at 10 endpoints misses with 0.9^9 = 39% at its smallest (before answers grew it to 30 calls,
    // 4%); the bound assumes the worst, 39% each: 12 misses in a row over 30 checks is 3.6e-4 likely.
    assert.ok(Math.max(...rounds) <= 12, `rounds over 30 checks: ${rounds.join(',')}`);
  });

  it('does not wait for slow endpoints: an answer from this Pod settles the check while slower calls are still open', async () => {
    // Every tenth call reaches this Pod, which answers at once; the other Pods answer only once the check is over.
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const svc = await service(() => (svc.requests() % 10 === 5 ? { ip: OWN } : { ip: '10.201.0.150', heldUntil: released }));
    servers.push(svc.server);
    // Calls that would wait for the slow answers (no timeout to end them) hold the check until the test times out.
    const outcome = await checkRouting(svc.url, { ...options, timeoutMs: 2 ** 31 - 1 }).finally(release);
    assert.deepEqual([outcome.verdict, outcome.provenBy], ['routed', 'answer']);
  });

  it('answers not-routed only after its patience, never after one unlucky round; rounds grow to 3 x the endpoints seen', async () => {
    const svc = await service(endpoints(3, false));
    servers.push(svc.server);
    const outcome = await paced(svc.url, { ...options, patienceMs: 300 });
    assert.equal(outcome.verdict, 'not-routed');
    assert.equal(outcome.rounds, 300 / options.roundDelayMs, 'a round per pause until its patience was over');
    assert.equal(outcome.endpointsSeen, 3);
    const ten = await service(endpoints(10, false));
    servers.push(ten.server);
    // 10 rounds: every endpoint answers some call (10 x 0.9^250 likely not).
    const grown = await paced(ten.url, { ...options, patienceMs: 200 });
    assert.equal(grown.endpointsSeen, 10);
    assert.ok(grown.probes > 9 * grown.rounds, `rounds grew to 3 x the endpoints seen: ${JSON.stringify(grown)}`);
  });

  it('answers not-routed only after three rounds, even when the node stalls past its patience in the first', async () => {
    const svc = await service(endpoints(3, false));
    servers.push(svc.server);
    const pending = checkRouting(svc.url, { ...options, patienceMs: 50 });
    // The process descheduled (a loaded node): the first round ends after the patience is over.
    const stalledUntil = performance.now() + 200;
    while (performance.now() < stalledUntil);
    const outcome = await pending;
    assert.equal(outcome.verdict, 'not-routed');
    assert.ok(outcome.rounds >= 3, `rounds: ${outcome.rounds}`);
  });

  it('answers not-routed only once the calls of three rounds have ended: a call still open is no miss', async () => {
    // Every answer held (a loaded node that has not read them yet) until a fourth round's first call arrives,
    // or the check is over. Three rounds of calls none of which came back are no evidence: the check goes on.
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const other = endpoints(3, false);
    const svc = await service(() => {
      if (svc.requests() > 3 * options.probesPerRound) release();
      return { ...other(), heldUntil: released };
    });
    servers.push(svc.server);
    const outcome = await checkRouting(svc.url, { ...options, timeoutMs: 10_000, patienceMs: 0 }).finally(release);
    assert.equal(outcome.verdict, 'not-routed');
    assert.ok(outcome.rounds > 3 && outcome.endpointsSeen > 0, `a verdict from answers: ${JSON.stringify(outcome)}`);
  });

  it('counts failed calls and errors as misses, and a 200 without Pod-IPv4 as unverifiable', async () => {
    let calls = 0;
    const flaky = await service(() => (++calls <= 12 ? { status: 503, ip: OWN } : { ip: OWN }));
    servers.push(flaky.server);
    assert.equal((await paced(flaky.url, options)).verdict, 'routed', 'a 503 from this Pod is not proof; a later 200 is');
    const anonymous = await service(() => ({ ip: undefined }));
    servers.push(anonymous.server);
    assert.equal((await checkRouting(anonymous.url, options)).verdict, 'unverifiable');
    assert.equal((await checkRouting('http://127.0.0.1:1/healthz', { ...options, patienceMs: 100 })).verdict, 'not-routed', 'nothing listening');
  });

  it("is settled by a group's call that reached this Pod, whatever the answers say; a stranger's call proves nothing", async () => {
    const proofs = (keyPem: string): RoutingProofs => {
      const p = new RoutingProofs(systemClock);
      p.certificate('proxy.example', { pair: { keyPem, certPem: '' }, info: {} as StoredCert['info'] });
      return p;
    };
    const key = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ format: 'pem', type: 'pkcs8' }).toString();
    const own = proofs(key);
    const peer = proofs(key);
    // Every call lands on a third Pod, slowly: this Pod's own calls never come back with its address.
    // Once the third Pod has received a call of this Pod (and checked its proof), another replica's call
    // reaches this Pod through the Service (the test delivers it).
    let signedByOwn = 0;
    const svc = await service((req) => {
      if (peer.received(req.headers[ROUTING_PROOF_HEADER]) && ++signedByOwn === 1) own.received(peer.sign(svc.url));
      return { ip: '10.201.0.200', delayMs: 5_000 };
    });
    servers.push(svc.server);
    const listening = peer.onProof(svc.url, () => {});
    const outcome = await checkRouting(svc.url, { ...options, timeoutMs: 500, patienceMs: 10_000, proofs: own });
    listening();
    assert.deepEqual([outcome.verdict, outcome.provenBy], ['routed', 'call received']);
    assert.ok(signedByOwn > 0, "this Pod's calls carry a proof the group accepts");

    const stranger = proofs(generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ format: 'pem', type: 'pkcs8' }).toString());
    const refused = checkRouting(svc.url, { ...options, timeoutMs: 200, patienceMs: 300, proofs: own });
    setImmediate(() => own.received(stranger.sign(svc.url)));
    assert.equal((await refused).verdict, 'not-routed');
  });

  it('asks the resolver once per check for the Service name, not once per call; a failed answer is not kept', async () => {
    let asked = 0;
    let fail = true;
    const resolver = ((_host: string, _options: object, callback: (err: Error | null, addresses: { address: string; family: number }[]) => void) => {
      asked++;
      setImmediate(() => (fail ? callback(new Error('SERVFAIL'), []) : callback(null, [{ address: '127.0.0.1', family: 4 }])));
    }) as unknown as Parameters<typeof lookupOnce>[0];
    const lookup = lookupOnce(resolver);
    const one = (all: boolean) =>
      new Promise<unknown>((resolve) => lookup('proxy-health', { all }, (err, address, family) => resolve(err ? err.message : [address, family])));
    assert.equal(await one(false), 'SERVFAIL');
    fail = false;
    assert.deepEqual(await one(false), ['127.0.0.1', 4]);
    assert.deepEqual(await one(true), [[{ address: '127.0.0.1', family: 4 }], undefined]);
    assert.deepEqual(await one(false), ['127.0.0.1', 4]);
    assert.equal(asked, 2, 'the failure, then one answer kept');
    // And through node:http, by name: the check finds this Pod as by address.
    const svc = await service(endpoints(1));
    servers.push(svc.server);
    assert.equal((await checkRouting(svc.url.replace('127.0.0.1', 'localhost'), options)).verdict, 'routed');
  });

  it('stops at once when its signal aborts', async () => {
    const svc = await service(endpoints(3, false));
    servers.push(svc.server);
    const controller = new AbortController();
    const checking = checkRouting(svc.url, { ...options, signal: controller.signal });
    setImmediate(() => controller.abort(new Error('stopping')));
    await assert.rejects(checking);
  });
});
