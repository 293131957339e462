// Under tailscaled's config file certshare follows the prefs on the IPN bus (watchPrefsChanges): every change, and
// the prefs at once on each (re)opened stream, since a restarted tailscaled reads the file again and says nothing.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type IpnNotify, LocalApiError, NotifyMask } from '../../src/core/ports/localapi.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { watchPrefsChanges } from '../../src/served/config-file-owner.ts';
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
