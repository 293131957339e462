// The demo's flags and its --help (docs/configuration.md's part too): beside the other commands' options, so
// that the page's generator reads them without loading the command.
import { DEFAULT_DOMAIN } from '../emulator/server.ts';
import type { CommandHelp, FlagSpec } from '../flags/flags.ts';
import { LOG_FLAGS } from '../logging/log-format.ts';

export const DEMO_FLAGS = [
  { name: 'listen', group: 'serving and logs', placeholder: 'ADDR:PORT', default: '127.0.0.1:9002', help: "The daemon's /healthz and /metrics address." },
  { name: 'domain', group: 'the emulated tailscaled', placeholder: 'FQDN', default: DEFAULT_DOMAIN, help: 'The demo domain.' },
  {
    name: 'domain-delay',
    group: 'the emulated tailscaled',
    placeholder: 'DURATION',
    default: '2s',
    help: 'How long the emulated tailscaled takes to list the domain.',
  },
  {
    name: 'cert-lifetime',
    group: 'the emulated tailscaled',
    placeholder: 'DURATION',
    default: '10m',
    help: 'Lifetime of the emulated certificates (short, so a renewal shows up within minutes).',
  },
  ...LOG_FLAGS,
] as const satisfies readonly FlagSpec[];

/** `certshare demo --help` and its part of docs/configuration.md. */
export const DEMO_HELP: CommandHelp = {
  command: 'demo',
  summary: 'Starts the LocalAPI emulator and the daemon in a temporary directory; Ctrl-C stops both and cleans up.',
  flags: DEMO_FLAGS,
  groups: ['the emulated tailscaled', 'serving and logs'],
  example: 'certshare demo --cert-lifetime 2m --log-format pretty',
  // The demo reads no CERTSHARE_* variable (parseFlags below gets none): its usage names none.
  fromEnv: false,
};
