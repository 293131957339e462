#!/usr/bin/env node
// Runs the compiled build when there is one (images, installs), the TypeScript sources otherwise
// (a checkout: Node 24 strips the types itself). In a checkout that has both, a dist/ older than any
// source file is stale: the sources run, and stderr says so (a stale build never runs silently).
import { existsSync, readdirSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const built = new URL('../dist/cli/main.js', import.meta.url);
const sources = new URL('../src/', import.meta.url);

function newestMtimeMs(dir) {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (entry.isFile()) newest = Math.max(newest, statSync(`${entry.parentPath}/${entry.name}`).mtimeMs);
  }
  return newest;
}

let entry = new URL('cli/main.ts', sources);
if (existsSync(built)) {
  if (!existsSync(sources) || newestMtimeMs(fileURLToPath(sources)) <= statSync(built).mtimeMs) entry = built;
  else process.stderr.write('certshare: dist/ is older than src/ (run `npm run build` to refresh it); running the sources\n');
}
await import(entry.href);
