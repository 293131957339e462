// certshare advertise-agent and its exchange with certshare (src/served/advertise-agent.ts,
// advertise-exchange.ts), on a real directory and prefs kept in memory: the agent advertises only what
// certshare's request names and its own allow list allows, withdraws on any request it cannot believe (garbage,
// too large, a symlink, a FIFO, unknown fields) and on stop, and edits nothing but AdvertiseServices.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { ADVERTISE_AGENT_FLAGS, advertiseAgentConfigFrom } from '../../src/config/advertise-agent-options.ts';
import { systemClock } from '../../src/core/ports/clock.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { type IpnPrefs, LocalApiError, type MaskedPrefs } from '../../src/core/ports/localapi.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { isNotListening } from '../../src/localapi/client.ts';
import { type AdvertiseAgent, createAdvertiseAgent, watchDirectory } from '../../src/served/advertise-agent.ts';
import { AgentPrefs, MAX_EXCHANGE_BYTES, parseRequest, requestPath } from '../../src/served/advertise-exchange.ts';
import type { PrefsApi } from '../../src/served/advertiser.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { every, until } from '../support/wait.ts';

class MemoryPrefs implements PrefsApi {
  services: string[] = ['svc:other'];
  readonly edits: MaskedPrefs[] = [];
  async prefs(): Promise<IpnPrefs> {
    return { AdvertiseServices: [...this.services], ExitNodeID: '' };
  }
  async editPrefs(masked: MaskedPrefs): Promise<IpnPrefs> {
    this.edits.push(masked);
    this.services = [...masked.AdvertiseServices];
    return this.prefs();
  }
}

/** The exchange directory, as the two volumes of an injected Pod. */
async function exchangeDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'certshare-agent-'));
  await mkdir(join(dir, 'request'));
  await mkdir(join(dir, 'status'));
  return dir;
}

/** The agent for svc:web and svc:api, polling every 10 ms; `configFile`: tailscaled runs from one. */
function startAgent(dir: string, api: PrefsApi, configFile?: Parameters<typeof createAdvertiseAgent>[0]['configFile']): AdvertiseAgent {
  const agent = createAdvertiseAgent({
    api,
    services: ['svc:web', 'svc:api'],
    dir,
    clock: systemClock,
    logger: silentLogger,
    pollMs: 10,
    resyncMs: 60_000,
    ...(configFile ? { configFile } : {}),
  });
  agent.start();
  return agent;
}

describe('advertise agent', () => {
  let dir: string;
  let prefs: MemoryPrefs;
  let agent: AdvertiseAgent;
  beforeEach(async () => {
    dir = await exchangeDir();
    prefs = new MemoryPrefs();
    agent = startAgent(dir, prefs);
  });
  afterEach(async () => {
    await agent.stop(AbortSignal.timeout(5000));
    await rm(dir, { recursive: true, force: true });
  });

  const request = (text: string): Promise<void> => writeFile(requestPath(dir), text);
  const advertised =
    (...services: string[]) =>
    () =>
      JSON.stringify(prefs.services) === JSON.stringify(['svc:other', ...services]);

  it("advertises what certshare's request names within its allow list, keeps others' Services, edits nothing else", async () => {
    await request('{"seq":1,"advertise":["svc:web","svc:evil"]}');
    await until('svc:web advertised', advertised('svc:web'), [every(10)]);
    await request('{"seq":2,"advertise":["svc:api","svc:web"]}');
    await until('both advertised', () => prefs.services.includes('svc:api') && prefs.services.includes('svc:web'), [every(10)]);
    await request('{"seq":3,"advertise":[]}');
    await until('withdrawn', advertised(), [every(10)]);
    assert.ok(!prefs.services.includes('svc:evil'), 'never a Service outside --advertise-services');
    for (const edit of prefs.edits) assert.deepEqual(Object.keys(edit).sort(), ['AdvertiseServices', 'AdvertiseServicesSet'], 'only AdvertiseServices');
    // The agent edits the prefs, then writes its status: the file may not exist yet when the prefs say withdrawn.
    const status = (): string => {
      try {
        return readFileSync(join(dir, 'status', 'advertised.json'), 'utf8');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return '';
        throw err;
      }
    };
    await until('the status names request 3', () => status().includes('"seq":3'), [every(10)]);
    assert.deepEqual(JSON.parse(status()), { seq: 3, advertised: [], stopped: false });
  });

  const garbage: Array<[string, () => Promise<void>]> = [
    ['not JSON', () => request('{"seq":2,"advertise":["svc:web"')],
    ['unknown fields', () => request('{"seq":2,"advertise":["svc:web"],"prefs":{"WantRunning":false}}')],
    ['a name that is no Service', () => request('{"seq":2,"advertise":["svc:web","WEB"]}')],
    ['a negative seq', () => request('{"seq":-2,"advertise":["svc:web"]}')],
    ['too large', () => request(`{"seq":2,"advertise":["svc:web"]}${' '.repeat(MAX_EXCHANGE_BYTES)}`)],
    [
      'a symlink',
      async () => {
        const elsewhere = join(dir, 'elsewhere.json');
        await writeFile(elsewhere, '{"seq":2,"advertise":["svc:web"]}');
        await rm(requestPath(dir));
        await symlink(elsewhere, requestPath(dir));
      },
    ],
    [
      'a FIFO (never blocks the agent)',
      async () => {
        await rm(requestPath(dir));
        execFileSync('mkfifo', [requestPath(dir)]);
      },
    ],
    ['removed', () => rm(requestPath(dir))],
  ];
  for (const [what, write] of garbage) {
    it(`withdraws on a request it cannot believe: ${what}`, async () => {
      await request('{"seq":1,"advertise":["svc:web"]}');
      await until('advertised', advertised('svc:web'), [every(10)]);
      await write();
      await until('withdrawn', advertised(), [every(10)]);
    });
  }

  it("certshare's side: an edit waits for the agent's status naming it; after the agent's stop, nobody to ask", async () => {
    const certshare = new AgentPrefs(dir, systemClock, 5000);
    const answer = await certshare.editPrefs({ AdvertiseServicesSet: true, AdvertiseServices: ['svc:web'] }, AbortSignal.timeout(5000));
    assert.deepEqual(answer.AdvertiseServices, ['svc:web']);
    assert.deepEqual(prefs.services, ['svc:other', 'svc:web']);
    assert.deepEqual((await certshare.prefs(AbortSignal.timeout(1000))).AdvertiseServices, ['svc:web']);
    await agent.stop(AbortSignal.timeout(5000));
    assert.deepEqual(prefs.services, ['svc:other'], 'withdrawn on stop');
    await assert.rejects(certshare.prefs(AbortSignal.timeout(1000)), (err) => isNotListening(err));
  });

  it('parses only the exact request shape', () => {
    assert.deepEqual(parseRequest('{"seq":7,"advertise":["svc:web","svc:web"]}'), { seq: 7, advertise: ['svc:web'] });
    for (const text of ['[]', 'null', '{"seq":1}', '{"seq":1.5,"advertise":[]}', `{"seq":1,"advertise":${JSON.stringify(Array(65).fill('svc:a'))}}`])
      assert.throws(() => parseRequest(text), /CERTSHARE_BAD_EXCHANGE|advertise request/, text);
  });
});

