import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseFlags } from '../../src/flags/flags.ts';
import { RUN_FLAGS, daemonConfigFrom } from '../../src/config/run-options.ts';

const DOMAIN = 'web.tailnet-1234.ts.net';
const KUBE = ['--store', 'kube', '--domain', DOMAIN];
const POD = { POD_NAME: 'proxy-0', POD_IPS: '10.0.0.7,fd00::7' };

function config(args: string[], env: NodeJS.ProcessEnv = {}) {
  return daemonConfigFrom(parseFlags(RUN_FLAGS, args, env), env);
}

describe('run configuration: one validation step before anything starts', () => {
  const refused: Array<[name: string, args: string[], env: NodeJS.ProcessEnv, message: RegExp]> = [
    ['no domain at all', [], {}, /--domain: give at least one, or a --serve-config/],
    ['a hostile --domain', ['--domain', '../../x'], {}, /--domain: "\.\.\/\.\.\/x" is not a fully qualified domain name/],
    ['--renew-fraction 1', ['--domain', DOMAIN, '--renew-fraction', '1'], {}, /--renew-fraction: must be between 0 and 1, both excluded .*got 1$/],
    ['--renew-fraction 0', ['--domain', DOMAIN, '--renew-fraction', '0'], {}, /--renew-fraction: must be between 0 and 1/],
    ['--renew-fraction 3/2', ['--domain', DOMAIN, '--renew-fraction', '3/2'], {}, /--renew-fraction: must be between 0 and 1/],
    ['--renew-fraction 1/0', ['--domain', DOMAIN, '--renew-fraction', '1/0'], {}, /--renew-fraction: must be between 0 and 1/],
    ['--renew-fraction -0.5', ['--domain', DOMAIN, '--renew-fraction=-0.5'], {}, /--renew-fraction: "-0.5" is not a fraction/],
    ['--renew-fraction a third', ['--domain', DOMAIN, '--renew-fraction', 'a third'], {}, /--renew-fraction: "a third" is not a fraction/],
    ['--check-interval 0', ['--domain', DOMAIN, '--check-interval', '0'], {}, /--check-interval: must be longer than 0/],
    ['--first-retry 0', ['--domain', DOMAIN, '--first-retry', '0'], {}, /--first-retry: must be longer than 0/],
    ['--rate-limit-retry 0', ['--domain', DOMAIN, '--rate-limit-retry', '0'], {}, /--rate-limit-retry: must be longer than 0/],
    ['--cert-timeout 0', ['--domain', DOMAIN, '--cert-timeout', '0'], {}, /--cert-timeout: must be longer than 0/],
    ['--reload-timeout 0', ['--domain', DOMAIN, '--reload-timeout', '0'], {}, /--reload-timeout: must be longer than 0/],
    ['--shutdown-timeout 0', ['--domain', DOMAIN, '--shutdown-timeout', '0', '--drain-delay', '0'], {}, /--shutdown-timeout: must be longer than 0/],
    ['--budget-namespace without kube', ['--domain', DOMAIN, '--budget-namespace', 'certshare'], {}, /--budget-namespace: needs --store kube/],
    ['--budget-namespace, no budget', [...KUBE, '--issuance-budget', '0', '--budget-namespace', 'ns'], {}, /--budget-namespace: needs an --issuance-budget/],
    ['--budget-namespace not a name', [...KUBE, '--budget-namespace', 'Not_A_Name'], {}, /--budget-namespace: "Not_A_Name" is not a namespace name/],
    ['--first-retry above --retry-cap', ['--domain', DOMAIN, '--first-retry', '2h', '--retry-cap', '1h'], {}, /--first-retry: must not be above --retry-cap/],
    [
      '--rate-limit-retry above --retry-cap',
      ['--domain', DOMAIN, '--rate-limit-retry', '2h', '--retry-cap', '1h'],
      {},
      /--rate-limit-retry: must not be above --retry-cap/,
    ],
    ['--leave-token standalone', ['--domain', DOMAIN, '--leave-token', 'leave-token-0123456789'], {}, /--leave-token: needs --store kube and POD_NAME/],
    ['--leave-token, no POD_NAME', [...KUBE, '--leave-token', 'leave-token-0123456789'], {}, /--leave-token: needs --store kube and POD_NAME/],
    ['--log-level loud', ['--domain', DOMAIN, '--log-level', 'loud'], {}, /--log-level: must be debug, info, warn, error/],
    ['--routing-attempts 0', ['--domain', DOMAIN, '--routing-attempts', '0'], {}, /--routing-attempts: must be a positive integer/],
    ['--routing-attempts 2.5', ['--domain', DOMAIN, '--routing-attempts', '2.5'], {}, /--routing-attempts: must be a positive integer/],
    [
      '--reload-command broken JSON',
      ['--domain', DOMAIN, '--reload-command', '["nginx",'],
      {},
      /--reload-command: a value starting with "\[" must be a JSON array/,
    ],
    [
      '--reload-command empty array',
      ['--domain', DOMAIN, '--reload-command', '[]'],
      {},
      /--reload-command: the JSON form must be a non-empty array of strings/,
    ],
    [
      '--reload-command array of numbers',
      ['--domain', DOMAIN, '--reload-command', '[1, 2]'],
      {},
      /--reload-command: the JSON form must be a non-empty array of strings/,
    ],
    ['--out-dir with a directory store', ['--domain', DOMAIN, '--store', 'dir:/tmp/x', '--out-dir', '/tmp/y'], {}, /--out-dir: needs --store kube/],
    [
      '--readiness-gate with a directory store',
      ['--domain', DOMAIN, '--store', 'dir:/tmp/x', '--readiness-gate', 'g'],
      POD,
      /--readiness-gate: needs --store kube/,
    ],
    ['--lease-duration 0', [...KUBE, '--mode', 'auto', '--group', 'g', '--lease-duration', '0'], {}, /--lease-duration: must be longer than 0/],
    ['--mode auto without a group', [...KUBE, '--mode', 'auto'], {}, /--mode auto: needs --group or POD_NAME/],
    ['--watch-scope all', [...KUBE, '--watch-scope', 'all'], POD, /--watch-scope: must be secret or group, got "all"/],
    ['--watch-scope group without a group', [...KUBE, '--watch-scope', 'group'], {}, /--watch-scope group: needs --group or POD_NAME/],
    [
      '--watch-scope group with a directory store',
      ['--domain', DOMAIN, '--store', 'dir:/tmp/x', '--watch-scope', 'group', '--group', 'g'],
      {},
      /--watch-scope group: needs --store kube/,
    ],
    ['--readiness-gate without POD_NAME', [...KUBE, '--readiness-gate', 'g'], {}, /--readiness-gate: needs POD_NAME/],
    ['--routing-check without --readiness-gate', [...KUBE, '--routing-check', 'http://svc/healthz'], POD, /--routing-check: needs --readiness-gate/],
    [
      '--routing-check not a URL',
      [...KUBE, '--readiness-gate', 'g', '--routing-check', 'svc:9002'],
      POD,
      /--routing-check: "svc:9002" is not an http:\/\/ or https:\/\/ URL/,
    ],
    [
      '--routing-check without POD_IPS',
      [...KUBE, '--readiness-gate', 'g', '--routing-check', 'http://svc/healthz'],
      { POD_NAME: 'proxy-0' },
      /--routing-check: needs the Pod's IPv4 address in POD_IPS \(hint: .*status\.podIPs\)/,
    ],
    [
      '--routing-check with an IPv6-only Pod',
      [...KUBE, '--readiness-gate', 'g', '--routing-check', 'http://svc/healthz'],
      { POD_NAME: 'proxy-0', POD_IPS: 'fd00::7' },
      /needs the Pod's IPv4 address in POD_IPS/,
    ],
    ['--issuance-budget 0/1h', ['--domain', DOMAIN, '--issuance-budget', '0/1h'], {}, /--issuance-budget: "0\/1h" needs a COUNT of at least 1/],
    ['--issuance-budget abc', ['--domain', DOMAIN, '--issuance-budget', 'abc'], {}, /--issuance-budget: "abc" is not COUNT\/WINDOW/],
    ['--issuance-budget -1/5m', ['--domain', DOMAIN, '--issuance-budget=-1/5m'], {}, /--issuance-budget: "-1\/5m" is not COUNT\/WINDOW/],
    ['--issuance-concurrency 0', ['--domain', DOMAIN, '--issuance-concurrency', '0'], {}, /--issuance-concurrency: must be a positive integer/],
    ['--issuance-concurrency 2.5', ['--domain', DOMAIN, '--issuance-concurrency', '2.5'], {}, /--issuance-concurrency: must be a positive integer/],
    ['--issuance-concurrency x', ['--domain', DOMAIN, '--issuance-concurrency', 'x'], {}, /--issuance-concurrency: must be a positive integer/],
    ['--ari-interval 0', ['--domain', DOMAIN, '--ari-interval', '0'], {}, /--ari-interval: must be longer than 0/],
    ['--ari-interval six hours', ['--domain', DOMAIN, '--ari-interval', 'six hours'], {}, /--ari-interval: invalid duration "six hours"/],
    [
      '--acme-directory not a URL',
      ['--domain', DOMAIN, '--acme-directory', 'acme.example/directory'],
      {},
      /--acme-directory: "acme\.example\/directory" is not an http:\/\/ or https:\/\/ URL \(or none/,
    ],
    ['--acme-directory ftp', ['--domain', DOMAIN], { CERTSHARE_ACME_DIRECTORY: 'ftp://ca.example/dir' }, /--acme-directory: "ftp:\/\/ca\.example\/dir" is not/],
    ['--startup-grace 11m', ['--domain', DOMAIN, '--startup-grace', '11m'], {}, /--startup-grace: must be at most 10m0s \(a longer one would hide/],
    ['--startup-grace soon', ['--domain', DOMAIN], { CERTSHARE_STARTUP_GRACE: 'soon' }, /--startup-grace: invalid duration "soon"/],
    ['an unparsable POD_IPS', ['--domain', DOMAIN], { POD_IPS: '10.0.0.300' }, /POD_IPS\/POD_IP: holds "10\.0\.0\.300", not an IP address/],
    ['an unparsable POD_IP', ['--domain', DOMAIN], { POD_IP: 'status.podIP' }, /POD_IPS\/POD_IP: holds "status\.podIP", not an IP address/],
    [
      '--advertise-services serve-config without --serve-config',
      ['--domain', DOMAIN, '--served-check', '127.0.0.1:8443', '--advertise-services', 'serve-config'],
      {},
      /--advertise-services serve-config: needs --serve-config: the ServeConfig file whose Services it advertises/,
    ],
    [
      '--advertise-services serve-config next to a Service name',
      ['--serve-config', '/x/serve.json', '--served-check', '127.0.0.1:8443', '--advertise-services', 'serve-config', '--advertise-services', 'svc:web'],
      {},
      /--advertise-services: serve-config takes the Services from the ServeConfig: give no Service name with it/,
    ],
    [
      '--advertise-services serve-config without --served-check',
      ['--serve-config', '/x/serve.json', '--advertise-services', 'serve-config'],
      {},
      /--advertise-services: needs --served-check/,
    ],
    [
      '--advertise-services serve-config whose failover does not fit the shutdown',
      ['--serve-config', '/x/serve.json', '--served-check', '127.0.0.1:8443', '--advertise-services', 'serve-config', '--shutdown-timeout', '20s'],
      {},
      /--advertise-failover: must be below --shutdown-timeout/,
    ],
    [
      '--advertise-left-to-file beside --advertise-services',
      ['--domain', DOMAIN, '--served-check', '127.0.0.1:8443', '--advertise-services', 'svc:web', '--advertise-left-to-file', 'svc:web'],
      {},
      /--advertise-left-to-file: leaves the advertisement to tailscaled's config file: give --advertise-services or this, not both/,
    ],
    [
      '--advertise-left-to-file not a Service',
      ['--domain', DOMAIN],
      { CERTSHARE_ADVERTISE_LEFT_TO_FILE: 'svc:web,web' },
      /--advertise-left-to-file: "web" is not a Tailscale Service name/,
    ],
  ];
  for (const [name, args, env, message] of refused) {
    it(`refuses ${name} with CERTSHARE_BAD_FLAG`, () => {
      assert.throws(
        () => config(args, env),
        (err: Error & { code?: string }) => {
          assert.equal(err.code, 'CERTSHARE_BAD_FLAG');
          assert.match(err.message, message);
          return true;
        },
      );
    });
  }

  it('accepts the defaults, a complete Kubernetes configuration and both reload command forms', () => {
    const standalone = config(['--domain', `${DOMAIN.toUpperCase()}.`, '--reload-command', 'nginx -s reload']);
    assert.deepEqual(standalone.domains, [DOMAIN]);
    assert.equal(standalone.renewal.renewFraction, 1 / 3);
    assert.deepEqual(standalone.reloadCommand, { shell: 'nginx -s reload' });
    assert.deepEqual(standalone.issuanceBudget, { count: 50, windowMs: 168 * 3_600_000 }, "Let's Encrypt's 50 per registered domain per week");
    assert.equal(config(['--domain', DOMAIN, '--issuance-budget', '0']).issuanceBudget, undefined);
    assert.equal(standalone.issuanceConcurrency, 4, 'four domains issue at once by default');
    assert.equal(config(['--domain', DOMAIN], { CERTSHARE_ISSUANCE_CONCURRENCY: '1' }).issuanceConcurrency, 1);
    const kube = config(
      [
        ...KUBE,
        '--mode',
        'auto',
        '--readiness-gate',
        'g',
        '--routing-check',
        'http://svc/healthz',
        '--reload-command',
        '["nginx","-s","reload"]',
        '--renew-fraction',
        '0.5',
      ],
      POD,
    );
    assert.equal(kube.group, 'proxy');
    assert.deepEqual(kube.pod, { ipv4: '10.0.0.7', ipv6: 'fd00::7', invalid: [] });
    assert.deepEqual(kube.reloadCommand, { argv: ['nginx', '-s', 'reload'] });
    assert.equal(kube.renewal.renewFraction, 0.5);
    assert.equal(kube.watchScope, 'secret', 'one watch per Secret unless asked: the least-privilege default');
    assert.equal(config([...KUBE, '--watch-scope', 'group'], POD).watchScope, 'group');
    assert.equal(config(KUBE, { ...POD, CERTSHARE_WATCH_SCOPE: 'group' }).watchScope, 'group');
  });

  it('takes --advertise-services serve-config with --serve-config and --served-check: the Services come from the file', () => {
    const fromFile = config(['--serve-config', '/x/serve.json', '--served-check', '127.0.0.1:8443', '--advertise-services', 'serve-config']);
    assert.equal(fromFile.advertiseServices, 'serve-config');
    const named = config(['--domain', DOMAIN, '--served-check', '127.0.0.1:8443', '--advertise-services', 'svc:web', '--advertise-services', 'svc:web']);
    assert.deepEqual(named.advertiseServices, ['svc:web']);
    const leftToFile = config(['--domain', DOMAIN, '--served-check', '127.0.0.1:8443'], { CERTSHARE_ADVERTISE_LEFT_TO_FILE: 'svc:web,svc:api' });
    assert.deepEqual([leftToFile.advertiseServices, leftToFile.advertiseLeftToFile], [[], ['svc:web', 'svc:api']]);
  });

  it('says expected start-up states plainly for 30 s by default; 0 warns at once, the environment scales it', () => {
    assert.equal(config(['--domain', DOMAIN]).startupGraceMs, 30_000);
    assert.equal(config(['--domain', DOMAIN, '--startup-grace', '0']).startupGraceMs, 0);
    assert.equal(config(['--domain', DOMAIN], { CERTSHARE_STARTUP_GRACE: '500ms' }).startupGraceMs, 500);
    assert.equal(config(['--domain', DOMAIN, '--startup-grace', '10m']).startupGraceMs, 600_000);
  });

  it("asks Let's Encrypt's production directory for ARI every 6 hours at most by default; none turns it off", () => {
    const defaults = config(['--domain', DOMAIN]);
    assert.equal(defaults.acmeDirectory, 'https://acme-v02.api.letsencrypt.org/directory');
    assert.equal(defaults.ariIntervalMs, 6 * 3_600_000);
    assert.equal(config(['--domain', DOMAIN, '--acme-directory', 'none']).acmeDirectory, undefined);
    const pebble = config(['--domain', DOMAIN, '--ari-interval', '5s'], { CERTSHARE_ACME_DIRECTORY: 'https://pebble:14000/dir' });
    assert.equal(pebble.acmeDirectory, 'https://pebble:14000/dir');
    assert.equal(pebble.ariIntervalMs, 5000);
  });
  it("honours TS_CERT_SHARE_MODE (Tailscale's name for the mode): below CERTSHARE_MODE and the flag, checked like them", () => {
    // proxy-0 would write by default: each source's ro shows it was read.
    assert.equal(config(KUBE, { ...POD, TS_CERT_SHARE_MODE: 'ro' }).mode, 'ro');
    assert.equal(config(KUBE, { ...POD, TS_CERT_SHARE_MODE: 'auto' }).mode, 'auto');
    assert.equal(config(KUBE, { ...POD, TS_CERT_SHARE_MODE: 'rw', CERTSHARE_MODE: 'ro' }).mode, 'ro', 'CERTSHARE_MODE first');
    assert.equal(config([...KUBE, '--mode', 'auto'], { ...POD, TS_CERT_SHARE_MODE: 'ro' }).mode, 'auto', 'the flag first');
    assert.equal(config(KUBE, { ...POD, TS_CERT_SHARE_MODE: '' }).mode, 'rw', 'empty: not set');
    assert.throws(() => config(KUBE, { ...POD, TS_CERT_SHARE_MODE: 'writer' }), /--mode: must be rw, ro or auto, got "writer"/);
  });
});
