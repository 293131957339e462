// Where the image's V8 startup snapshot sits in dist/ (docs/performance.md): written by scripts/build.ts and
// src/cli/snapshot-blob.ts, named by the Dockerfile's entry.

/** The script scripts/build.ts bundles from src/cli/snapshot-main.ts, under dist/. */
export const SNAPSHOT_SCRIPT = 'snapshot/certshare-run.cjs';
/** The blob built from it, under dist/: `node --snapshot-blob dist/snapshot/certshare-run.blob run ...`. */
export const SNAPSHOT_BLOB = 'snapshot/certshare-run.blob';
