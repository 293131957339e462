// A replica of Tailscale's operator's ProxyGroups as the injector grants it where the platform opted in
// (--proxygroup-namespaces): the real containerboot 1.102.5 runs tailscaled as root from the operator's config file
// (`"Locked": false`, no OperatorUser; TS_EXTRA_ARGS refused beside it), tailscaled reads the injector's passwd file,
// and the injector's postStart hook (OPERATOR_HOOK, run here as the kubelet runs it: as tailscaled's container's root,
// through its CLI) names the advertise agent's uid operator. Then, with certshare's uid (65532) still refused every
// prefs edit, the agent (65533) asked by certshare withdraws the Service from the file's list while the proxy serves an
// expired certificate, again after containerboot reloads the owner's changed file, reloads the file once the proxy
// serves the certificate held, and withdraws it at certshare's leave. It never adds. tailscaled's socket is where the
// injector puts it in the operator's Pods (TS_SOCKET in the socket volume at /var/run/tailscale, seen from tailscaled's
// mount namespace; the hook run there). Needs root (setpriv, a mount namespace for tailscaled).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmod, chown, mkdir, readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { describe, it } from 'node:test';
import { promisify } from 'node:util';
import { ADVERTISE_AGENT_UID, SIDECAR_SECURITY_CONTEXT } from '../../src/injector/sidecar.ts';
import { OPERATOR_HOOK, PROXY_GROUP_SOCKET, tailscaledPasswd } from '../../src/injector/tailscale-operator.ts';
import { BUILD_AND_START_TIMEOUT_MS, useRealTailscaled } from '../harness/tailscale.ts';
import { advertisedIn, asUid, prefsOf, startInjectedAgent, watchPrefs } from '../support/advertising.ts';
import { DAY, makePair } from '../support/certs.ts';
import { projectConfig } from '../support/projected-config.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { startTlsProxy } from '../support/tls-proxy.ts';
import { every, until } from '../support/wait.ts';
import { memoryOf } from '../support/proc-memory.ts';

const CERTSHARE_UID = SIDECAR_SECURITY_CONTEXT.runAsUser!;
const asRoot = process.getuid?.() === 0;
/** certshare's --served-check-interval here. */
const INTERVAL_MS = 1000;

