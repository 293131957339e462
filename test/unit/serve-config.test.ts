import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { MAX_SERVE_CONFIG_SERVICES, domainsFromServeConfig, servicesFromServeConfig } from '../../src/localapi/serve-config.ts';

describe('domainsFromServeConfig', () => {
  it('takes HTTPS hosts of Services and TLS-terminating TCP handlers', () => {
    const config = {
      TCP: { '443': { HTTPS: true } },
      Web: { 'node.tailnet.ts.net:443': { Handlers: { '/': { Proxy: 'http://127.0.0.1:8080' } } }, 'node.tailnet.ts.net:8080': {} },
      Services: {
        'svc:web': { TCP: { '443': { HTTPS: true } }, Web: { 'Web.Tailnet.ts.net:443': { Handlers: {} } } },
        'svc:db': { TCP: { '5432': { TCPForward: '10.0.0.1:5432', TerminateTLS: 'db.tailnet.ts.net' } } },
        'svc:plain': { TCP: { '80': { HTTP: true } }, Web: { 'plain.tailnet.ts.net:80': {} } },
      },
    };
    assert.deepEqual(domainsFromServeConfig(JSON.stringify(config)), {
      domains: ['db.tailnet.ts.net', 'node.tailnet.ts.net', 'web.tailnet.ts.net'],
      refused: [],
    });
  });
  it('accepts an empty config', () => {
    assert.deepEqual(domainsFromServeConfig('{}'), { domains: [], refused: [] });
  });
  it('refuses hosts that are not domain names, exactly as --domain does, and keeps the valid ones', () => {
    const hostile = ['../../x', '..', 'a/b', 'x..y.ts.net', `${'a'.repeat(64)}.ts.net`, 'localhost', 'web.ts.net\\..'];
    const config = {
      Web: Object.fromEntries([...hostile, 'ok.tailnet.ts.net'].map((h) => [`${h}:443`, {}])),
      TCP: { '5432': { TerminateTLS: '../etc/passwd' }, '5433': { TerminateTLS: 'DB.Tailnet.ts.net.' } },
    };
    const { domains, refused } = domainsFromServeConfig(JSON.stringify(config));
    assert.deepEqual(domains, ['db.tailnet.ts.net', 'ok.tailnet.ts.net']);
    assert.deepEqual(refused.map((r) => r.name).sort(), [...hostile, '../etc/passwd'].sort());
    for (const r of refused) assert.match(r.reason, /is not a fully qualified domain name: /);
  });
  it('rejects malformed input with a clear error', () => {
    assert.throws(() => domainsFromServeConfig('{"Services": ', 'x.json'), /x\.json: is not valid JSON/);
    assert.throws(() => domainsFromServeConfig('[]'), /must be a JSON object/);
    assert.throws(() => domainsFromServeConfig('{"Services": {"svc:a": {"Web": []}}}'), /"Web" must be an object/);
  });
});

describe('servicesFromServeConfig (--advertise-services serve-config)', () => {
  it("lists the keys of Services, whatever each Service's configuration holds, sorted", () => {
    const config = {
      Web: { 'node.tailnet.ts.net:443': {} },
      Services: { 'svc:web': { Web: { 'web.tailnet.ts.net:443': {} } }, 'svc:db': { TCP: { '5432': { TCPForward: '127.0.0.1:5432' } } }, 'svc:tun': null },
    };
    assert.deepEqual(servicesFromServeConfig(JSON.stringify(config)), { services: ['svc:db', 'svc:tun', 'svc:web'], refused: [] });
    assert.deepEqual(servicesFromServeConfig('{}'), { services: [], refused: [] });
    assert.deepEqual(servicesFromServeConfig('{"Services": {}}'), { services: [], refused: [] });
  });
  it('refuses keys that are no Service name, and keeps the others', () => {
    const bad = ['web', 'svc:', 'svc:Web', 'svc:web_1', 'svc:-web', 'svc:web.tailnet.ts.net', ' svc:web', `svc:${'a'.repeat(64)}`, 'tag:web', '../svc:x'];
    const { services, refused } = servicesFromServeConfig(JSON.stringify({ Services: Object.fromEntries([...bad, 'svc:ok'].map((k) => [k, {}])) }));
    assert.deepEqual(services, ['svc:ok']);
    assert.deepEqual(refused.map((r) => r.name).sort(), [...bad].sort());
    for (const r of refused) assert.match(r.reason, /is not a Tailscale Service name \(svc:<dns-label>, lower case\)/);
  });
  it(`rejects garbage, and more than ${MAX_SERVE_CONFIG_SERVICES} Services, with CERTSHARE_BAD_CONFIG`, () => {
    const many = (n: number) => JSON.stringify({ Services: Object.fromEntries(Array.from({ length: n }, (_, i) => [`svc:s${i}`, {}])) });
    assert.equal(servicesFromServeConfig(many(MAX_SERVE_CONFIG_SERVICES)).services.length, MAX_SERVE_CONFIG_SERVICES);
    const garbage: Array<[string, RegExp]> = [
      ['{"Services": ', /x\.json: is not valid JSON/],
      ['"svc:web"', /x\.json: must be a JSON object/],
      ['{"Services": ["svc:web"]}', /x\.json: "Services" must be an object/],
      ['{"Services": "svc:web"}', /x\.json: "Services" must be an object/],
      [many(MAX_SERVE_CONFIG_SERVICES + 1), /x\.json: 65 Services, more than the 64 certshare advertises/],
    ];
    for (const [text, message] of garbage) {
      assert.throws(() => servicesFromServeConfig(text, 'x.json'), { code: 'CERTSHARE_BAD_CONFIG', message }, text.slice(0, 40));
    }
  });
});
