import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { FailureStreak, retryDelay } from '../../src/core/issuance/backoff.ts';
import { CertshareError } from '../../src/core/errors.ts';
import { classifyIssuanceFailure } from '../../src/core/issuance/failure.ts';
import { LocalApiError } from '../../src/core/ports/localapi.ts';

const MIN = 60_000;
const HOUR = 60 * MIN;
const policy = { firstRetryMs: MIN, retryCapMs: 24 * HOUR, rateLimitFirstRetryMs: HOUR };
const ACME = '429 urn:ietf:params:acme:error:rateLimited: too many certificates (5) already issued for this exact set of domains in the last 168h0m0s';

describe('classifyIssuanceFailure', () => {
  it('reads a 429 with Retry-After as an exact rate limit', () => {
    const f = classifyIssuanceFailure(
      new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'cert failed' }, { status: 429, body: ACME, retryAfterMs: 3_600_000 }),
    );
    assert.deepEqual([f.kind, f.retryAfterMs], ['rate_limited', 3_600_000]);
  });
  it('reads an ACME rate-limit text in a 500 as rate limited (older tailscaled)', () => {
    assert.equal(
      classifyIssuanceFailure(new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'cert failed' }, { status: 500, body: ACME })).kind,
      'rate_limited',
    );
  });
  it('separates transport failures, invalid domains, rejected pairs and other errors', () => {
    assert.equal(classifyIssuanceFailure(new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'ECONNREFUSED' }, {})).kind, 'transient');
    assert.equal(classifyIssuanceFailure(new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'timeout' }, { timedOut: true })).kind, 'transient');
    assert.equal(
      classifyIssuanceFailure(
        new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'x' }, { status: 500, body: 'invalid domain "x"; must be one of ["a"]' }),
      ).kind,
      'invalid_domain',
    );
    assert.equal(
      classifyIssuanceFailure(new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'x' }, { status: 403, body: 'cert access denied' })).kind,
      'error',
    );
    assert.equal(classifyIssuanceFailure(new CertshareError('CERTSHARE_CERT_INVALID', { certificate: 'certificate', reason: 'bad' })).kind, 'rejected');
    assert.equal(classifyIssuanceFailure(new Error('boom')).kind, 'error');
  });
});

describe('retryDelay', () => {
  it('doubles from the first retry up to the cap', () => {
    const error = { kind: 'error' as const, message: '' };
    const delays = [1, 2, 3, 4, 11, 12, 50].map((n) => retryDelay(error, n, policy));
    assert.deepEqual(delays, [MIN, 2 * MIN, 4 * MIN, 8 * MIN, 1024 * MIN, 24 * HOUR, 24 * HOUR]);
  });
  it('waits exactly Retry-After, and starts at an hour without one', () => {
    assert.equal(retryDelay({ kind: 'rate_limited', retryAfterMs: 1234_000, message: '' }, 7, policy), 1234_000);
    assert.deepEqual(
      [1, 2, 6].map((n) => retryDelay({ kind: 'rate_limited', message: '' }, n, policy)),
      [HOUR, 2 * HOUR, 24 * HOUR],
    );
  });
  it('keeps transient retries soon', () => {
    assert.deepEqual(
      [1, 2, 10].map((n) => retryDelay({ kind: 'transient', message: '' }, n, policy)),
      [MIN, 2 * MIN, 8 * MIN],
    );
  });
  it('counts streaks per kind', () => {
    const streak = new FailureStreak();
    assert.equal(streak.record('rate_limited'), 1);
    assert.equal(streak.record('transient'), 1);
    assert.equal(streak.record('rate_limited'), 2);
    streak.reset();
    assert.equal(streak.record('rate_limited'), 1);
  });
});

describe('classifyIssuanceFailure on malformed answers', () => {
  it('treats a 200 with an unusable body as a rejection, not a transport failure', () => {
    const err = Object.assign(new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'bad pair' }, {}), { code: 'CERTSHARE_LOCALAPI_BAD_RESPONSE' });
    assert.equal(classifyIssuanceFailure(err).kind, 'rejected');
  });
});
