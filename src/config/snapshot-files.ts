// Where the image's V8 startup snapshot and the advertise agent's script sit in dist/ (docs/performance.md):
// written by scripts/build.ts and src/cli/snapshot-blob.ts, named by the Dockerfile's entry and the injector.

/** The script scripts/build.ts bundles from src/cli/snapshot-main.ts, under dist/. */
export const SNAPSHOT_SCRIPT = 'snapshot/certshare-run.cjs';
/** The blob built from it, under dist/: `node --snapshot-blob dist/snapshot/certshare-run.blob run ...`. */
export const SNAPSHOT_BLOB = 'snapshot/certshare-run.blob';
/** The advertise agent's own script, scripts/build.ts's bundle of src/cli/advertise-agent-main.ts, under dist/. */
export const ADVERTISE_AGENT_SCRIPT = 'agent/advertise-agent.cjs';
