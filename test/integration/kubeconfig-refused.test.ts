// A kubeconfig certshare loads from a file (KUBECONFIG, --federation-kubeconfig; the daemon's and the
// injector's) carries a server, its CA and an inline token or client certificate, nothing else: an exec
// plugin, an auth provider, a file path or any other field is refused at start with
// CERTSHARE_KUBECONFIG_REFUSED, before client-node sees the file and before any request.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { connectKube } from '../../src/kube/connection.ts';
import { MAX_KUBECONFIG_BYTES } from '../../src/kube/kubeconfig-file.ts';
import { makePair, DAY } from '../support/certs.ts';
import { execKubeconfig, runStartupCase, STARTUP_FAILURES, type StartupCase } from '../support/startup-failures.ts';
import { useTempDir } from '../support/standalone.ts';

const BIN = fileURLToPath(new URL('../../bin/certshare.js', import.meta.url));
const MODULES_LOADED = fileURLToPath(new URL('../fixtures/modules-loaded.ts', import.meta.url));

describe('a kubeconfig with anything but inline credentials is refused at start', () => {
  const dir = useTempDir();

  for (const c of STARTUP_FAILURES.filter((s) => s.name.includes('exec credential plugin'))) {
    it(`${c.name}: the daemon exits 1 with CERTSHARE_KUBECONFIG_REFUSED, the plugin never ran, the client never loaded`, async () => {
      const caseDir = join(dir(), c.name.replace(/\W+/g, '-'));
      await mkdir(caseDir);
      const run = await runStartupCase([process.execPath, '--import', MODULES_LOADED, BIN, 'run'], c, caseDir, 15_000);
      assert.equal(existsSync(join(caseDir, 'exec-ran')), false, 'the exec plugin ran');
      assert.equal(run.code, 1, `exit code; stderr: ${run.stderr}`);
      assert.match(run.stderr, c.stderr);
      // Refused as fast as a bad flag: before the Kubernetes backend (its client) and the federation's code load.
      const loaded = await readFile(join(caseDir, 'modules-loaded'), 'utf8');
      assert.match(loaded, /kube-mode|chunks\//, 'the hook saw the modules');
      assert.doesNotMatch(loaded, /kube-backend|federation-home/);
    });
  }

  it('the injector with an exec credential plugin in KUBECONFIG: exits 1 with CERTSHARE_KUBECONFIG_REFUSED and the plugin never ran', async () => {
    const caseDir = join(dir(), 'injector');
    await mkdir(caseDir);
    const injector: StartupCase = {
      name: 'injector',
      exitCode: 1,
      stderr: /users\[0\]\.user has "exec".*CERTSHARE_KUBECONFIG_REFUSED/,
      args: (ctx) => ['--listen', `127.0.0.1:${ctx.port}`],
      env: (ctx) => ({ KUBECONFIG: join(ctx.dir, 'kubeconfig'), POD_NAMESPACE: 'certshare' }),
      setup: async (ctx) => {
        await execKubeconfig(ctx.dir, 'kubeconfig');
        return async () => {};
      },
    };
    const run = await runStartupCase([process.execPath, BIN, 'injector'], injector, caseDir, 15_000);
    assert.equal(existsSync(join(caseDir, 'exec-ran')), false, 'the exec plugin ran');
    assert.equal(run.code, 1, `exit code; stderr: ${run.stderr}`);
    assert.match(run.stderr, injector.stderr);
  });

  const inlineCa = Buffer.from('-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n').toString('base64');
  const kubeconfig = (cluster: Record<string, unknown>, user: Record<string, unknown>, top: Record<string, unknown> = {}) => ({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:1', 'certificate-authority-data': inlineCa, ...cluster } }],
    users: [{ name: 'u', user }],
    contexts: [{ name: 'x', context: { cluster: 'c', user: 'u', namespace: 'ns' } }],
    'current-context': 'x',
    ...top,
  });
  const refused: Array<[string, unknown, RegExp]> = [
    ['an auth provider', kubeconfig({}, { 'auth-provider': { name: 'oidc', config: {} } }), /has "auth-provider"/],
    ['a token file', kubeconfig({}, { 'token-file': '/etc/shadow' }), /has "token-file"/],
    ['a client certificate file', kubeconfig({}, { 'client-certificate': '/c', 'client-key': '/k' }), /has "client-certificate"/],
    ['a CA file', kubeconfig({ 'certificate-authority': '/etc/ca.pem' }, { token: 't' }), /has "certificate-authority"/],
    ['TLS verification off', kubeconfig({ 'insecure-skip-tls-verify': true }, { token: 't' }), /has "insecure-skip-tls-verify"/],
    ['a proxy', kubeconfig({ 'proxy-url': 'http://attacker:3128' }, { token: 't' }), /has "proxy-url"/],
    ['impersonation', kubeconfig({}, { token: 't', as: 'system:admin' }), /has "as"/],
    ['a password', kubeconfig({}, { username: 'u', password: 'p' }), /has "username"/],
    ['a plain-HTTP server', kubeconfig({ server: 'http://127.0.0.1:1' }, { token: 't' }), /not an https:\/\/ URL/],
    ['no credentials', kubeconfig({}, {}), /a token or a client certificate, one of the two/],
    ['a field of its own', kubeconfig({}, { token: 't' }, { extensions: [] }), /the kubeconfig has "extensions"/],
    ['preferences that say something', kubeconfig({}, { token: 't' }, { preferences: { colors: true } }), /preferences is not empty/],
    ['a token that is not a string', kubeconfig({}, { token: ['t'] }), /users\[0\]\.user\.token is not a string/],
  ];
  for (const [what, content, problem] of refused) {
    it(`refuses ${what}, KUBECONFIG or --federation-kubeconfig alike`, async () => {
      const path = join(dir(), `${what.replace(/\W+/g, '-')}.kubeconfig`);
      await writeFile(path, JSON.stringify(content));
      const check = (err: unknown): boolean => {
        const e = err as { code?: string; message?: string };
        assert.equal(e.code, 'CERTSHARE_KUBECONFIG_REFUSED', e.message);
        assert.match(e.message ?? '', problem);
        return true;
      };
      await assert.rejects(connectKube({ KUBECONFIG: path, POD_NAMESPACE: 'ns' }), check);
      await assert.rejects(connectKube({}, { kubeconfig: path, namespace: 'ns' }), check);
    });
  }

  it(`refuses a file over ${MAX_KUBECONFIG_BYTES} bytes and one that is not YAML, without quoting it`, async () => {
    const big = join(dir(), 'big.kubeconfig');
    await writeFile(big, `# ${'x'.repeat(MAX_KUBECONFIG_BYTES)}\n${JSON.stringify(kubeconfig({}, { token: 't' }))}`);
    await assert.rejects(connectKube({ KUBECONFIG: big }), { code: 'CERTSHARE_KUBECONFIG_REFUSED', message: /more than 262144/ });
    const garbage = join(dir(), 'garbage.kubeconfig');
    await writeFile(garbage, 'token: "secret-token\n  [');
    await assert.rejects(connectKube({ KUBECONFIG: garbage }), (err: Error) => /not YAML/.test(err.message) && !err.message.includes('secret-token'));
  });

  it('accepts a server, its CA and a token, or a client certificate, inline (YAML or JSON); the renew command any kubeconfig', async () => {
    const pair = await makePair('client', Date.now(), DAY);
    const b64 = (s: string) => Buffer.from(s).toString('base64');
    const accepted = [
      kubeconfig({}, { token: 't' }, { preferences: {} }),
      kubeconfig({}, { 'client-certificate-data': b64(pair.certPem), 'client-key-data': b64(pair.keyPem) }),
    ];
    for (const [i, content] of accepted.entries()) {
      const path = join(dir(), `accepted-${i}.kubeconfig`);
      await writeFile(path, JSON.stringify(content));
      const connection = await connectKube({ KUBECONFIG: path });
      assert.equal(connection.namespace, 'ns');
      assert.equal(connection.config.getCurrentCluster()?.server, 'https://127.0.0.1:1');
      connection.close();
    }
    const yaml = join(dir(), 'accepted.yaml');
    await writeFile(
      yaml,
      [
        'apiVersion: v1',
        'kind: Config',
        'clusters:',
        '- name: c',
        '  cluster:',
        '    server: https://127.0.0.1:1',
        'users:',
        '- name: u',
        '  user:',
        '    token: t',
      ]
        .concat(['contexts:', '- name: x', '  context: {cluster: c, user: u}', 'current-context: x', ''])
        .join('\n'),
    );
    (await connectKube({ KUBECONFIG: yaml, POD_NAMESPACE: 'ns' })).close();
    // `certshare renew`, run by a person with their own kubeconfig: loaded as kubectl would (an exec plugin is theirs).
    const theirs = join(dir(), 'theirs.kubeconfig');
    await writeFile(theirs, JSON.stringify(kubeconfig({}, { exec: { apiVersion: 'client.authentication.k8s.io/v1', command: 'gke-gcloud-auth-plugin' } })));
    (await connectKube({ KUBECONFIG: theirs, POD_NAMESPACE: 'ns' }, { anyKubeconfig: true })).close();
  });
});
