// The Date header certshare writes on the injector's servers instead of Node's (src/http/date-header.ts): one
// header, the text Node would send, from httpDate (test/unit/time-text.test.ts compares the texts themselves).
import assert from 'node:assert/strict';
import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, it } from 'node:test';
import { dateHeaderWithoutIcu } from '../../src/http/date-header.ts';

describe('dateHeaderWithoutIcu', () => {
  it('a server answers with one Date header, the one Node would send', async () => {
    const server = createServer((_req, res) => res.end('ok'));
    dateHeaderWithoutIcu(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const before = Math.floor(Date.now() / 1000) * 1000;
      const headers = await new Promise<string[]>((resolve, reject) => {
        const req = request({ port: (server.address() as AddressInfo).port, host: '127.0.0.1', agent: false }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.rawHeaders));
        });
        req.on('error', reject);
        req.end();
      });
      const dates: string[] = [];
      for (let i = 0; i < headers.length; i += 2) if (headers[i]!.toLowerCase() === 'date') dates.push(headers[i + 1]!);
      assert.equal(dates.length, 1, `one Date header: ${headers.join(' | ')}`);
      const value = dates[0]!;
      assert.match(value, /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT$/);
      assert.equal(value, new Date(Date.parse(value)).toUTCString());
      assert.ok(Date.parse(value) >= before && Date.parse(value) <= Date.now(), value);
    } finally {
      server.close();
    }
  });
});
