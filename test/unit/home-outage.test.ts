// Which failed calls to the federation home are an outage (the safety point and break-glass answer them) and
// which are not (a refusal, an unknown object, an answer that is not the API's): src/kube/home-check.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CertshareError, errorMessage } from '../../src/core/errors.ts';
import { isHomeOutage } from '../../src/kube/home-check.ts';

const sys = (code: string): Error => Object.assign(new Error(code), { code });
const status = (code: number): Error => Object.assign(new Error(`HTTP ${code}`), { code });
const unavailable = (cause: unknown): CertshareError =>
  new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action: 'read', object: 'Secret', cause: errorMessage(cause) }, { cause });

describe('isHomeOutage', () => {
  it('an unreachable or failing home is an outage, also wrapped by the store', () => {
    for (const err of [
      sys('ECONNREFUSED'),
      sys('ECONNRESET'),
      sys('ETIMEDOUT'),
      // A stream reset by a proxy in front of the home (Node's message: Stream closed with error code NGHTTP2_INTERNAL_ERROR).
      sys('ERR_HTTP2_STREAM_ERROR'),
      sys('ERR_HTTP2_SESSION_ERROR'),
      sys('ERR_HTTP2_GOAWAY_SESSION'),
      status(503),
      status(500),
      status(429),
      new CertshareError('CERTSHARE_KUBE_TIMEOUT', { request: 'GET /api', within: '10000 ms' }),
      new CertshareError('CERTSHARE_KUBE_CONNECTION_LOST', { channel: 'stream', when: 'mid-answer (reset)' }),
      new AggregateError([sys('ECONNREFUSED'), sys('ECONNREFUSED')]),
    ]) {
      assert.equal(isHomeOutage(err), true, err.message);
      assert.equal(isHomeOutage(unavailable(err)), true, `wrapped ${err.message}`);
    }
  });

  it('a refusal, an unknown object, a conflict or garbage is never an outage: no member issues on its account', () => {
    for (const err of [
      status(401),
      status(403),
      status(404),
      status(409),
      status(400),
      new SyntaxError('Unexpected token <'),
      new Error('no code'),
      undefined,
    ]) {
      assert.equal(isHomeOutage(err), false, String(err));
      assert.equal(isHomeOutage(unavailable(err)), false, `wrapped ${String(err)}`);
    }
  });
});
