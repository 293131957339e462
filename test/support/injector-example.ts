// The example StatefulSet (manifests/example) as the injector turns it into Pods, and the Pod spec the
// example carried by hand before it asked for injection (fixtures/example-pod-spec-before.json): the
// injected Pods must keep that sidecar, env, volumes and readiness gate.
import { readFile } from 'node:fs/promises';
import { load } from 'js-yaml';
import type { V1Pod, V1PodSpec } from '../../src/kube/transport/client-node.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../src/config/injector-options.ts';
import { injectionFor } from '../../src/injector/mutate.ts';
import { DEFAULT_READINESS_GATE, type InjectionDefaults } from '../../src/config/injection-defaults.ts';

const STATEFULSET = new URL('../../manifests/example/statefulset.yaml', import.meta.url);
const BEFORE = new URL('../fixtures/injector/example-pod-spec-before.json', import.meta.url);

export interface ExampleTemplate {
  metadata: { labels: Record<string, string>; annotations: Record<string, string> };
  spec: V1PodSpec;
}

export async function exampleTemplate(): Promise<ExampleTemplate> {
  const sts = load(await readFile(STATEFULSET, 'utf8')) as { spec: { template: ExampleTemplate } };
  return sts.spec.template;
}

/** A Pod of the example StatefulSet, named as its controller names them. */
export async function examplePod(name: string): Promise<V1Pod> {
  const template = await exampleTemplate();
  return { apiVersion: 'v1', kind: 'Pod', metadata: { name, ...template.metadata }, spec: { ...template.spec, hostname: name, subdomain: 'proxy' } };
}

/**
 * The Pod spec the injector, with its default flags (the Deployment's) or `injectorArgs`, makes of a Pod
 * template: what the Pods of a StatefulSet asking for injection run. Tests without the webhook use it for
 * the webhook's part.
 */
export function injectTemplate(template: { metadata?: { annotations?: Record<string, string> }; spec: V1PodSpec }, injectorArgs: string[] = []): V1PodSpec {
  const { defaults } = injectorConfigFrom(parseFlags(INJECTOR_FLAGS, injectorArgs, {}), {});
  const injection = injectionFor({ metadata: template.metadata ?? {}, spec: template.spec }, defaults);
  if (injection.kind !== 'inject') throw new Error(`the template is not injected: ${injection.reason}`);
  return injection.pod.spec!;
}

/** The spec the injector makes of an example Pod. */
export async function injectedExampleSpec(name = 'proxy-0'): Promise<V1PodSpec> {
  const pod = await examplePod(name);
  return injectTemplate({ metadata: pod.metadata!, spec: pod.spec! });
}

/** The example's Pod spec as written by hand before the switch to injection. */
export async function examplePodSpecBefore(): Promise<V1PodSpec> {
  return JSON.parse(await readFile(BEFORE, 'utf8')) as V1PodSpec;
}

/** What injection decides in a Pod spec: volumes compared by name (the injector appends its own). */
export function injectedParts(spec: V1PodSpec) {
  return {
    serviceAccountName: spec.serviceAccountName,
    automountServiceAccountToken: spec.automountServiceAccountToken,
    readinessGates: spec.readinessGates,
    initContainers: spec.initContainers,
    containers: spec.containers,
    volumes: [...(spec.volumes ?? [])].sort((a, b) => a.name.localeCompare(b.name)),
  };
}

/** The injector's defaults as a test sets them: the example's out-dir and socket volume, the default gate. */
export const TEST_INJECTION_DEFAULTS: InjectionDefaults = {
  image: 'example/certshare:test',
  mode: 'auto',
  outDir: '/certs',
  readinessGate: DEFAULT_READINESS_GATE,
  socketVolume: 'tailscale-socket',
};
