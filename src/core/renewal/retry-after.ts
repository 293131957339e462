// The HTTP Retry-After header (RFC 9110 section 10.2.3), read the same way for the LocalAPI's rate limits
// and the ACME server's renewalInfo answers.

/** Retry-After as milliseconds from `nowMs`: delta seconds or an HTTP-date; undefined when absent or invalid. */
export function parseRetryAfter(value: string | undefined, nowMs: number): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  if (text === '') return undefined;
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  if (!/^[A-Za-z]{3},? /.test(text)) return undefined; // HTTP-date ("Sun, 06 Nov 1994 08:49:37 GMT" and older forms)
  const at = Date.parse(text);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - nowMs);
}
