import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { normalizeDomain, partitionDomains } from '../../src/core/certificates/domain.ts';
import { podAddressesFromEnv } from '../../src/core/values/pod-addresses.ts';

describe('normalizeDomain: the one domain check of every door', () => {
  const accepted: Array<[string, string]> = [
    ['web.tailnet-1234.ts.net', 'web.tailnet-1234.ts.net'],
    ['WEB.Tailnet-1234.TS.net', 'web.tailnet-1234.ts.net'],
    ['web.tailnet-1234.ts.net.', 'web.tailnet-1234.ts.net'],
    ['  web.example.com ', 'web.example.com'],
    ['*.example.com', '*.example.com'],
    ['xn--bcher-kva.example', 'xn--bcher-kva.example'],
    [`${'a'.repeat(63)}.example.com`, `${'a'.repeat(63)}.example.com`],
  ];
  for (const [input, canonical] of accepted) {
    it(`accepts ${JSON.stringify(input)} as ${canonical}`, () => assert.equal(normalizeDomain(input), canonical));
  }
  const refused: Array<[string, RegExp]> = [
    ['', /empty/],
    ['.', /empty/],
    ['..', /empty label/],
    ['../../x', /empty label|label/],
    ['../etc', /label "\.\." |empty label/],
    ['a/b.example.com', /label "a\/b"/],
    ['a\\b.example.com', /label/],
    ['localhost', /at least two labels/],
    ['web.example.com..', /empty label/],
    ['.web.example.com', /empty label/],
    ['-web.example.com', /label "-web"/],
    ['web-.example.com', /label "web-"/],
    ['we b.example.com', /label "we b"/],
    ['web.example.com:443', /label "com:443"/],
    ['a.*.example.com', /label "\*"/],
    ['*', /at least two labels/],
    [`${'a'.repeat(64)}.example.com`, /label of 64 characters, at most 63/],
    [`${'a.'.repeat(127)}com`, /257 characters, at most 253/],
    ['wéb.example.com', /label "wéb"/],
  ];
  for (const [input, why] of refused) {
    it(`refuses ${JSON.stringify(input)}`, () => {
      assert.throws(
        () => normalizeDomain(input),
        (err: Error & { code?: string }) => {
          assert.equal(err.code, 'CERTSHARE_BAD_DOMAIN');
          assert.match(err.message, /is not a fully qualified domain name/);
          assert.match(err.message, why);
          return true;
        },
      );
    });
  }
  it('partitions a list into canonical valid names and refused ones', () => {
    const { domains, refused } = partitionDomains(['b.example.com', '../../x', 'B.example.com.', 'a.example.com']);
    assert.deepEqual(domains, ['a.example.com', 'b.example.com']);
    assert.deepEqual(
      refused.map((r) => r.name),
      ['../../x'],
    );
  });
});

describe('podAddressesFromEnv: the one POD_IPS parser', () => {
  const cases: Array<[NodeJS.ProcessEnv, { ipv4?: string; ipv6?: string; invalid?: string[] }]> = [
    [{}, {}],
    [{ POD_IPS: '10.0.0.7' }, { ipv4: '10.0.0.7' }],
    [{ POD_IPS: 'fd00::7, 10.0.0.7' }, { ipv4: '10.0.0.7', ipv6: 'fd00::7' }],
    [{ POD_IP: '10.0.0.8' }, { ipv4: '10.0.0.8' }],
    [{ POD_IPS: '', POD_IP: '10.0.0.8' }, { ipv4: '10.0.0.8' }],
    [{ POD_IPS: '10.0.0.300' }, { invalid: ['10.0.0.300'] }],
    [{ POD_IPS: '10.0.0.7,status.podIPs' }, { ipv4: '10.0.0.7', invalid: ['status.podIPs'] }],
    [{ POD_IPS: '::ffff:zz' }, { invalid: ['::ffff:zz'] }],
  ];
  for (const [env, want] of cases) {
    it(JSON.stringify(env), () => assert.deepEqual(podAddressesFromEnv(env), { ipv4: want.ipv4, ipv6: want.ipv6, invalid: want.invalid ?? [] }));
  }
});
