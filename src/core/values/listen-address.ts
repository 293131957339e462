// The one HOST:PORT parser: the daemon's and the injector's --listen, the emulator's TCP form.
// Kept apart from the HTTP server so that reading a flag does not load fastify.

/**
 * "[::]:9002", "0.0.0.0:9002", "127.0.0.1:0", ":9002" → host and port; an empty host is `defaultHost`.
 * Throws an Error saying what was expected.
 */
export function parseHostPort(text: string, defaultHost = '::'): { host: string; port: number } {
  const match = /^(?:\[([^\]]*)\]|([^:]*)):(\d{1,5})$/.exec(text.trim());
  const port = Number(match?.[3]);
  if (!match || port > 65535) throw new Error(`invalid listen address "${text}" (expected HOST:PORT, e.g. [::]:9002)`);
  return { host: match[1] || match[2] || defaultHost, port };
}
