// Every kind of start-up failure of `certshare run`, as one table: the integration test asserts that each
// exits non-zero promptly with nothing left listening, and `bench/startup-failures.ts` times them.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { freePort } from './processes.ts';

export interface StartupCase {
  name: string;
  /** 2: the configuration is wrong (CERTSHARE_BAD_FLAG); 1: the configuration is fine but cannot be used. */
  exitCode: 1 | 2;
  /** What stderr must say (the reason and its code). */
  stderr: RegExp;
  args(ctx: CaseContext): string[];
  env?(ctx: CaseContext): NodeJS.ProcessEnv;
  /** Prepares the case (files, an occupied port); returns its cleanup. */
  setup?(ctx: CaseContext): Promise<() => Promise<void>>;
}

export interface CaseContext {
  /** A fresh directory for this case. */
  dir: string;
  /** The loopback port given to --listen; must be free after the process exited (unless the case occupies it). */
  port: number;
}

const DOMAIN = 'web.tailnet-test.ts.net';

/** A kubeconfig that loads but points at nothing: enough for everything certshare checks before it listens. */
async function deadKubeconfig(dir: string, name = 'kubeconfig', user: Record<string, unknown> = { token: 't' }): Promise<string> {
  const path = join(dir, name);
  await writeFile(
    path,
    JSON.stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:1' } }],
      users: [{ name: 'u', user }],
      contexts: [{ name: 'x', context: { cluster: 'c', user: 'u', namespace: 'ns' } }],
      'current-context': 'x',
    }),
  );
  return path;
}

/**
 * A kubeconfig whose user is an exec credential plugin that leaves `exec-ran` in the case's directory:
 * what whoever writes a kubeconfig could make certshare's container run. Refused before it can run.
 */
export function execKubeconfig(dir: string, name: string): Promise<string> {
  const credential = JSON.stringify({ apiVersion: 'client.authentication.k8s.io/v1', kind: 'ExecCredential', status: { token: 't' } });
  const exec = { apiVersion: 'client.authentication.k8s.io/v1', command: '/bin/sh', args: ['-c', `touch '${join(dir, 'exec-ran')}'; echo '${credential}'`] };
  return deadKubeconfig(dir, name, { exec });
}

const base = (ctx: CaseContext): string[] => ['--localapi', join(ctx.dir, 'tailscaled.sock'), '--listen', `127.0.0.1:${ctx.port}`];
const standalone = (ctx: CaseContext): string[] => [...base(ctx), '--store', `dir:${join(ctx.dir, 'certs')}`];
const kube = (ctx: CaseContext): string[] => [...base(ctx), '--store', 'kube', '--domain', DOMAIN];
const kubeEnv = (ctx: CaseContext): NodeJS.ProcessEnv => ({ KUBECONFIG: join(ctx.dir, 'kubeconfig'), POD_NAMESPACE: 'ns' });
const withKubeconfig = async (ctx: CaseContext): Promise<() => Promise<void>> => {
  await deadKubeconfig(ctx.dir);
  return async () => {};
};

