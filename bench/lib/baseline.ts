// The bench's bare fastify baseline (bench/fastify-hello.ts) as the daemon runs: bundled with dist/'s
// options and stand-ins (scripts/build.ts productionBundleOptions), on the image's Node flags, with Node's
// compile cache filled by a first start. What it costs is what fastify alone costs a certshare process,
// so the daemon's figures can be read against it: the part above it is certshare's.
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { build } from 'esbuild';
import { productionBundleOptions } from '../../scripts/build.ts';
import { IMAGE_NODE_FLAGS } from './certshare.ts';
import { cleanEnv, Proc } from './proc.ts';

export interface FastifyHelloBuild {
  main: string;
  cacheDir: string;
}

/** Bundles the hello into `dir` and starts it once (and stops it), which fills its compile cache. */
export async function buildFastifyHello(dir: string): Promise<FastifyHelloBuild> {
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const main = join(dir, 'fastify-hello.js');
  await build({ ...productionBundleOptions(), entryPoints: [resolve(import.meta.dirname, '../fastify-hello.ts')], outfile: main });
  await writeFile(join(dir, 'package.json'), `${JSON.stringify({ type: 'module', private: true })}\n`);
  const hello = { main, cacheDir: join(dir, 'compile-cache') };
  const first = startFastifyHelloProc(hello, 0);
  await first.waitForLog((e) => typeof e.listening === 'string', 20_000, 'fastify hello listening');
  await first.stop();
  return hello;
}

/**
 * The bundled hello on `port` (0: any), as the image would run it: the image's Node flags, the compile
 * cache for all of it (the daemon's covers every chunk but its entry's first imports: src/cli/main.ts).
 */
export function startFastifyHelloProc(hello: FastifyHelloBuild, port: number): Proc {
  return new Proc('fastify hello', [...IMAGE_NODE_FLAGS, hello.main, String(port)], {
    env: cleanEnv({ NODE_COMPILE_CACHE: hello.cacheDir }),
    mustRun: true,
  });
}
