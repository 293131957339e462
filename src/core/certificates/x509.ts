// @peculiar/x509, loaded on first use. Two reasons: it costs 70 to 200 ms to load here (a process that
// never parses or signs with it does not pay), and its dependency injection (tsyringe) needs the
// reflect-metadata polyfill evaluated first, which only an awaited import guarantees once esbuild has
// bundled both (a static `import 'reflect-metadata'` runs after the ES modules it bundles with).
import { webcrypto } from 'node:crypto';

export type X509Module = typeof import('@peculiar/x509');

let x509Loading: Promise<X509Module> | undefined;

/** The @peculiar/x509 module, with Node's webcrypto as its crypto provider. */
export async function loadX509(): Promise<X509Module> {
  x509Loading ??= (async () => {
    await import('reflect-metadata');
    const x509 = await import('@peculiar/x509');
    x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);
    return x509;
  })();
  return x509Loading;
}