// tailscaled from a config file (Tailscale's operator's ProxyGroups): the agent only withdraws from the file's list and
// reloads the file to put it back; before certshare's first request the file's word stands.
describe('advertise agent under a config file', () => {
  it("never adds; withdraws what certshare's request leaves out or on garbage; reloads the file once all is asked again", async () => {
    const dir = await exchangeDir();
    const file = ['svc:other', 'svc:web'];
    const prefs = new MemoryPrefs();
    prefs.services = [...file];
    let reloads = 0;
    const putBack = async () => {
      reloads++;
      prefs.services = [...file];
    };
    const agent = startAgent(dir, prefs, { putBack, watch: async () => {} });
    const certshare = new AgentPrefs(dir, systemClock, 5000);
    const request = (text: string): Promise<void> => writeFile(requestPath(dir), text);
    try {
      const status = (): string => {
        try {
          return readFileSync(join(dir, 'status', 'advertised.json'), 'utf8');
        } catch {
          return '';
        }
      };
      await until('the status says the file owns the list', () => status().includes('"fromFile":true'), [every(10)]);
      await certshare.prefs(AbortSignal.timeout(1000));
      assert.equal(certshare.fromFile(), true, "certshare reads the agent's word");
      assert.deepEqual(prefs.services, file, "no request yet: the file's list stands");
      await request('{"seq":1,"advertise":["svc:api"]}');
      await until('svc:web withdrawn', () => JSON.stringify(prefs.services) === '["svc:other"]', [every(10)]);
      await request('{"seq":2,"advertise":["svc:api","svc:web"]}');
      await until('the file reloaded', () => reloads === 1 && JSON.stringify(prefs.services) === JSON.stringify(file), [every(10)]);
      await request('{"seq":3,"advertise":');
      await until('withdrawn on garbage', () => JSON.stringify(prefs.services) === '["svc:other"]', [every(10)]);
      assert.ok(!prefs.edits.some((e) => e.AdvertiseServices?.includes('svc:api')), 'never a Service the file does not list');
    } finally {
      await agent.stop(AbortSignal.timeout(5000));
      await rm(dir, { recursive: true, force: true });
    }
    assert.deepEqual(prefs.services, ['svc:other'], 'withdrawn on stop');
  });
});

