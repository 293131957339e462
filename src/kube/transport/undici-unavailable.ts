// Stands in for the `undici` package in the production bundle (scripts/build.ts aliases it here).
// certshare talks to the Kubernetes API over node:http2 and node:https (https-transport.ts); client-node still imports
// undici for its own default transport, which certshare never uses. Leaving undici out saves the
// bundle's largest dependency and its memory; should a code path reach it anyway, it fails loudly here
// instead of silently loading it. The build fails if client-node starts importing a name not listed.
import { CertshareError } from '../../core/errors.ts';

function unavailable(what: string): never {
  throw new CertshareError('CERTSHARE_INTERNAL', `${what} needs undici, which this build leaves out (certshare's Kubernetes transport is node:https)`);
}

export class Agent {
  constructor() {
    unavailable('undici.Agent');
  }
}

export class ProxyAgent {
  constructor() {
    unavailable('undici.ProxyAgent');
  }
}

export function fetch(): never {
  return unavailable('undici.fetch');
}
