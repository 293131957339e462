// Under tailscaled's config file certshare follows the prefs on the IPN bus (watchPrefsChanges): every change, and
// the prefs at once on each (re)opened stream, since a restarted tailscaled reads the file again and says nothing.
// Who advertises (AdvertisementOwner): certshare's advertiser as it is, withdrawing only under a file, or not at all.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type IpnNotify, LocalApiError, NotifyMask } from '../../src/core/ports/localapi.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { AdvertisementOwner, watchPrefsChanges } from '../../src/served/config-file-owner.ts';
import { FakeClock } from '../support/fake-clock.ts';

describe('watchPrefsChanges', () => {
  it('calls back for each Notify with prefs, asks for the prefs at each opening, and opens the stream again after a loss', async () => {
    const clock = new FakeClock();
    const masks: number[] = [];
    const streams: IpnNotify[][] = [
      [{ Prefs: { AdvertiseServices: ['svc:web'] } }, { State: 6 }, { Prefs: null }, { Prefs: { AdvertiseServices: [] } }],
      [{ Prefs: { AdvertiseServices: ['svc:web'] } }],
    ];
    const stop = new AbortController();
    let changes = 0;
    const localApi = {
      watchIpnBus: (mask: number): AsyncIterable<IpnNotify> => {
        masks.push(mask);
        const lines = streams.shift();
        return (async function* () {
          if (!lines) {
            stop.abort();
            throw new LocalApiError({ request: 'GET /localapi/v0/watch-ipn-bus', failure: 'HTTP 500' }, { status: 500 });
          }
          yield* lines;
        })();
      },
    };
    const watching = watchPrefsChanges(localApi, () => changes++, { clock, logger: silentLogger }, stop.signal);
    while (!stop.signal.aborted) {
      if (clock.pendingSleeps() > 0) await clock.advanceToNext();
      else await new Promise((r) => setImmediate(r));
    }
    await watching;
    assert.equal(changes, 3, 'each Notify carrying prefs, none for another Notify or a null');
    assert.deepEqual(
      masks,
      [1, 2, 3].map(() => NotifyMask.NoNetMap | NotifyMask.InitialPrefs),
      'opened again after each end',
    );
  });
});

describe('AdvertisementOwner', () => {
  /** tailscaled answering reload-config with `fromFile`, and a prefs stream open until it is aborted. */
  function tailscaled(fromFile: boolean) {
    const seen = { reloads: 0, watching: 0 };
    const localApi = {
      reloadConfig: async () => {
        seen.reloads++;
        return fromFile;
      },
      watchIpnBus: (_mask: number, signal?: AbortSignal): AsyncIterable<IpnNotify> =>
        (async function* () {
          seen.watching++;
          await new Promise((resolve) => signal?.addEventListener('abort', resolve, { once: true }));
          seen.watching--;
          yield* [];
        })(),
    };
    return { localApi, seen };
  }

  const settings = { advertiseServices: ['svc:web'], advertiseLeftToFile: [], advertiseAgent: undefined as string | undefined };

  /** An owner started over tailscaled (from a file or not) with a fake advertiser recording what it was told. */
  function started(fromFile: boolean, agent?: string) {
    const { localApi, seen } = tailscaled(fromFile);
    const owner = new AdvertisementOwner({ ...settings, advertiseAgent: agent }, { localApi, clock: new FakeClock(), logger: silentLogger });
    const calls: string[] = [];
    owner.start({ start: () => calls.push('start'), withdrawOnly: () => calls.push('withdrawOnly'), notify: () => calls.push('notify') });
    return { owner, calls, seen };
  }

  it('without a config file starts the advertiser as it is, and leaves nothing to an owner', async () => {
    const { owner, calls, seen } = started(false);
    assert.equal(await owner.ownedByFile(), false);
    assert.deepEqual(calls, ['start']);
    assert.equal(seen.watching, 0, 'no prefs watch without a file');
    await owner.stop();
  });

  it("under a config file starts it withdrawing only and follows the file's reloads until stopped", async () => {
    const { owner, calls, seen } = started(true);
    assert.equal(await owner.ownedByFile(), true);
    assert.deepEqual(calls, ['withdrawOnly', 'start'], 'withdraw-only before it starts');
    assert.equal(seen.watching, 1, "the prefs followed for the file's reloads");
    await owner.stop();
    assert.equal(seen.watching, 0, 'the watch ended by the stop');
  });

  it('through the agent starts the advertiser at once and asks tailscaled nothing: the agent reads the file and only withdraws under it', async () => {
    const { owner, calls, seen } = started(true, '/exchange');
    assert.equal(await owner.ownedByFile(), false);
    assert.deepEqual(calls, ['start']);
    assert.deepEqual([seen.reloads, seen.watching], [0, 0]);
    await owner.stop();
  });

  it('without an advertiser asks tailscaled nothing', async () => {
    const { localApi, seen } = tailscaled(true);
    const owner = new AdvertisementOwner(settings, { localApi, clock: new FakeClock(), logger: silentLogger });
    owner.start(undefined);
    assert.equal(await owner.ownedByFile(), false);
    assert.equal(seen.reloads, 0);
    await owner.stop();
  });
});
