import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startDaemon } from '../daemon/daemon.ts';
import { CertshareError } from '../core/errors.ts';
import { emulatorOptionsProblem, startEmulator, type EmulatorOptions } from '../emulator/server.ts';
import { commandUsage, duration, parseFlags } from '../flags/flags.ts';
import { DEMO_FLAGS, DEMO_HELP } from '../config/demo-options.ts';
import { logFormatFrom } from '../logging/log-format.ts';
import { createLogger } from '../logging/pino-logger.ts';
import { type DaemonConfig, RUN_FLAGS, type RunValues, daemonConfigFrom } from '../config/run-options.ts';
import { stopOnSignal } from '../signals/stop-on-signal.ts';

/** The one-command demo: an emulated tailscaled and the daemon, standalone, in a temporary directory. */
export async function runDemo(argv: string[]): Promise<number> {
  const values = parseFlags(DEMO_FLAGS, argv, {});
  if (values.help) {
    console.log(commandUsage(DEMO_HELP));
    return 0;
  }
  const domain = values.domain;
  const logger = createLogger(values['log-level'], undefined, logFormatFrom(values));
  const emulated: EmulatorOptions = {
    domains: [domain],
    domainDelayMs: duration(values, 'domain-delay'),
    certLifetimeMs: duration(values, 'cert-lifetime'),
    // Its ACME directory and renewalInfo (ARI) on a TCP port of its own: the demo asks no real CA.
    acmeListen: '127.0.0.1:0',
  };
  const problem = emulatorOptionsProblem(emulated);
  if (problem) throw new CertshareError('CERTSHARE_BAD_FLAG', problem.cli);
  const dir = await mkdtemp(join(tmpdir(), 'certshare-demo-'));
  const socket = join(dir, 'tailscaled.sock');
  const certDir = join(dir, 'certs');
  const emulator = await startEmulator({ ...emulated, listen: socket, logger: logger.child({ component: 'emulator' }) });
  const config = await demoConfig(
    parseFlags(
      RUN_FLAGS,
      demoRunArgs({ socket, domain, certDir, listen: values.listen, logLevel: values['log-level'], acmeDirectoryUrl: emulator.acmeDirectoryUrl }),
      {},
    ),
  ).catch(async (err: unknown) => {
    await emulator.close();
    await rm(dir, { recursive: true, force: true });
    throw err;
  });
  let appearedAt: number | undefined;
  emulator.events.on('certDomains', () => (appearedAt ??= performance.now()));
  logger.info({ dir, socket, certDir }, 'demo: emulated tailscaled started; the domain appears after the delay');

  const daemon = await startDaemon(config, { logger, env: process.env });
  const url = `http://${daemon.address.replace(/^http:\/\//, '')}/healthz`;
  let shown = false;
  daemon.health.onChange(() => {
    if (shown || !daemon.health.evaluate(Date.now()).healthy) return;
    shown = true;
    const sinceDomain = appearedAt === undefined ? undefined : Math.round(performance.now() - appearedAt);
    void fetch(url).then(async (res) => {
      logger.info(
        {
          status: res.status,
          body: await res.text(),
          podIPv4: res.headers.get('pod-ipv4'),
          msFromDomainToCertificate: sinceDomain,
          files: join(certDir, domain),
        },
        `demo: GET /healthz answers ${res.status}; try: curl -i ${url} ; openssl x509 -noout -dates -in ${join(certDir, domain, 'tls.crt')}`,
      );
    });
  });
  const code = await stopOnSignal(daemon, logger, config.shutdownTimeoutMs);
  await emulator.close();
  await rm(dir, { recursive: true, force: true });
  return code;
}

/** The run command's flags for the demo's daemon: the emulator's socket and ACME directory, short retries and stop. */
function demoRunArgs(a: { socket: string; domain: string; certDir: string; listen: string; logLevel: string; acmeDirectoryUrl: string | undefined }): string[] {
  return [
    '--localapi',
    a.socket,
    '--domain',
    a.domain,
    '--store',
    `dir:${a.certDir}`,
    '--listen',
    a.listen,
    '--log-level',
    a.logLevel,
    '--first-retry',
    '2s',
    '--retry-cap',
    '1m',
    // Within the retry cap, as validateConfig() requires (the 1h default is not).
    '--rate-limit-retry',
    '10s',
    '--shutdown-timeout',
    '5s',
    // Standalone: no rotation to leave, so no drain before stopping.
    '--drain-delay',
    '0s',
    // ACME Renewal Information from the emulator (a window set through its control API shows within a minute).
    '--acme-directory',
    a.acmeDirectoryUrl ?? 'none',
    '--ari-interval',
    '1m',
  ];
}

/** The daemon's configuration from its flags (a rejected flag ends the demo after the emulator is closed). */
async function demoConfig(values: RunValues): Promise<DaemonConfig> {
  return daemonConfigFrom(values, { POD_IPS: '127.0.0.1' });
}
