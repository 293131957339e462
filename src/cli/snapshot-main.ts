// The script the image's V8 startup snapshot is built from (scripts/build.ts bundles it into
// dist/snapshot/certshare-run.cjs; dist/cli/build-snapshot.js builds the blob with the Node that will run it).
// It evaluates the standalone daemon's modules, whose heap the blob keeps, and names the function a
// snapshot-started process runs: `node --snapshot-blob dist/snapshot/certshare-run.blob run ...` starts the
// standalone daemon from it. Any other command, Kubernetes mode, `--tls secret:` and a command line the
// flags refuse go to dist/cli/main.js as if it had been started (it reports the errors). Kubernetes
// workloads name dist/cli/main.js as their command instead (src/injector/sidecar.ts DIST_COMMAND): a process
// handed over keeps the snapshot's heap, which it does not use.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { startupSnapshot } from 'node:v8';
import { CertshareError } from '../core/errors.ts';
import { exitFatal } from './fatal.ts';
import { runUntilSignal } from './run-command.ts';
import { daemonConfigFrom, RUN_FLAGS } from '../config/run-options.ts';
import type { DaemonConfig } from '../config/daemon-config.ts';
import { parseFlags } from '../flags/flags.ts';
import { optimizingCompilersAfterStart } from '../http/heap-saving.ts';

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

/**
 * dist/cli/main.js, found from the blob this process started with (`--snapshot-blob`, on the command line or in
 * NODE_OPTIONS): the script's own path is the build's, and dist/ may have moved since (the image's stages).
 */
function distMainOf(execArgv: string[], nodeOptions = ''): string {
  const args = [...execArgv, ...nodeOptions.split(/\s+/)];
  const at = args.findIndex((a) => a === '--snapshot-blob' || a.startsWith('--snapshot-blob='));
  const blob = at < 0 ? undefined : args[at]!.includes('=') ? args[at]!.slice(args[at]!.indexOf('=') + 1) : args[at + 1];
  const main = blob ? join(dirname(dirname(resolve(blob))), 'cli/main.js') : undefined;
  if (!main || !existsSync(main)) {
    throw new CertshareError('CERTSHARE_SNAPSHOT_UNUSABLE', {
      blob: blob ?? '(no --snapshot-blob)',
      failure: `hands every command but the standalone daemon to ${main ?? 'dist/cli/main.js'}, which is missing`,
    });
  }
  return main;
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
  let main: string;
  try {
    main = distMainOf(process.execArgv, process.env.NODE_OPTIONS);
  } catch (err) {
    exitFatal(err);
  }
  process.argv.splice(1, 0, main);
  (createRequire(main)('node:module') as { runMain(): void }).runMain();
});
