// The bench's baselines, built and run as the daemon is: bundled with dist/'s options and stand-ins
// (scripts/build.ts productionBundleOptions), on the image's Node flags, with Node's compile cache filled
// by a first start. A bare fastify hello (bench/fastify-hello.ts) beside the standalone daemon, and the
// packages the injector needs (bench/injector-packages.ts) beside the injector: what they cost is what
// those alone cost a certshare process, so the part of a figure above its baseline is certshare's.
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { build } from 'esbuild';
import { productionBundleOptions } from '../../scripts/build.ts';
import { IMAGE_NODE_FLAGS } from './certshare.ts';
import { cleanEnv, Proc } from './proc.ts';

export interface BaselineBuild {
  name: string;
  main: string;
  cacheDir: string;
}

/** The bare fastify hello-world (bench/fastify-hello.ts). */
export const FASTIFY_HELLO = 'fastify-hello';
/** The injector's packages of the design, loaded and used once (bench/injector-packages.ts). */
export const INJECTOR_PACKAGES = 'injector-packages';

/** Bundles bench/NAME.ts into `dir` and starts it once (and stops it), which fills its compile cache. */
export async function buildBaseline(dir: string, name: string): Promise<BaselineBuild> {
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const main = join(dir, `${name}.js`);
  await build({ ...productionBundleOptions(), entryPoints: [resolve(import.meta.dirname, `../${name}.ts`)], outfile: main, splitting: false });
  await writeFile(join(dir, 'package.json'), `${JSON.stringify({ type: 'module', private: true })}\n`);
  const baseline = { name, main, cacheDir: join(dir, 'compile-cache') };
  const first = startBaseline(baseline, 0);
  await waitListening(first);
  await first.stop();
  return baseline;
}

/**
 * The bundled baseline on `port` (0: any), as the image would run it: the image's Node flags, the compile
 * cache for all of it (the daemon's covers every chunk but its entry's first imports: src/cli/main.ts),
 * and `env`: the variables the measured process runs with beside it (the injector's Deployment's).
 */
export function startBaseline(baseline: BaselineBuild, port: number, env: Record<string, string> = {}): Proc {
  return new Proc(baseline.name, [...IMAGE_NODE_FLAGS, baseline.main, String(port)], {
    env: cleanEnv({ ...env, NODE_COMPILE_CACHE: baseline.cacheDir }),
    mustRun: true,
  });
}

/** Resolves with the port a baseline listens on, once it says so. */
export async function waitListening(proc: Proc): Promise<number> {
  const line = await proc.waitForLog((e) => typeof e.listening === 'string', 20_000, `${proc.name} listening`);
  return Number(new URL(line.listening as string).port);
}