describe("an opted-in ProxyGroup replica (the real containerboot, the operator's file): the agent, made operator by the hook, only withdraws", {
  timeout: BUILD_AND_START_TIMEOUT_MS,
  skip: !asRoot && "needs root (setpriv to certshare's and the agent's uids, a mount namespace for tailscaled)",
}, () => {
  // tailscaled's container sees the socket volume the injector adds at /var/run/tailscale (ts.dir here); the agent and
  // certshare reach the same socket through their own mount (ts.socket).
  const realTailscaled = useRealTailscaled({
    certDomainsAtStart: true,
    passwd: tailscaledPasswd(),
    permitCertUid: String(CERTSHARE_UID),
    socketVolumeAt: dirname(PROXY_GROUP_SOCKET),
  });
  const dir = useTempDir();

  it('withdraws from the file’s list while the proxy serves an expired certificate, again after the owner’s reload, puts it back once served', async () => {
    const ts = realTailscaled();
    await chmod(ts.dir, 0o711);
    await chmod(dir(), 0o711);
    const service = `svc:${ts.domain.split('.')[0]}`;
    const list = (...services: string[]) => JSON.stringify(services);
    const configDir = join(dir(), 'tsconfig');
    await mkdir(configDir);
    await projectConfig(configDir, 1, { Version: 'alpha0', Locked: false, AdvertiseServices: [service] });
    // TS_SOCKET as the injector sets it in the operator's Pods (withProxyGroupSocket), in the volume's directory.
    await ts.startContainerboot(configDir, { TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT: 'false', TS_SOCKET: PROXY_GROUP_SOCKET });
    const reloads = (): number => ts.logs().tailscaled.filter((l) => l.includes('tailscaled config watch: config was reloaded')).length;

    // The gap: without the hook neither uid may edit prefs under the operator's file.
    const withdrawal = { AdvertiseServicesSet: true, AdvertiseServices: [] };
    assert.equal((await asUid(ADVERTISE_AGENT_UID, ts.socket, 'PATCH', '/localapi/v0/prefs', withdrawal)).status, 403, 'the agent before the hook');
    // The hook as the kubelet runs it in tailscaled's container: its mounts, its environment (TS_SOCKET), its CLI on PATH.
    const hook = await promisify(execFile)('nsenter', ['-t', String(ts.tailscaledPid), '--mount', '--', ...OPERATOR_HOOK], {
      env: { PATH: `${ts.binDir}:${process.env.PATH ?? '/usr/bin:/bin'}`, TS_SOCKET: PROXY_GROUP_SOCKET },
      timeout: 70_000,
    });
    assert.equal(hook.stderr, '', 'the hook named the operator');
    assert.equal((await prefsOf(ts)).OperatorUser, 'certshare-advertise');
    const refused = await asUid(CERTSHARE_UID, ts.socket, 'PATCH', '/localapi/v0/prefs', withdrawal);
    assert.equal(refused.status, 403, `certshare's own uid stays refused: ${refused.body}`);
    assert.equal(advertisedIn(await prefsOf(ts)).join(), service, 'nothing changed yet');
    // What the operator right is short of root's (why not a root agent): tailscaled serving its own container's files
    // (a Path handler), which only root, or an operator who may run sudo, may configure.
    const servesFiles = { TCP: { 443: { HTTPS: true } }, Web: { [`${ts.domain}:443`]: { Handlers: { '/': { Path: '/etc' } } } } };
    const asOperator = await asUid(ADVERTISE_AGENT_UID, ts.socket, 'POST', '/localapi/v0/serve-config', servesFiles);
    assert.match(`${asOperator.status} ${asOperator.body}`, /^401 must be root/, 'the agent may not make tailscaled serve its files');
    const asRootAnswer = await asUid(0, ts.socket, 'POST', '/localapi/v0/serve-config', servesFiles);
    assert.equal(asRootAnswer.status, 200, `root may: ${asRootAnswer.body}`);
    assert.equal((await asUid(0, ts.socket, 'POST', '/localapi/v0/serve-config', {})).status, 200);

    const exchange = join(dir(), 'exchange');
    await mkdir(join(exchange, 'request'), { recursive: true });
    await mkdir(join(exchange, 'status'));
    await chown(join(exchange, 'status'), ADVERTISE_AGENT_UID, ADVERTISE_AGENT_UID);
    const agent = await startInjectedAgent(ts, dir(), service, exchange);
    const prefs = await watchPrefs(ts);
    const proxy = await startTlsProxy(await makePair(ts.domain, Date.now() - 2 * DAY, DAY)); // expired
    const certs = join(dir(), 'certs');
    const flags = ['--domain', ts.domain, '--served-check', `127.0.0.1:${proxy.port}`, '--served-check-interval', `${INTERVAL_MS}ms`];
    let daemon: Awaited<ReturnType<typeof standaloneDaemon>> | undefined;
    let memory: { rssMiB: number; hwmMiB: number } | undefined;
    const log = recordingLogger();
    let expiredAt: number | undefined; // the served check's first `expired`
    log.events.on('entry', (e: Record<string, unknown>) => {
      if (e.outcome === 'expired') expiredAt ??= Date.now();
    });
    try {
      daemon = await standaloneDaemon(
        ts,
        certs,
        [...flags, '--advertise-services', service, '--advertise-agent', exchange, '--advertise-failover', '200ms'],
        log.logger,
      );
      await until('withdrawn while the proxy serves an expired certificate', () => prefs.seen.at(-1)?.list === list(), [every(100)], 120_000);
      // The operator changes the file; containerboot reloads it, and the list is the file's again for a moment.
      await projectConfig(configDir, 2, { Version: 'alpha0', Locked: false, AdvertiseServices: [service, 'svc:api'] });
      await until('containerboot reloaded the file', () => reloads() === 1, [every(100)], 30_000);
      await until('withdrawn again after the reload, svc:api kept', () => prefs.seen.at(-1)?.list === list('svc:api'), [every(100)], 30_000);
      await until('the certificate held', () => daemon!.health.infoOf(ts.domain) !== undefined, [every(100)], 120_000);
      const domainDir = join(certs, ts.domain);
      proxy.serve({ certPem: await readFile(join(domainDir, 'tls.crt'), 'utf8'), keyPem: await readFile(join(domainDir, 'tls.key'), 'utf8') });
      await until('the file’s list put back', () => prefs.seen.at(-1)?.list === list(service, 'svc:api'), [every(100)], 30_000);
      const { rss, peak } = await memoryOf(agent.child.pid!);
      memory = { rssMiB: Math.round(rss / 2 ** 20), hwmMiB: Math.round(peak / 2 ** 20) };
      await daemon.stop(); // certshare's leave (a Pod's preStop call): withdrawn through the agent
      daemon = undefined;
      await until('withdrawn at the leave', () => prefs.seen.at(-1)?.list === list('svc:api'), [every(100)], 15_000);
    } catch (err) {
      process.stderr.write(`on failure: the prefs' changes ${JSON.stringify(prefs.seen)}\nthe agent said:\n${agent.lines.join('\n')}\n`);
      throw err;
    } finally {
      await daemon?.stop();
      await proxy.close();
      await agent.terminate(15_000);
      await prefs.stop();
    }
    const lists = prefs.seen.map((s) => s.list);
    assert.deepEqual(
      lists,
      [list(service), list(), list(service, 'svc:api'), list('svc:api'), list(service, 'svc:api'), list('svc:api')],
      'only removals, and the file',
    );
    assert.match(
      agent.lines.find((l) => l.includes('CERTSHARE_ADVERTISE_CONFIG_FILE')) ?? '',
      /certshare never adds them/,
      'the agent said the file owns the list',
    );
    assert.ok(expiredAt !== undefined, 'the served check saw the expired certificate');
    const withdrawnMs = prefs.seen[1]!.at - expiredAt;
    assert.ok(withdrawnMs >= 0, `withdrawn ${-withdrawnMs} ms before the check saw the expired certificate: the file's word stands until then`);
    assert.ok(withdrawnMs <= INTERVAL_MS, `withdrawn ${withdrawnMs} ms after the check saw the expired certificate: more than the check interval`);
    const backMs = prefs.seen[3]!.at - prefs.seen[2]!.at;
    process.stderr.write(
      `ProxyGroup replica, the agent as operator by the hook: withdrawn ${withdrawnMs} ms after the check saw the expired certificate; ` +
        `after the owner's reload the Service was advertised again for ${backMs} ms; ` +
        `the agent's memory ${JSON.stringify(memory)}\n`,
    );
  });
});

describe('the hook under a locked config file (real tailscaled)', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });

  it('ends at once, saying why, and lets the container start', async () => {
    const ts = realTailscaled();
    await ts.writeConfigFile({ Version: 'alpha0', AdvertiseServices: [`svc:${ts.domain.split('.')[0]}`] });
    const started = performance.now();
    const hook = await promisify(execFile)(OPERATOR_HOOK[0]!, OPERATOR_HOOK.slice(1), {
      env: { PATH: `${ts.binDir}:${process.env.PATH ?? '/usr/bin:/bin'}`, TS_SOCKET: ts.socket },
      timeout: 70_000,
    });
    const tookMs = performance.now() - started;
    assert.match(hook.stderr, /certshare-advertise is not tailscaled's operator: .*locked/);
    assert.ok(tookMs < 10_000, `the hook took ${Math.round(tookMs)} ms`);
    assert.equal((await prefsOf(ts)).OperatorUser ?? '', '');
  });
});
