#!/usr/bin/env node
// Runs the compiled build when there is one (images, installs), the TypeScript sources otherwise
// (a checkout: Node 24 strips the types itself).
import { existsSync } from 'node:fs';
const built = new URL('../dist/cli/main.js', import.meta.url);
await import(existsSync(built) ? built.href : new URL('../src/cli/main.ts', import.meta.url).href);
