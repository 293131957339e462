// The script bench/snapshot/build.ts snapshots: it evaluates the standalone daemon's modules (the build keeps
// that heap) and names the function a snapshot-started process runs. `node --snapshot-blob BLOB run ...`
// starts the standalone daemon from it; any other command, Kubernetes mode, `--tls secret:` and a command
// line the flags refuse go to dist/cli/main.js as if it had been started (it reports the errors).
import { createRequire } from 'node:module';
import { startupSnapshot } from 'node:v8';
import 'reflect-metadata';
import '@peculiar/x509';
import { exitFatal } from '../../src/cli/fatal.ts';
import { runUntilSignal } from '../../src/cli/run-command.ts';
import { daemonConfigFrom, RUN_FLAGS } from '../../src/config/run-options.ts';
import type { DaemonConfig } from '../../src/config/daemon-config.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { optimizingCompilersAfterStart } from '../../src/http/heap-saving.ts';

/** dist/cli/main.js, made absolute by the build. */
declare const CERTSHARE_DIST_MAIN: string;

/** The standalone daemon's configuration from `args`, or undefined for whatever the snapshot does not start. */
function standaloneConfig(args: string[]): DaemonConfig | undefined {
  const [command, ...rest] = args;
  if (command !== 'run') return undefined;
  try {
    const values = parseFlags(RUN_FLAGS, rest, process.env);
    if (values.help) return undefined;
    const config = daemonConfigFrom(values, process.env);
    return config.store.kind === 'dir' && config.tls?.kind !== 'secret' ? config : undefined;
  } catch {
    return undefined;
  }
}

// Parsed once while the snapshot is built: the flag and configuration code is then compiled in the snapshot,
// not at every start (docs/performance.md). It reads no file and opens nothing.
standaloneConfig(['run', '--domain', 'build.tailnet-0000.ts.net', '--store', 'dir:/nonexistent', '--listen', '127.0.0.1:1']);

startupSnapshot.setDeserializeMainFunction(() => {
  // Started from a snapshot, argv has no script: [node, command, ...flags].
  const config = standaloneConfig(process.argv.slice(1));
  if (config) {
    void runUntilSignal(config, optimizingCompilersAfterStart()).catch(exitFatal);
    return;
  }
  process.argv.splice(1, 0, CERTSHARE_DIST_MAIN);
  (createRequire(CERTSHARE_DIST_MAIN)('node:module') as { runMain(): void }).runMain();
});
