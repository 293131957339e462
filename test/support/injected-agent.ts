// The advertise agent as the injector writes its container (src/injector/sidecar.ts advertiseAgentContainer): its
// script, its Node flags and its variables, run on this machine's Node from a dist/ built here, with the Pod's paths
// (tailscaled's socket, the exchange) mapped to the caller's. The tailscaled tier and the bench start the agent
// through this alone, so both run what the injector injects: a regression in the agent's script or its flags shows
// there.
import { join } from 'node:path';
import { ADVERTISE_DIR, advertiseAgentContainer, SOCKET_DIR } from '../../src/injector/sidecar.ts';

export interface AgentLaunch {
  /** Node's flags, then the agent's script under the given dist/: the arguments of process.execPath. */
  args: string[];
  /** The container's variables, the Pod's paths mapped. */
  env: Record<string, string>;
}

/** `dist`: a directory scripts/build.ts built (buildDist, or buildAdvertiseAgent alone). */
export function injectedAgent(dist: string, o: { services: string; socket: string; exchange: string }): AgentLaunch {
  const c = advertiseAgentContainer({ image: 'local', services: o.services, socketVolume: 'socket' });
  const [node, ...words] = c.command ?? [];
  if (node !== '/nodejs/bin/node') throw new Error(`the agent's container runs ${node}, not the image's Node: map it here`);
  const args = words.map((w) => (w.startsWith('dist/') ? join(dist, w.slice('dist/'.length)) : w));
  const paths = new Map([
    [ADVERTISE_DIR, o.exchange],
    [`${SOCKET_DIR}/tailscaled.sock`, o.socket],
  ]);
  const env: Record<string, string> = {};
  for (const e of c.env ?? []) {
    if (e.value === undefined) throw new Error(`the agent's container takes ${e.name} from the Pod: map it here`);
    env[e.name] = paths.get(e.value) ?? e.value;
  }
  return { args: [...args, ...(c.args ?? [])], env };
}
