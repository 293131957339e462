// `certshare advertise-agent`: its flags and their validation (the command is src/cli/advertise-agent-command.ts).
import { parseServiceName } from '../core/served/advertisement.ts';
import { CertshareError } from '../core/errors.ts';
import type { CommandHelp, FlagSpec, FlagValues } from '../flags/flags.ts';
import { isLogLevel, LOG_FLAGS, LOG_LEVELS, logFormatFrom, type LogFormat } from '../logging/log-format.ts';
import { MAX_EXCHANGE_SERVICES } from '../served/advertise-exchange.ts';

export const ADVERTISE_AGENT_FLAGS = [
  {
    name: 'localapi',
    group: 'tailscaled and Services',
    placeholder: 'PATH|URL',
    default: '/var/run/tailscale/tailscaled.sock',
    help: "tailscaled's LocalAPI, where this agent is the operator: a unix socket path or an http:// URL.",
  },
  {
    name: 'advertise-services',
    group: 'tailscaled and Services',
    placeholder: 'svc:NAME',
    multiple: true,
    required: '--advertise-services and --exchange',
    help: 'A Service this agent may advertise (the allow list): no other Service or pref is ever edited.',
  },
  {
    name: 'exchange',
    group: 'tailscaled and Services',
    placeholder: 'DIR',
    required: '--advertise-services and --exchange',
    help: "Reads certshare's DIR/request/advertise.json, writes DIR/status/advertised.json.",
  },
  ...LOG_FLAGS,
] as const satisfies readonly FlagSpec[];

interface AdvertiseAgentConfig {
  localapi: string;
  services: string[];
  dir: string;
  logLevel: string;
  logFormat: LogFormat;
}

function bad(flag: string, rule: string): CertshareError {
  return new CertshareError('CERTSHARE_BAD_FLAG', { flag, rule });
}

export function advertiseAgentConfigFrom(values: FlagValues<typeof ADVERTISE_AGENT_FLAGS>): AdvertiseAgentConfig {
  const services = [...new Set((values['advertise-services'] ?? []).map(parseServiceName))];
  if (services.length === 0) throw bad('--advertise-services', "give at least one svc:NAME (the agent's allow list)");
  if (services.length > MAX_EXCHANGE_SERVICES) throw bad('--advertise-services', `at most ${MAX_EXCHANGE_SERVICES} Services`);
  if (!values.exchange) throw bad('--exchange', 'missing: the directory the agent shares with certshare');
  const config = {
    localapi: values.localapi,
    services,
    dir: values.exchange,
    logLevel: values['log-level'],
    logFormat: logFormatFrom(values),
  };
  if (!isLogLevel(config.logLevel)) throw bad('--log-level', `must be ${LOG_LEVELS.join(', ')}`);
  return config;
}

export const ADVERTISE_AGENT_HELP: CommandHelp = {
  command: 'advertise-agent',
  summary:
    "certshare advertise-agent [flags]: as tailscaled's operator, edits its AdvertiseServices only, for its allow list only, as " +
    "certshare's request file (--advertise-agent) says, so that certshare needs no such right (docs/tailscale-services.md).",
  flags: ADVERTISE_AGENT_FLAGS,
  example: 'certshare advertise-agent --advertise-services svc:web --exchange /run/certshare-advertise',
};
