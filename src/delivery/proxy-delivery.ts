import type { Clock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import { HaproxyDelivery, HaproxyRuntimeApi } from './haproxy.ts';
import { type CoalescedReload, ReloadCommand, type ReloadOutcome, type ReloadSpec } from './reload-command.ts';
import { SignalReload } from './reload-signal.ts';

/** The settings of delivery, and only those (DaemonConfig extends them). */
export interface DeliverySettings {
  /** --reload-command, killed after reloadTimeoutMs (which also bounds a HAProxy exchange). */
  reloadCommand: ReloadSpec | undefined;
  reloadTimeoutMs: number;
  /** --reload-signal: sent to the pid in reloadPidFile after files changed, instead of a command. */
  reloadSignal: NodeJS.Signals | undefined;
  reloadPidFile: string | undefined;
  /** --haproxy-crt-dir: where <domain>.pem (chain and key) is written for HAProxy's crt. */
  haproxyCrtDir: string | undefined;
  /** --haproxy-socket: HAProxy's runtime API, to which each new certificate is pushed. */
  haproxySocket: string | undefined;
}

/** How renewed certificates reach the proxy, as the configuration asks: what the daemon wires in. */
export interface ProxyDelivery {
  /** Asked for after certificate files changed (--reload-command or --reload-signal). */
  reload: CoalescedReload | undefined;
  /** Told of every certificate the loops hold (--haproxy-crt-dir and --haproxy-socket). */
  observers: LoopObserver[];
  /**
   * Certificate files changed on disk (by any store, the projection or HAProxy's directory): logged, told to
   * `onFilesWritten`, then a reload asked for.
   */
  filesWritten(domain: string, path: string): void;
  /** Lets what is under way finish (a HAProxy exchange is cancelled) before the daemon stops. */
  stop(): Promise<void>;
}

export function proxyDelivery(
  config: DeliverySettings,
  options: {
    clock: Clock;
    logger: Logger;
    /** A reload of the proxy begins (command or signal): what it serves until the outcome is in between. */
    onStart: () => void;
    onOutcome: (o: ReloadOutcome) => void;
    onFilesWritten: (domain: string, path: string) => void;
  },
): ProxyDelivery {
  const { clock, logger, onStart, onOutcome } = options;
  const filesWritten = (domain: string, path: string): void => {
    logger.info({ domain, path }, 'certificate files written');
    options.onFilesWritten(domain, path);
    void reload?.request(domain);
  };
  const reload = config.reloadCommand
    ? new ReloadCommand(config.reloadCommand, { timeoutMs: config.reloadTimeoutMs, logger, onOutcome, onStart, clock })
    : config.reloadSignal && config.reloadPidFile
      ? new SignalReload(config.reloadSignal, config.reloadPidFile, { logger, onOutcome, onStart, clock, settleTimeoutMs: config.reloadTimeoutMs })
      : undefined;
  const haproxy = config.haproxyCrtDir
    ? new HaproxyDelivery({
        crtDir: config.haproxyCrtDir,
        ...(config.haproxySocket ? { api: new HaproxyRuntimeApi(config.haproxySocket, config.reloadTimeoutMs) } : {}),
        logger: logger.child({ component: 'haproxy' }),
        clock,
        onOutcome,
        onWritten: filesWritten,
      })
    : undefined;
  return {
    reload,
    observers: haproxy ? [haproxy] : [],
    filesWritten,
    stop: async () => {
      await Promise.all([reload?.stop(), haproxy?.stop()]);
    },
  };
}
