import { startTcpProxy, type TcpProxy } from './tcp-proxy.ts';

/** A TCP relay spreading connections round-robin over its targets, as a Service does over endpoints. */
export interface Relay extends TcpProxy {
  /** Targets for new connections (open ones stay where they are, as after an endpoint change). */
  setTargets(ports: number[]): void;
}

export async function startRelay(ports: number[]): Promise<Relay> {
  let targets = [...ports];
  let next = 0;
  const proxy = await startTcpProxy(() => targets[next++ % Math.max(1, targets.length)]);
  return Object.assign(proxy, {
    setTargets(ports: number[]) {
      targets = [...ports];
    },
  });
}
