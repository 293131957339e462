// What each workload of the image runs, against the Dockerfile. The image's default entry starts the standalone
// daemon from its start-up snapshot; a process handed on from there to dist/cli/main.js keeps the snapshot's heap
// unused, so every Kubernetes workload (the injected sidecar, the injector's Deployment in manifests/ and in the
// chart) names dist/cli/main.js with the image's Node flags (DIST_COMMAND), and the policy
// certshare-sidecar-as-injected admits exactly that command, which the sidecar's form records. The advertise agent
// runs its own script with the same Node (ADVERTISE_AGENT_COMMAND: docs/performance.md). Read statically
// (the fast tier); the policy runs on a real apiserver in test/apiserver/pod-accounts.test.ts, the image in
// test/repo/image.test.ts.
import assert from 'node:assert/strict';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';
import type { V1Container } from '../../src/kube/transport/client-node.ts';
import { ADVERTISE_AGENT_SCRIPT, SNAPSHOT_BLOB } from '../../src/config/snapshot-files.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../src/config/injector-options.ts';
import { ANNOTATION, injectionFor, sidecarForm } from '../../src/injector/mutate.ts';
import { ADVERTISE_AGENT_COMMAND, ADVERTISE_AGENT_NAME, DIST_COMMAND, SIDECAR_NAME } from '../../src/injector/sidecar.ts';
import { imageEntrypoint } from '../support/dockerfile.ts';
import { examplePod } from '../support/injector-example.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const IMAGE = /^ghcr\.io\/certshare\/certshare[:@]/;
const FORM_POLICY = 'certshare-sidecar-as-injected';

interface Doc {
  kind?: string;
  metadata?: { name?: string };
  spec?: Record<string, unknown>;
}

/** Every container of a workload in `doc` (Deployment, StatefulSet, DaemonSet, Job, CronJob, Pod). */
function containersOf(doc: Doc): V1Container[] {
  type PodSpec = { containers?: V1Container[]; initContainers?: V1Container[] };
  const spec = doc.spec as { template?: { spec?: PodSpec }; jobTemplate?: { spec?: { template?: { spec?: PodSpec } } } } | undefined;
  const pod = doc.kind === 'Pod' ? (spec as PodSpec | undefined) : (spec?.jobTemplate?.spec?.template?.spec ?? spec?.template?.spec);
  return [...(pod?.initContainers ?? []), ...(pod?.containers ?? [])];
}

async function yamlFiles(dir: string): Promise<string[]> {
  const entries = await readdir(join(REPO, dir), { recursive: true, withFileTypes: true });
  return entries.filter((e) => e.isFile() && /\.ya?ml$/.test(e.name)).map((e) => join(e.parentPath, e.name));
}

describe('the command each workload of the image runs', () => {
  it("the image's entry starts the start-up snapshot with the Node flags DIST_COMMAND gives dist/cli/main.js", async () => {
    const entry = imageEntrypoint(await readFile(join(REPO, 'Dockerfile'), 'utf8'));
    assert.equal(entry.blob, `dist/${SNAPSHOT_BLOB}`, 'the default entry: the standalone daemon from its snapshot');
    assert.deepEqual(DIST_COMMAND, [entry.node, ...entry.flags, 'dist/cli/main.js'], 'the same node and flags, dist/cli/main.js');
    // The form records each word list joined by spaces, and the policy splits it again.
    for (const word of DIST_COMMAND) assert.doesNotMatch(word, /\s/);
  });

  it('every workload of manifests/ running the image names DIST_COMMAND; the chart the same as manifests/injector', async () => {
    const found: string[] = [];
    for (const file of await yamlFiles('manifests')) {
      for (const doc of loadAll(await readFile(file, 'utf8')) as Doc[]) {
        for (const c of doc ? containersOf(doc) : []) {
          if (!IMAGE.test(c.image ?? '')) continue;
          found.push(`${doc.kind}/${doc.metadata?.name}/${c.name}`);
          assert.deepEqual(c.command, DIST_COMMAND, `${file}: ${c.name}`);
        }
      }
    }
    assert.deepEqual(found, ['Deployment/certshare-injector/injector']);
    const commandLine = (text: string) => text.split('\n').filter((l) => /^\s+command:/.test(l));
    const manifest = await readFile(join(REPO, 'manifests/injector/deployment.yaml'), 'utf8');
    const chart = await readFile(join(REPO, 'charts/certshare/templates/deployment.yaml'), 'utf8');
    assert.deepEqual(commandLine(chart), commandLine(manifest), "the chart's Deployment names the same command");
  });

  it("the injected sidecar runs DIST_COMMAND, the agent its own script; the form records the sidecar's; both policies admit that alone", async () => {
    const defaults = injectorConfigFrom(parseFlags(INJECTOR_FLAGS, [], {}), {}).defaults;
    const pod = await examplePod('proxy-0');
    pod.metadata!.annotations = {
      ...pod.metadata!.annotations,
      [ANNOTATION.flags]: '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --shutdown-timeout=8s',
    };
    const injection = injectionFor(pod, defaults);
    assert.equal(injection.kind, 'inject');
    const spec = injection.kind === 'inject' ? injection.pod.spec! : undefined;
    const sidecar = spec!.initContainers!.find((c) => c.name === SIDECAR_NAME)!;
    const agent = spec!.containers.find((c) => c.name === ADVERTISE_AGENT_NAME)!;
    assert.deepEqual([sidecar.command, sidecar.args], [DIST_COMMAND, ['run']]);
    assert.deepEqual([agent.command, agent.args], [ADVERTISE_AGENT_COMMAND, undefined]);
    assert.equal(ADVERTISE_AGENT_COMMAND[0], DIST_COMMAND[0], "the image's Node");
    assert.equal(ADVERTISE_AGENT_COMMAND.at(-1), `dist/${ADVERTISE_AGENT_SCRIPT}`, 'the script scripts/build.ts writes');
    const form = sidecarForm(defaults);
    assert.deepEqual([form.command, form.args], [DIST_COMMAND.join(' '), 'run']);
    const rules: string[][] = [];
    for (const file of ['manifests/injector/admission-policy.yaml', 'charts/certshare/templates/admission-policy.yaml']) {
      const text = await readFile(join(REPO, file), 'utf8');
      const policy = text.slice(text.indexOf(`name: ${FORM_POLICY}`));
      const rule = policy.split('\n').filter((l) => /c\.\?(command|args)\.orValue\(\[\]\) == /.test(l));
      assert.deepEqual(
        rule.map((l) => l.trim()),
        [
          "c.?command.orValue([]) == (params.data.?command.orValue('') == '' ? [] : params.data.command.split(' ')) &&",
          "c.?args.orValue([]) == (params.data.?args.orValue('') == '' ? [] : params.data.args.split(' ')))",
        ],
        `${file}: the container's command and args are the form's, word for word`,
      );
      assert.match(policy, /k in \['name', 'image', 'imagePullPolicy', 'restartPolicy', 'command', 'args', 'env',/, file);
      rules.push(rule);
    }
    assert.deepEqual(rules[0], rules[1]);
  });
});
