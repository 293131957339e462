// The Date header of a node:http / node:https server's responses, written by certshare instead of Node. Node
// writes it with Date's toUTCString, which looks up the host's time zone through ICU on its first call and
// pages ICU's time zone data into the process (docs/performance.md); httpDate gives the same text without.
import type { Server } from 'node:http';
import type { Server as HttpsServer } from 'node:https';
import { httpDate } from '../core/ports/clock.ts';

/** Every response of `server` carries the Date header Node would send, computed by httpDate. */
export function dateHeaderWithoutIcu(server: Server | HttpsServer): void {
  // One text per second, as Node keeps its own: a server probed constantly (/healthz) writes it, not computes it.
  let second = -1;
  let text = '';
  // Before the server's own handler: the header is set before it writes anything.
  server.prependListener('request', (_req, res) => {
    const now = Math.floor(Date.now() / 1000);
    if (now !== second) {
      second = now;
      text = httpDate(now * 1000);
    }
    res.sendDate = false;
    res.setHeader('Date', text);
  });
}