// The request's directory followed (watchDirectory, inotify) instead of read every 250 ms: at rest the agent then reads
// it only every watchedPollMs, and a change is seen at once; where the directory cannot be followed, every pollMs.
describe('advertise agent following the request directory', () => {
  const MINUTE = 60_000;
  const withWatch = (dir: string, prefs: MemoryPrefs, watchRequests: typeof watchDirectory, pollMs: number) => {
    const log = recordingLogger();
    const agent = createAdvertiseAgent({
      api: prefs,
      services: ['svc:web'],
      dir,
      clock: systemClock,
      logger: log.logger,
      pollMs,
      watchRequests,
      watchedPollMs: MINUTE,
      resyncMs: MINUTE,
    });
    agent.start();
    return { agent, log };
  };

  it("sees each of certshare's requests at once through the watch, though it reads the request only once a minute", async () => {
    const dir = await exchangeDir();
    const prefs = new MemoryPrefs();
    const { agent } = withWatch(dir, prefs, watchDirectory, MINUTE);
    const certshare = new AgentPrefs(dir, systemClock, 10_000);
    try {
      // Written as certshare writes it (a new file renamed over the old), answered only once the agent applied it.
      for (const services of [['svc:web'], [], ['svc:web']]) {
        const answer = await certshare.editPrefs({ AdvertiseServicesSet: true, AdvertiseServices: services }, AbortSignal.timeout(10_000));
        assert.deepEqual(answer.AdvertiseServices, services);
        assert.deepEqual(prefs.services, ['svc:other', ...services]);
      }
    } finally {
      await agent.stop(AbortSignal.timeout(5000));
      await rm(dir, { recursive: true, force: true });
    }
  });

  const failures: Array<[string, typeof watchDirectory]> = [
    [
      'cannot start it (no inotify instance left)',
      () => {
        throw Object.assign(new Error('ENOSPC: System limit for number of file watchers reached'), { code: 'ENOSPC' });
      },
    ],
    ['loses it later', (_dir, _onChange, onFailed) => void setImmediate(() => onFailed(new Error('watcher failed')))],
  ];
  for (const [what, watchRequests] of failures) {
    it(`reads the request every pollMs again, and says so, when it ${what}`, async () => {
      const dir = await exchangeDir();
      const prefs = new MemoryPrefs();
      const { agent, log } = withWatch(dir, prefs, watchRequests, 10);
      try {
        await until('the failure said', () => log.entries.some((e) => e.msg?.startsWith("cannot follow the advertise request's directory")), [every(10)]);
        await writeFile(requestPath(dir), '{"seq":1,"advertise":["svc:web"]}');
        await until('advertised', () => prefs.services.includes('svc:web'), [every(10)]);
      } finally {
        await agent.stop(AbortSignal.timeout(5000));
        await rm(dir, { recursive: true, force: true });
      }
    });
  }
});

describe('certshare advertise-agent flags', () => {
  const parse = (args: string[], env: NodeJS.ProcessEnv = {}) => advertiseAgentConfigFrom(parseFlags(ADVERTISE_AGENT_FLAGS, args, env));

  it('needs an allow list of Service names and the exchange directory', () => {
    // As the injector sets it: the sidecar's value, comma separated, in the environment.
    assert.deepEqual(parse([], { CERTSHARE_ADVERTISE_SERVICES: 'svc:web,svc:api', CERTSHARE_EXCHANGE: '/run/x' }).services, ['svc:web', 'svc:api']);
    const refused: Array<[string[], RegExp]> = [
      [['--exchange', '/run/x'], /--advertise-services: give at least one svc:NAME/],
      [['--advertise-services', 'serve-config', '--exchange', '/run/x'], /not a Tailscale Service name/],
      [['--advertise-services', 'svc:web'], /--exchange: missing/],
      [[...Array.from({ length: 65 }, (_, i) => ['--advertise-services', `svc:s${i}`]).flat(), '--exchange', '/run/x'], /at most 64/],
    ];
    for (const [args, problem] of refused) assert.throws(() => parse(args), problem, args.join(' '));
  });
});

describe("certshare's side of the exchange", () => {
  it('reads no status older than its last request: a stop never takes the state before an edit for the state after it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'certshare-exchange-'));
    try {
      await mkdir(join(dir, 'request'));
      await mkdir(join(dir, 'status'));
      // The agent's answer to an earlier request: nothing advertised.
      await writeFile(join(dir, 'status', 'advertised.json'), '{"seq":1,"advertised":[],"stopped":false}');
      const certshare = new AgentPrefs(dir, systemClock, 200);
      // An edit cut short before the agent answered (certshare's stop aborting its loop).
      await assert.rejects(
        certshare.editPrefs({ AdvertiseServicesSet: true, AdvertiseServices: ['svc:web'] }, AbortSignal.abort()),
        (err) => err instanceof LocalApiError && err.timedOut,
      );
      const asked = parseRequest(readFileSync(requestPath(dir), 'utf8'));
      assert.deepEqual(asked.advertise, ['svc:web']);
      // Until the agent names that request, the status does not say what the prefs are.
      await assert.rejects(certshare.prefs(AbortSignal.timeout(5000)), (err) => err instanceof LocalApiError && err.timedOut);
      await writeFile(join(dir, 'status', 'advertised.json'), JSON.stringify({ seq: asked.seq, advertised: ['svc:web'], stopped: false }));
      assert.deepEqual((await certshare.prefs(AbortSignal.timeout(5000))).AdvertiseServices, ['svc:web']);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
