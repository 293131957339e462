// Small response helpers that write what Go's net/http writes.
import type { IncomingMessage, ServerResponse } from 'node:http';

/**
 * Go's net/http sends a Content-Length when the whole body fits its 2048-byte buffer before the handler
 * returns (bufferBeforeChunkingSize in net/http/server.go), and chunks otherwise.
 */
function goLength(body: string): Record<string, string> {
  const bytes = Buffer.byteLength(body);
  return bytes <= 2048 ? { 'Content-Length': String(bytes) } : {};
}

/** Like Go's http.Error: text/plain, nosniff, the message plus a newline. */
export function sendError(res: ServerResponse, status: number, message: string, headers: Record<string, string> = {}): void {
  if (res.headersSent || res.destroyed) return;
  const body = `${message}\n`;
  res.writeHead(status, {
    ...headers,
    'Content-Type': 'text/plain; charset=utf-8',
    'X-Content-Type-Options': 'nosniff',
    ...goLength(body),
  });
  res.end(body);
}

export function sendJson(res: ServerResponse, status: number, json: string): void {
  if (res.headersSent || res.destroyed) return;
  const body = `${json}\n`;
  res.writeHead(status, { 'Content-Type': 'application/json', ...goLength(body) });
  res.end(body);
}

export function sendText(res: ServerResponse, status: number, text: string): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, { 'Content-Type': 'text/plain', ...goLength(text) });
  res.end(text);
}

/** Go's %q on a []string: ["a" "b"]. */
export function goQuoteList(values: readonly string[]): string {
  return `[${values.map((v) => JSON.stringify(v)).join(' ')}]`;
}

export async function readBody(req: IncomingMessage, limitBytes: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    const buf = chunk as Buffer;
    size += buf.length;
    if (size > limitBytes) throw new Error(`request body larger than ${limitBytes} bytes`);
    chunks.push(buf);
  }
  return Buffer.concat(chunks).toString('utf8');
}
