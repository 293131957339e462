// Public surface of the LocalAPI emulator.
export { startEmulator, DEFAULT_DOMAIN, DEFAULT_CERT_LIFETIME_MS, DEFAULT_TAILSCALED_VERSION, DEFAULT_VERSIONS } from './server.ts';
export type { Emulator, EmulatorOptions, EmulatorStats, NetmapStyle } from './server.ts';
export { parseFaultSpec, normalizeFault, CERT_FAULT_KINDS, BUS_FAULT_KINDS } from './faults.ts';
export type { Fault, CertFault, BusFault, CertFaultKind, BusFaultKind } from './faults.ts';
export type { IssuedEvent } from './issuer.ts';
export { parseListen } from './listen.ts';
export { runEmulatorCli, parseEmulatorArgs, emulatorUsage } from './cli.ts';
