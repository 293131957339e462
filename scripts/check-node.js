// Runs first in `npm test` and `npm run demo`, on whatever `node` npm found on PATH. npm puts
// node_modules/.bin first, so that is the pinned Node 24 (the `node` devDependency) when it is
// installed. Plain JavaScript on purpose: when the pinned binary is missing, the `node` that runs this
// is the machine's own, which may be too old to load TypeScript and would die on the file extension
// instead of saying what to do.
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const pinned = pkg.devDependencies?.node;
const binary = join(root, 'node_modules', 'node', 'bin', 'node');
const shown = relative(process.cwd(), binary) || binary;
const running = `Node ${process.version} (${process.execPath})`;

function fail(lines) {
  console.error([`certshare: ${lines[0]}`, ...lines.slice(1).map((l) => `  ${l}`)].join('\n'));
  process.exit(1);
}

if (!existsSync(join(root, 'node_modules'))) {
  fail([`the dependencies are not installed (no node_modules); found ${running}.`, 'Run: npm ci']);
}
if (!existsSync(binary)) {
  // The `node` package ships no binary: its preinstall script fetches the platform's build. Skipped
  // scripts leave the package without it, and npm says nothing at install time.
  fail([
    `the pinned Node ${pinned} is not installed: ${shown} is missing (found ${running}).`,
    'The install script of the `node` package did not run. npm 12 runs only the install scripts that',
    'package.json approves in "allowScripts", and --ignore-scripts (or ignore-scripts=true in an .npmrc)',
    'skips them all.',
    'Check that package.json has "allowScripts": { "node": true }, that ignore-scripts is not set',
    '(npm config get ignore-scripts), then run: npm rebuild node',
    '(or start over: rm -rf node_modules && npm ci)',
  ]);
}
const major = Number(process.versions.node.split('.')[0]);
if (major !== Number(String(pinned).split('.')[0])) {
  fail([
    `this runs on ${running}, not the pinned Node ${pinned} (${shown}).`,
    'Run the project through npm (npm test, npm run <script>: npm puts node_modules/.bin first on PATH),',
    `or call ${shown} directly.`,
  ]);
}
