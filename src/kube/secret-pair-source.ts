// The source of a `--tls secret:NAME` (or the injector's `--metrics-tls secret:NAME`) pair: a small module the
// listeners' owners import, which loads the Kubernetes code only when a listener asks for a Secret.
import type { PairSource, PairSourceOptions } from '../tls/serving-pair.ts';

export async function secretPairSource(name: string, options: PairSourceOptions): Promise<PairSource> {
  const { TlsSecret } = await import('./tls-secret.ts');
  return new TlsSecret(name, options);
}