export const STARTUP_FAILURES: StartupCase[] = [
  {
    name: 'kube mode, KUBECONFIG with an exec credential plugin',
    exitCode: 1,
    stderr: /users\[0\]\.user has "exec".*CERTSHARE_KUBECONFIG_REFUSED/,
    args: kube,
    env: kubeEnv,
    setup: async (ctx) => {
      await execKubeconfig(ctx.dir, 'kubeconfig');
      return async () => {};
    },
  },
  {
    name: '--federation-kubeconfig with an exec credential plugin',
    exitCode: 1,
    stderr: /home\.kubeconfig refused: users\[0\]\.user has "exec".*CERTSHARE_KUBECONFIG_REFUSED/,
    args: (ctx) => [
      ...kube(ctx),
      '--group',
      'proxy',
      '--federation-kubeconfig',
      join(ctx.dir, 'home.kubeconfig'),
      '--federation-namespace',
      'certshare-home',
      '--federation-cluster',
      'east',
    ],
    env: kubeEnv,
    setup: async (ctx) => {
      await deadKubeconfig(ctx.dir);
      await execKubeconfig(ctx.dir, 'home.kubeconfig');
      return async () => {};
    },
  },
  {
    name: 'serve-config directory missing',
    exitCode: 1,
    stderr: /serve config .*missing.*CERTSHARE_BAD_CONFIG/,
    args: (ctx) => [...standalone(ctx), '--serve-config', join(ctx.dir, 'missing', 'serve.json')],
  },
  {
    name: 'serve-config not JSON',
    exitCode: 1,
    stderr: /not valid JSON.*CERTSHARE_BAD_CONFIG/,
    args: (ctx) => [...standalone(ctx), '--serve-config', join(ctx.dir, 'serve.json')],
    setup: async (ctx) => {
      await writeFile(join(ctx.dir, 'serve.json'), '{"Web": {"web.example.com:443"');
      return async () => {};
    },
  },
  {
    name: 'serve-config unreadable (a directory)',
    exitCode: 1,
    stderr: /EISDIR.*CERTSHARE_BAD_CONFIG/,
    args: (ctx) => [...standalone(ctx), '--serve-config', join(ctx.dir, 'serve.json')],
    setup: async (ctx) => {
      await mkdir(join(ctx.dir, 'serve.json'));
      return async () => {};
    },
  },
  {
    name: 'listen port already in use',
    exitCode: 1,
    stderr: /EADDRINUSE.*CERTSHARE_FATAL/,
    args: (ctx) => [...standalone(ctx), '--domain', DOMAIN],
    setup: async (ctx) => {
      const server: Server = createServer();
      server.listen(ctx.port, '127.0.0.1');
      await once(server, 'listening');
      return async () => {
        server.close();
        await once(server, 'close');
      };
    },
  },
  {
    name: 'store directory unusable (a file in the way)',
    exitCode: 1,
    stderr: /certshare-certs.*CERTSHARE_STORE_UNAVAILABLE/,
    args: (ctx) => [...base(ctx), '--domain', DOMAIN, '--store', `dir:${join(ctx.dir, 'file', 'certshare-certs')}`],
    setup: async (ctx) => {
      await writeFile(join(ctx.dir, 'file'), 'not a directory');
      return async () => {};
    },
  },
  {
    name: 'bad store spec',
    exitCode: 2,
    stderr: /--store: must be dir:PATH or kube.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...base(ctx), '--domain', DOMAIN, '--store', 's3:bucket'],
  },
  {
    name: 'unknown flag',
    exitCode: 2,
    stderr: /Unknown option '--bogus'.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...standalone(ctx), '--domain', DOMAIN, '--bogus'],
  },
  {
    name: 'bad listen address',
    exitCode: 2,
    stderr: /--listen.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...standalone(ctx), '--domain', DOMAIN, '--listen', 'nowhere'],
  },
  { name: 'hostile --domain', exitCode: 2, stderr: /--domain.*CERTSHARE_BAD_FLAG/, args: (ctx) => [...standalone(ctx), '--domain', '../../x'] },
  {
    name: '--renew-fraction 1.5',
    exitCode: 2,
    stderr: /--renew-fraction.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...standalone(ctx), '--domain', DOMAIN, '--renew-fraction', '1.5'],
  },
  {
    name: '--renew-fraction 0',
    exitCode: 2,
    stderr: /--renew-fraction.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...standalone(ctx), '--domain', DOMAIN, '--renew-fraction', '0'],
  },
  {
    name: '--cert-timeout 0',
    exitCode: 2,
    stderr: /--cert-timeout.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...standalone(ctx), '--domain', DOMAIN, '--cert-timeout', '0'],
  },
  {
    name: '--reload-command bad JSON array',
    exitCode: 2,
    stderr: /--reload-command.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...standalone(ctx), '--domain', DOMAIN, '--reload-command', '["nginx", '],
  },
  {
    name: 'kube mode, KUBECONFIG names no file',
    exitCode: 1,
    stderr: /Kubernetes credentials.*CERTSHARE_BAD_CONFIG/,
    args: kube,
    env: (ctx) => ({ KUBECONFIG: join(ctx.dir, 'no-such-kubeconfig') }),
  },
  {
    name: 'kube mode without any kubeconfig or in-cluster credentials',
    exitCode: 1,
    stderr: /no Kubernetes cluster configured.*CERTSHARE_BAD_CONFIG/,
    args: kube,
  },
  {
    name: '--lease-duration 0',
    exitCode: 2,
    stderr: /--lease-duration.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...kube(ctx), '--mode', 'auto', '--group', 'g', '--lease-duration', '0'],
    env: kubeEnv,
    setup: withKubeconfig,
  },
  {
    name: '--mode auto without a group',
    exitCode: 2,
    stderr: /--mode auto.*--group.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...kube(ctx), '--mode', 'auto'],
    env: kubeEnv,
    setup: withKubeconfig,
  },
  {
    name: '--readiness-gate without POD_NAME',
    exitCode: 2,
    stderr: /--readiness-gate.*POD_NAME.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...kube(ctx), '--readiness-gate', 'certshare.io/certificates'],
    env: kubeEnv,
    setup: withKubeconfig,
  },
  {
    name: '--routing-check without POD_IPS',
    exitCode: 2,
    stderr: /--routing-check.*POD_IPS.*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...kube(ctx), '--readiness-gate', 'certshare.io/certificates', '--routing-check', 'http://svc:9002/healthz'],
    env: (ctx) => ({ ...kubeEnv(ctx), POD_NAME: 'proxy-0' }),
    setup: withKubeconfig,
  },
  {
    name: '--routing-check with an unparsable POD_IPS',
    exitCode: 2,
    stderr: /POD_IPS.*"10\.0\.0\.300".*CERTSHARE_BAD_FLAG/,
    args: (ctx) => [...kube(ctx), '--readiness-gate', 'certshare.io/certificates', '--routing-check', 'http://svc:9002/healthz'],
    env: (ctx) => ({ ...kubeEnv(ctx), POD_NAME: 'proxy-0', POD_IPS: '10.0.0.300' }),
    setup: withKubeconfig,
  },
];

