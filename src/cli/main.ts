#!/usr/bin/env node
import { join } from 'node:path';
import { CertshareError } from '../core/errors.ts';
import { commandUsage, parseFlags } from '../flags/flags.ts';
import { RUN_FLAGS, RUN_HELP, daemonConfigFrom } from '../config/run-options.ts';
import { useCompileCache } from './compile-cache.ts';
import { exitFatal } from './fatal.ts';
import { optimizingCompilersAfterStart, smallBufferPool, withoutOptimizingCompilers } from '../http/heap-saving.ts';

const TOP_USAGE = `Usage: certshare <command> [flags]

Commands:
  run        the daemon: watch tailscaled's cert domains, issue and renew, share, serve /healthz and /metrics
  emulator   a LocalAPI-like server (IPN bus, cert issuance from its own CA, scripted faults) for trying certshare
  demo       the emulator and the daemon together in a temporary directory, until Ctrl-C
  injector   a mutating admission webhook adding certshare as a native sidecar, serving TLS from its own rotating CA
  renew      asks the writer for one new certificate with a new key for a domain, now (certshare renew <domain>)
  advertise-agent  edits tailscaled's AdvertiseServices as certshare asks, as tailscaled's operator, so certshare needs no such right

Run "certshare <command> --help" for the flags of a command.`;

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === undefined || command === '--help' || command === '-h' || command === 'help') {
    console.log(TOP_USAGE);
    return command === undefined ? 2 : 0;
  }
  switch (command) {
    case 'run': {
      // Before its chunks load: the bundle's compile cache (dist/compile-cache), if there is one. `run` alone:
      // V8 takes an entry only under the flags it was made with (run's), and Node holds every entry it read
      // or made again until the process ends, so any other command would keep a refused copy of its code.
      useCompileCache(join(import.meta.dirname, '..'));
      const values = parseFlags(RUN_FLAGS, rest, process.env);
      if (values.help) {
        console.log(commandUsage(RUN_HELP));
        return 0;
      }
      const config = daemonConfigFrom(values, process.env);
      const started = optimizingCompilersAfterStart();
      const { runUntilSignal } = await import('./run-command.ts');
      return runUntilSignal(config, started);
    }
    case 'emulator': {
      const { runEmulatorCli } = await import('./emulator.ts');
      await runEmulatorCli(rest);
      return 0;
    }
    case 'demo': {
      const { runDemo } = await import('./demo.ts');
      return runDemo(rest);
    }
    case 'injector': {
      withoutOptimizingCompilers();
      smallBufferPool();
      const { injectorCommand } = await import('./injector-command.ts');
      return injectorCommand(rest);
    }
    case 'renew': {
      const { renewCommand } = await import('./renew.ts');
      return renewCommand(rest);
    }
    case 'advertise-agent': {
      const { advertiseAgentCommand } = await import('./advertise-agent-command.ts');
      return advertiseAgentCommand(rest);
    }
    default:
      throw new CertshareError('CERTSHARE_BAD_FLAG', {
        flag: 'command',
        rule: `unknown "${command}" (expected run, emulator, demo, injector, renew or advertise-agent; see certshare --help)`,
      });
  }
}

try {
  process.exitCode = await main(process.argv.slice(2));
} catch (err) {
  exitFatal(err);
}
