import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { domainsFromServeConfig } from '../../src/config/serve-config.ts';

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
    assert.deepEqual(domainsFromServeConfig(JSON.stringify(config)), ['db.tailnet.ts.net', 'node.tailnet.ts.net', 'web.tailnet.ts.net']);
  });
  it('accepts an empty config', () => {
    assert.deepEqual(domainsFromServeConfig('{}'), []);
  });
  it('rejects malformed input with a clear error', () => {
    assert.throws(() => domainsFromServeConfig('{"Services": ', 'x.json'), /x\.json is not valid JSON/);
    assert.throws(() => domainsFromServeConfig('[]'), /must be a JSON object/);
    assert.throws(() => domainsFromServeConfig('{"Services": {"svc:a": {"Web": []}}}'), /"Web" must be an object/);
  });
});
