// The injector's Deployment as users apply it (manifests/injector/deployment.yaml): what the tests and the
// bench that run the injector as a process of their own take from it, so they run it as a cluster would.
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';

const DEPLOYMENT = fileURLToPath(new URL('../../manifests/injector/deployment.yaml', import.meta.url));

export interface InjectorContainer {
  env?: Array<{ name: string; value?: string }>;
  resources: { limits: { memory: string } };
}

export async function injectorContainer(): Promise<InjectorContainer> {
  const docs = loadAll(await readFile(DEPLOYMENT, 'utf8')) as Array<{ kind?: string } | null>;
  const deployment = docs.find((d) => d?.kind === 'Deployment') as { spec: { template: { spec: { containers: InjectorContainer[] } } } };
  return deployment.spec.template.spec.containers[0]!;
}

/** The variables of the Deployment that set up the Node process itself rather than certshare. */
export const RUNTIME_VARIABLES = ['NODE_OPTIONS', 'GLIBC_TUNABLES'];

/** The Deployment's values of RUNTIME_VARIABLES: the V8 heap bound, the C library's allocator settings. */
export async function injectorRuntimeEnv(): Promise<Record<string, string>> {
  const env: Record<string, string> = {};
  for (const e of (await injectorContainer()).env ?? []) {
    if (RUNTIME_VARIABLES.includes(e.name) && e.value !== undefined) env[e.name] = e.value;
  }
  return env;
}
