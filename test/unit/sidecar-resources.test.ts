// The injected sidecar's requests and limits: the default follows the bench's figure for one domain by a
// stated rule (the docs' "Resources by domain count" table), and the platform sets others per group size
// with the injector's --sidecar-resources (Helm sidecar.resources), checked when the injector starts.
import assert from 'node:assert/strict';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parseFlags } from '../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../src/config/injector-options.ts';
import { injectionFor } from '../../src/injector/mutate.ts';
import { SIDECAR_NAME, SIDECAR_RESOURCES } from '../../src/injector/sidecar.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const MiB = 2 ** 20;

/** The rows of the docs' table by domain count: the writer's idle RSS (MB), the memory request and limit (Mi). */
async function rows(): Promise<Array<{ domains: number; writerMb: number; requestMi: number; limitMi: number }>> {
  const pages = [await readFile(join(REPO, 'README.md'), 'utf8')];
  const names = await readdir(join(REPO, 'docs')).catch(() => [] as string[]);
  for (const name of names.filter((n) => n.endsWith('.md'))) pages.push(await readFile(join(REPO, 'docs', name), 'utf8'));
  const found = new Map<number, { domains: number; writerMb: number; requestMi: number; limitMi: number }>();
  for (const m of pages.join('\n').matchAll(/^\| (\d+) \| ([\d.]+) \/ [^|]*MB[^|]*\|.*\| (\d+)Mi \/ (\d+)Mi \|$/gm)) {
    const row = { domains: Number(m[1]), writerMb: Number(m[2]), requestMi: Number(m[3]), limitMi: Number(m[4]) };
    const seen = found.get(row.domains);
    assert.ok(!seen || JSON.stringify(seen) === JSON.stringify(row), `two pages disagree on the row for ${row.domains} domains`);
    found.set(row.domains, row);
  }
  return [...found.values()].sort((a, b) => a.domains - b.domains);
}

/** The rule: the writer's idle RSS with a quarter of headroom, rounded up to 16 Mi. */
const requestFor = (writerMb: number) => Math.ceil((1.25 * writerMb * 1e6) / MiB / 16) * 16;

const flags = (args: string[]) => injectorConfigFrom(parseFlags(INJECTOR_FLAGS, args, {}), {});

describe("the sidecar's requests and limits", () => {
  it("each row of the docs' table follows the rule, and the injected default is the first row's", async () => {
    const table = await rows();
    assert.deepEqual(
      table.map((r) => r.domains),
      [1, 100, 500],
    );
    for (const r of table) {
      assert.ok(r.requestMi >= requestFor(r.writerMb), `${r.domains} domains: request ${r.requestMi}Mi under ${requestFor(r.writerMb)}Mi for ${r.writerMb} MB`);
      assert.ok(r.limitMi >= 1.5 * r.requestMi, `${r.domains} domains: limit ${r.limitMi}Mi not half again above the request`);
    }
    const [first] = table;
    assert.equal(first!.requestMi, requestFor(first!.writerMb), 'the default request is the smallest the rule allows for one domain');
    assert.deepEqual(SIDECAR_RESOURCES, { requests: { cpu: '100m', memory: `${first!.requestMi}Mi` }, limits: { memory: `${first!.limitMi}Mi` } });
  });

  it('--sidecar-resources sets them on every injected Pod; without it the default', () => {
    const pod = {
      metadata: { annotations: { 'certshare.io/inject': 'true', 'certshare.io/domains': 'proxy.example.com' } },
      spec: { containers: [{ name: 'proxy', image: 'nginx' }], volumes: [{ name: 'tailscale-socket', emptyDir: {} }] },
    };
    const sidecarOf = (args: string[]) => {
      const injection = injectionFor(pod, flags(args).defaults);
      assert.equal(injection.kind, 'inject');
      return injection.kind === 'inject' ? injection.pod.spec!.initContainers!.find((c) => c.name === SIDECAR_NAME)! : undefined;
    };
    assert.deepEqual(sidecarOf([])?.resources, SIDECAR_RESOURCES);
    const large = { requests: { cpu: '100m', memory: '160Mi' }, limits: { memory: '256Mi' } };
    assert.deepEqual(sidecarOf(['--sidecar-resources', JSON.stringify(large)])?.resources, large);
  });

  it('refuses at start what the apiserver would refuse in every injected Pod', () => {
    const refused: Array<[string, RegExp]> = [
      ['{"requests":{"memory":"256Mi"},"limits":{"memory":"192Mi"}}', /requests\.memory \(256Mi\) must not be above limits\.memory \(192Mi\)/],
      ['{"requests":{"cpu":"2"},"limits":{"cpu":"500m"}}', /requests\.cpu \(2\) must not be above limits\.cpu \(500m\)/],
      ['{"requests":{"memory":"128 MB"}}', /requests\.memory: "128 MB" is not a quantity/],
      ['{"requests":{"memory":128}}', /requests\.memory: 128 is not a quantity/],
      ['{"requests":{"nvidia.com/gpu":"1"}}', /requests\.nvidia\.com\/gpu: certshare's container takes cpu, memory, ephemeral-storage only/],
      ['{"claims":[]}', /"claims" is neither requests nor limits/],
      ['{"requests":', /--sidecar-resources: is not JSON/],
      ['[]', /--sidecar-resources: must be a JSON object/],
    ];
    for (const [value, message] of refused) {
      assert.throws(
        () => flags(['--sidecar-resources', value]),
        (err: Error & { code?: string }) => {
          assert.equal(err.code, 'CERTSHARE_BAD_FLAG', value);
          assert.match(err.message, message, value);
          return true;
        },
      );
    }
    assert.doesNotThrow(() => flags(['--sidecar-resources', '{"requests":{"memory":"0.5Gi","cpu":"1"},"limits":{"memory":"512Mi","cpu":"1000m"}}']));
  });
});
