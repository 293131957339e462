// The Date header of a node:http / node:https server's responses, written by certshare instead of Node. Node
// writes it with Date's toUTCString, which looks up the host's time zone through ICU on its first call and
// pages ICU's time zone data into the process (docs/performance.md); httpDate gives the same text without.
import type { Server } from 'node:http';
import type { Server as HttpsServer } from 'node:https';
import { httpDate } from '../core/ports/clock.ts';

/** Every response of `server` carries the Date header Node would send, computed by httpDate. */
export function dateHeaderWithoutIcu(server: Server | HttpsServer): void {
  // Before the server's own handler: the header is set before it writes anything.
  server.prependListener('request', (_req, res) => {
    res.sendDate = false;
    res.setHeader('Date', httpDate(Date.now()));
  });
}
