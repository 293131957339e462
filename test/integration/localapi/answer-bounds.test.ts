// LocalAPI answers are read up to what their kind can be (LOCALAPI_ANSWER_BOUNDS: a certificate pair 64 KiB,
// prefs, status and cert domains 1 MiB, a bus line 8 MiB), far below the sidecar's 192Mi: a larger answer is
// an error with a code, the request torn down before the rest is read, and nothing is lost (the last valid
// pair kept and served, the IPN bus reopened).
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { CertshareError } from '../../../src/core/errors.ts';
import { silentLogger } from '../../../src/core/ports/logger.ts';
import { createLocalApiClient, LOCALAPI_ANSWER_BOUNDS } from '../../../src/localapi/client.ts';
import { BusConnection, type Handler, samplePems, sendJson, sendText, startServer } from '../../support/localapi.ts';
import { recordingLogger } from '../../support/recording-logger.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../../support/standalone.ts';
import { nextEvent, onEvent, until } from '../../support/wait.ts';

const never = new AbortController().signal;
const pems = samplePems();

async function withServer(handler: Handler, fn: (address: string) => Promise<void>): Promise<void> {
  const server = await startServer(handler, 'unix');
  try {
    await fn(server.address);
  } finally {
    await server.close();
  }
}

const tooLarge = (bound: number) => (err: unknown) =>
  err instanceof CertshareError && err.code === 'CERTSHARE_LOCALAPI_BAD_RESPONSE' && err.message.includes(`larger than ${bound} bytes`);

describe('LocalAPI answers are bounded by what their kind can be', () => {
  const dir = useTempDir();

  it(`refuses a certificate pair over ${LOCALAPI_ANSWER_BOUNDS.certPair} bytes (a chain that goes on)`, async () => {
    const body = pems.keyPem + pems.chainPem.repeat(Math.ceil(LOCALAPI_ANSWER_BOUNDS.certPair / pems.chainPem.length) + 1);
    await withServer(
      (_req, res) => sendText(res, 200, body),
      async (address) => {
        const client = createLocalApiClient({ address, logger: silentLogger });
        await assert.rejects(client.certPair(DOMAIN, { minValidityMs: 0, signal: never }), tooLarge(LOCALAPI_ANSWER_BOUNDS.certPair));
      },
    );
  });

  it(`refuses prefs and a status over ${LOCALAPI_ANSWER_BOUNDS.json} bytes`, async () => {
    const big = { AdvertiseServices: [], Pad: 'x'.repeat(LOCALAPI_ANSWER_BOUNDS.json) };
    await withServer(
      (_req, res) => sendJson(res, 200, big),
      async (address) => {
        const client = createLocalApiClient({ address, logger: silentLogger });
        await assert.rejects(client.prefs!(never), tooLarge(LOCALAPI_ANSWER_BOUNDS.json));
        await assert.rejects(client.status(never), tooLarge(LOCALAPI_ANSWER_BOUNDS.json));
      },
    );
  });

  it(`ends the IPN bus at a line over ${LOCALAPI_ANSWER_BOUNDS.busLine} bytes with CERTSHARE_BUS_LINE_TOO_LONG`, async () => {
    const line = `{"State":6,"Pad":"${'x'.repeat(LOCALAPI_ANSWER_BOUNDS.busLine)}"}\n`;
    await withServer(
      (req, res) => {
        const conn = new BusConnection(req, res);
        conn.send({ State: 2 });
        conn.sendRaw(line);
        conn.end();
      },
      async (address) => {
        const got: unknown[] = [];
        const client = createLocalApiClient({ address, logger: silentLogger });
        await assert.rejects(
          (async () => {
            for await (const n of client.watchIpnBus(2, never)) got.push(n);
          })(),
          (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_BUS_LINE_TOO_LONG',
        );
        assert.deepEqual(got, [{ State: 2 }]);
      },
    );
  });

  it('keeps and serves the last valid pair when a renewal answers an oversized pair, and renews once the answers fit', async () => {
    const { logger, entries, events } = recordingLogger();
    // 30 s certificates: renewed at half their lifetime, and still far from their readiness lead when the
    // refusal is seen on a loaded machine (6 s ones were inside it, and /healthz rightly said so).
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'pair.sock'), certLifetimeMs: 30_000 });
    const certDir = join(dir(), 'pair-store');
    const daemon = await standaloneDaemon(emulator, certDir, [], logger);
    const serial = async (): Promise<string> => new X509Certificate(await readFile(join(certDir, DOMAIN, 'tls.crt'))).serialNumber;
    try {
      await nextEvent(daemon.events, 'filesWritten', () => true, 20_000);
      const first = await serial();
      emulator.injectFault({ target: 'cert', kind: 'huge_pair', count: 'always' });
      const refused = () => entries.some((e) => String(e.err ?? '').includes(`larger than ${LOCALAPI_ANSWER_BOUNDS.certPair} bytes`));
      await until('a renewal answered with an oversized pair', refused, [onEvent(events, 'entry')], 60_000);
      assert.equal(await serial(), first, 'the files still hold the last valid pair');
      assert.equal(daemon.health.evaluate(Date.now()).healthy, true, 'still serving it');
      const logged = entries.find((e) => String(e.err ?? '').includes('larger than'));
      assert.equal(logged?.code, 'CERTSHARE_LOCALAPI_BAD_RESPONSE', JSON.stringify(logged));
      emulator.clearFaults();
      await nextEvent(daemon.events, 'filesWritten', () => true, 60_000);
      assert.notEqual(await serial(), first, 'renewed once the answers fit');
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });
});
