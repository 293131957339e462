// charts/certshare beside manifests/ (kustomize): helm built from its Go module (test/helm-binaries), run with
// its own config, cache and data directories (nothing of the developer's helm setup is read or written), and
// both renderings as plain objects in one order, so that they compare with deepEqual.
import { rmSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { loadAll } from 'js-yaml';
import { buildOnce, k8sBinDir, runCommand, type CommandResult } from '../harness/control-plane.ts';

export const REPO = resolve(import.meta.dirname, '../..');
export const CHART = join(REPO, 'charts/certshare');
export const MANIFESTS = join(REPO, 'manifests/injector');
/** The namespace manifests/injector's kustomization sets, and so the one the chart is compared in. */
export const NAMESPACE = 'certshare';

/** The README's `helm install` line, word for word. */
export const README_HELM_INSTALL = `helm install certshare charts/certshare --namespace ${NAMESPACE} --create-namespace`;

/** Its arguments to helm, the chart's path made absolute (as a user runs it from the clone). */
export const readmeHelmInstallArgs = (): string[] =>
  README_HELM_INSTALL.split(' ')
    .slice(1)
    .map((arg) => (arg === 'charts/certshare' ? CHART : arg));

export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  [field: string]: unknown;
}

type Annotated = KubeObject & { metadata: { annotations?: Record<string, string> } };
export const annotationsOf = (o: KubeObject): Record<string, string> => (o as Annotated).metadata.annotations ?? {};
/** An object without what Helm adds for an uninstall to keep (helm.sh/resource-policy): the rest is the manifests' own. */
export const withoutKeep = (o: KubeObject): KubeObject => {
  const { 'helm.sh/resource-policy': _keep, ...annotations } = annotationsOf(o);
  const { annotations: _all, ...metadata } = (o as Annotated).metadata;
  return { ...o, metadata: Object.keys(annotations).length > 0 ? ({ ...metadata, annotations } as KubeObject['metadata']) : metadata };
};

/** The directory holding helm (test/helm-binaries/build.sh: built once, a few minutes cold). */
export function helmBinDir(): Promise<string> {
  return buildOnce(join(REPO, 'test/helm-binaries/build.sh'), ['helm']);
}

let helmHome: Promise<string> | undefined;

type Run = (command: string[], options: { timeoutMs?: number; env?: Record<string, string> }) => Promise<CommandResult>;

/**
 * Runs helm with a home of its own (removed when the process exits); never rejects on a non-zero exit.
 * `run` runs it elsewhere (the real-cluster tier: inside the cluster's network namespace).
 */
export async function helm(args: string[], options: { timeoutMs?: number; run?: Run } = {}): Promise<CommandResult> {
  helmHome ??= mkdtemp(join(tmpdir(), 'certshare-helm-')).then((dir) => {
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    return dir;
  });
  const home = await helmHome;
  const env = { HELM_CONFIG_HOME: join(home, 'config'), HELM_CACHE_HOME: join(home, 'cache'), HELM_DATA_HOME: join(home, 'data') };
  return (options.run ?? runCommand)([join(await helmBinDir(), 'helm'), ...args], { env, timeoutMs: options.timeoutMs ?? 120_000 });
}

/** The objects of a YAML stream (helm template's or kustomize's), empty documents left out. */
export function objectsOf(yaml: string): KubeObject[] {
  return (loadAll(yaml) as Array<KubeObject | null>).filter((o): o is KubeObject => o !== null);
}

async function succeeded(what: string, run: Promise<CommandResult>): Promise<string> {
  const r = await run;
  if (r.code !== 0) throw new Error(`${what} failed (code ${r.code}): ${r.stderr}`);
  return r.stdout;
}

/** `helm template` of the chart in `namespace` with these values (each a --set-json, so types are kept). */
export async function renderChart(values: Record<string, unknown> = {}, namespace = NAMESPACE): Promise<KubeObject[]> {
  const sets = Object.entries(values).flatMap(([path, value]) => ['--set-json', `${path}=${JSON.stringify(value)}`]);
  return objectsOf(await succeeded('helm template', helm(['template', 'certshare', CHART, '--namespace', namespace, ...sets])));
}

/** `kubectl kustomize` of a directory under manifests/. */
export async function kustomize(dir: string): Promise<KubeObject[]> {
  const kubectl = join(await k8sBinDir(), 'kubectl');
  return objectsOf(await succeeded(`kubectl kustomize ${dir}`, runCommand([kubectl, 'kustomize', dir])));
}

const CLUSTER_SCOPED = new Set([
  'PriorityClass',
  'ClusterRole',
  'ClusterRoleBinding',
  'MutatingWebhookConfiguration',
  'ValidatingAdmissionPolicy',
  'ValidatingAdmissionPolicyBinding',
]);

/**
 * The objects as `kubectl apply -n namespace` stores them, sorted by kind, namespace and name: a namespaced
 * object without a namespace gets it; a cluster-scoped one loses any (kustomize's `namespace` also sets it on
 * kinds it does not know to be cluster-scoped, the ValidatingAdmissionPolicies; the apiserver drops it).
 */
export function applied(objects: KubeObject[], namespace = NAMESPACE): KubeObject[] {
  const placed = objects.map(({ metadata: { namespace: own, ...metadata }, ...o }) => ({
    ...o,
    metadata: CLUSTER_SCOPED.has(o.kind) ? metadata : { ...metadata, namespace: own ?? namespace },
  }));
  const key = (o: KubeObject) => `${o.kind}/${o.metadata.namespace ?? ''}/${o.metadata.name}`;
  return placed.sort((a, b) => key(a).localeCompare(key(b)));
}
