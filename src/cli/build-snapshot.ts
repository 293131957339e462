// `node dist/cli/build-snapshot.js`: builds dist/snapshot/certshare-run.blob for the Node that runs it and checks
// that it starts (snapshot-blob.ts). The image's final stage runs it with the Node it ships; `npm run build`
// with the Node building.
import { join } from 'node:path';
import { exitFatal } from './fatal.ts';
import { buildSnapshotBlob } from './snapshot-blob.ts';

try {
  const blob = await buildSnapshotBlob(join(import.meta.dirname, '..'));
  process.stdout.write(`start-up snapshot built for Node ${process.version}: ${blob}\n`);
} catch (err) {
  exitFatal(err);
}