export interface StartupRun {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** From spawn to exit, or to the kill at `capMs`. */
  ms: number;
  stderr: string;
  stdout: string;
  /** True when the process was still running at `capMs` and had to be killed. */
  killed: boolean;
}

/** Runs one case of `command` (e.g. [node, bin/certshare.js, 'run']) in `dir`; kills it after `capMs`. */
export async function runStartupCase(command: string[], c: StartupCase, dir: string, capMs: number): Promise<StartupRun & { port: number }> {
  const port = await freePort();
  const ctx = { dir, port };
  const cleanup = c.setup ? await c.setup(ctx) : async () => {};
  try {
    const started = performance.now();
    const child = spawn(command[0]!, [...command.slice(1), ...c.args(ctx)], {
      env: { PATH: process.env.PATH, HOME: dir, ...c.env?.(ctx) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
    child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
    let killed = false;
    const cap = setTimeout(() => {
      killed = true;
      child.kill('SIGKILL');
    }, capMs);
    const [code, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null];
    const ms = performance.now() - started;
    clearTimeout(cap);
    return { code, signal, ms, stdout, stderr, killed, port };
  } finally {
    await cleanup();
  }
}

/** Whether something accepts connections on the loopback port. */
export async function portInUse(port: number): Promise<boolean> {
  const server = createServer();
  server.listen(port, '127.0.0.1');
  try {
    await once(server, 'listening');
    server.close();
    await once(server, 'close');
    return false;
  } catch {
    return true;
  }
}
