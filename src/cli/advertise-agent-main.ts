// The advertise agent's own entry, dist/agent/advertise-agent.cjs (scripts/build.ts): `certshare advertise-agent`
// and nothing else, without the rest of certshare's bundle, so that the process every advertising Pod runs beside
// certshare loads only what the agent uses (docs/performance.md, the advertise agent). Its arguments are the
// command's flags: the injector names this script (src/injector/sidecar.ts ADVERTISE_AGENT_COMMAND).
import { advertiseAgentCommand } from './advertise-agent-command.ts';
import { exitFatal } from './fatal.ts';

advertiseAgentCommand(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => exitFatal(err),
);
