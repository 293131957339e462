import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import type { V1Container, V1Pod } from '../../../src/kube/transport/client-node.ts';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { parseFlags } from '../../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../../src/config/injector-options.ts';
import { checkDefaults } from '../../../src/injector/injector.ts';
import { ANNOTATION, admissionReviewResponse, checkSidecarFlags, injectionFor } from '../../../src/injector/mutate.ts';
import { DEFAULT_READINESS_GATE, type InjectionDefaults } from '../../../src/config/injection-defaults.ts';
import { CA_DIR, CA_FILE, SIDECAR_NAME, SIDECAR_SECURITY_CONTEXT, TOKEN_DIR } from '../../../src/injector/sidecar.ts';
import { TEST_INJECTION_DEFAULTS } from '../../support/injector-example.ts';
import { applyJsonPatch } from '../../support/json-patch.ts';

const defaults: InjectionDefaults = TEST_INJECTION_DEFAULTS;
const DOMAIN = 'proxy.tailnet-0000.ts.net';

function pod(annotations: Record<string, string> | undefined, spec: Partial<V1Pod['spec']> = {}): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: 'proxy-0', namespace: 'proxy', ...(annotations ? { annotations } : {}) },
    spec: {
      containers: [
        { name: 'proxy', image: 'nginx' },
        { name: 'tailscale', image: 'tailscale/tailscale', volumeMounts: [{ name: 'tailscale-socket', mountPath: '/var/run/tailscale' }] },
      ],
      volumes: [{ name: 'tailscale-socket', emptyDir: {} }],
      ...spec,
    },
  };
}

const asked = (more: Record<string, string> = {}) => ({ [ANNOTATION.inject]: 'true', [ANNOTATION.domains]: DOMAIN, ...more });

function review(object: unknown, uid = 'uid-1') {
  return {
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: { uid, kind: { group: '', version: 'v1', kind: 'Pod' }, operation: 'CREATE', object },
  };
}

interface ReviewAnswer {
  response: { uid: string; allowed: boolean; patchType?: string; patch?: string; status?: { code: number; message: string } };
}

/** Runs the webhook on a Pod and applies its patch, as the apiserver would. */
function admit(p: V1Pod, injectorDefaults: InjectionDefaults = defaults): { answer: ReviewAnswer; stored: V1Pod } {
  const answer = admissionReviewResponse(review(p), injectorDefaults) as ReviewAnswer;
  const patch = answer.response.patch ? JSON.parse(Buffer.from(answer.response.patch, 'base64').toString()) : [];
  return { answer, stored: applyJsonPatch(p, patch) as V1Pod };
}

const sidecarOf = (p: V1Pod) => p.spec!.initContainers?.find((c) => c.name === SIDECAR_NAME);
const envOf = (p: V1Pod) => Object.fromEntries((sidecarOf(p)?.env ?? []).map((e) => [e.name, e.value ?? e.valueFrom?.fieldRef?.fieldPath]));

describe('injector mutation', () => {
  it('adds certshare as a native sidecar with the downward-API env, the gate, the volumes, resources and a restrictive securityContext', () => {
    const { answer, stored } = admit(pod(asked()));
    assert.equal(answer.response.allowed, true);
    assert.equal(answer.response.patchType, 'JSONPatch');
    assert.equal(answer.response.uid, 'uid-1');
    const sidecar = sidecarOf(stored)!;
    assert.equal(sidecar.restartPolicy, 'Always');
    assert.equal(sidecar.image, defaults.image);
    assert.deepEqual(envOf(stored), {
      POD_NAME: 'metadata.name',
      POD_NAMESPACE: 'metadata.namespace',
      POD_UID: 'metadata.uid',
      POD_IPS: 'status.podIPs',
      CERTSHARE_DOMAIN: DOMAIN,
      CERTSHARE_MODE: 'auto',
      CERTSHARE_STORE: 'kube',
      CERTSHARE_OUT_DIR: '/certs',
      CERTSHARE_READINESS_GATE: DEFAULT_READINESS_GATE,
      CERTSHARE_LOCALAPI: '/var/run/tailscale/tailscaled.sock',
      CERTSHARE_LISTEN: '[::]:9002',
      GLIBC_TUNABLES: 'glibc.malloc.mmap_threshold=32768',
    });
    assert.deepEqual(stored.spec!.readinessGates, [{ conditionType: DEFAULT_READINESS_GATE }]);
    assert.deepEqual(sidecar.resources, { requests: { cpu: '100m', memory: '112Mi' }, limits: { memory: '192Mi' } });
    assert.deepEqual(sidecar.securityContext, SIDECAR_SECURITY_CONTEXT);
    assert.deepEqual(sidecar.volumeMounts, [
      { name: 'certshare-certs', mountPath: '/certs' },
      { name: 'tailscale-socket', mountPath: '/var/run/tailscale' },
      { name: 'certshare-token', mountPath: TOKEN_DIR, readOnly: true },
    ]);
    // The token only in certshare's container; the proxies read the certificates, read-only.
    assert.equal(stored.spec!.automountServiceAccountToken, false);
    assert.equal(stored.spec!.serviceAccountName, 'default', 'a projected token needs a named ServiceAccount');
    for (const c of stored.spec!.containers) {
      assert.ok(!c.volumeMounts?.some((m) => m.name === 'certshare-token'), `${c.name} has no token`);
      assert.deepEqual(
        c.volumeMounts?.find((m) => m.name === 'certshare-certs'),
        { name: 'certshare-certs', mountPath: '/certs', readOnly: true },
      );
    }
    const token = stored.spec!.volumes!.find((v) => v.name === 'certshare-token')!;
    assert.deepEqual(
      token.projected!.sources!.map((s) => Object.keys(s)[0]),
      ['serviceAccountToken', 'configMap', 'downwardAPI'],
    );
    // Whatever else the Pod had stays.
    assert.equal(stored.spec!.containers[1]!.volumeMounts![0]!.name, 'tailscale-socket');
  });

  it('honours the annotations over the defaults', () => {
    const { stored } = admit(
      pod(
        asked({
          [ANNOTATION.domains]: `${DOMAIN}, Other.Example.COM.`,
          [ANNOTATION.mode]: 'ro',
          [ANNOTATION.outDir]: '/etc/tls',
          [ANNOTATION.readinessGate]: DEFAULT_READINESS_GATE,
        }),
      ),
    );
    const env = envOf(stored);
    assert.deepEqual(
      [env.CERTSHARE_DOMAIN, env.CERTSHARE_MODE, env.CERTSHARE_OUT_DIR, env.CERTSHARE_READINESS_GATE],
      [`${DOMAIN},other.example.com`, 'ro', '/etc/tls', DEFAULT_READINESS_GATE],
    );
    assert.deepEqual(stored.spec!.readinessGates, [{ conditionType: DEFAULT_READINESS_GATE }]);
    const none = admit(pod(asked({ [ANNOTATION.readinessGate]: 'none' }))).stored;
    assert.equal(envOf(none).CERTSHARE_READINESS_GATE, undefined);
    assert.equal(none.spec!.readinessGates, undefined);
  });

  it('is idempotent: an injected Pod (reinvocation, or a second webhook call) is left as it is', () => {
    const once = admit(pod(asked())).stored;
    const twice = admit(once);
    assert.equal(twice.answer.response.allowed, true);
    assert.equal(twice.answer.response.patch, undefined);
    assert.deepEqual(twice.stored, once);
    assert.equal(injectionFor(once, defaults).kind, 'skip');
  });

  it('a Pod that advertises a Tailscale Service: a random leave token, and preStop calls to certshare that leave rotation first', () => {
    const flags = '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --advertise-failover=20s --shutdown-timeout=8s';
    const advertising = pod(asked({ [ANNOTATION.flags]: flags }));
    const { answer, stored } = admit(advertising);
    assert.equal(answer.response.allowed, true, answer.response.status?.message);
    const token = envOf(stored).CERTSHARE_LEAVE_TOKEN as string;
    assert.match(token, /^[A-Za-z0-9_-]{32}$/);
    assert.notEqual(envOf(admit(advertising).stored).CERTSHARE_LEAVE_TOKEN, token, 'a token per Pod');
    for (const c of stored.spec!.containers) {
      assert.deepEqual(
        c.lifecycle?.preStop,
        { httpGet: { path: '/leave-rotation', port: 9002, httpHeaders: [{ name: 'certshare-leave-token', value: token }] } },
        c.name,
      );
    }
    // Called again on the Pod it injected: left alone, its token kept.
    const again = admit(stored);
    assert.equal(again.answer.response.allowed, true, again.answer.response.status?.message);
    assert.equal(again.answer.response.patch, undefined);
    // The preStop call waits out the failover: it and certshare's own stop must fit the grace period.
    const tooLong = admit(pod(asked({ [ANNOTATION.flags]: flags.replace('--shutdown-timeout=8s', '--shutdown-timeout=25s') }))).answer;
    assert.equal(tooLong.response.allowed, false);
    assert.match(
      tooLong.response.status!.message,
      /--advertise-failover \(the wait of the proxy's preStop call to certshare, 20s\) plus --shutdown-timeout .* \(30\)/,
    );
    // Without Services, the plain drain sleep.
    assert.deepEqual(admit(pod(asked())).stored.spec!.containers[0]!.lifecycle?.preStop, { sleep: { seconds: 5 } });
  });

  it('leaves Pods that do not ask, and objects that are not Pods, untouched', () => {
    const cases: (Record<string, string> | undefined)[] = [undefined, {}, { [ANNOTATION.inject]: 'false', [ANNOTATION.mode]: 'bogus' }];
    for (const annotations of cases) {
      const { answer, stored } = admit(pod(annotations));
      assert.deepEqual([answer.response.allowed, answer.response.patch], [true, undefined]);
      assert.deepEqual(stored, pod(annotations));
    }
    const notPod = admissionReviewResponse(
      { request: { uid: 'u', kind: { kind: 'ConfigMap' }, object: { metadata: { annotations: asked() } } } },
      defaults,
    ) as ReviewAnswer;
    assert.deepEqual(notPod.response, { uid: 'u', allowed: true });
  });

  it('rejects a bad annotation with a message naming it', () => {
    const cases: [Record<string, string>, RegExp][] = [
      [asked({ [ANNOTATION.mode]: 'writer' }), /certshare\.io\/mode: "writer" is not rw, ro or auto/],
      [asked({ [ANNOTATION.domains]: 'proxy.example.com,not a domain' }), /certshare\.io\/domains: "not a domain" is not a fully qualified domain name/],
      [asked({ [ANNOTATION.domains]: 'localhost' }), /"localhost" is not a fully qualified/],
      [{ [ANNOTATION.inject]: 'true' }, /certshare\.io\/domains: required/],
      [{ [ANNOTATION.inject]: 'yes', [ANNOTATION.domains]: DOMAIN }, /certshare\.io\/inject: "yes" is neither "true" nor "false"/],
      [asked({ [ANNOTATION.outDir]: 'certs' }), /certshare\.io\/out-dir: "certs" is not an absolute path/],
      [asked({ [ANNOTATION.outDir]: '/certs/../etc' }), /out-dir/],
      [asked({ [ANNOTATION.readinessGate]: 'bad gate!' }), /certshare\.io\/readiness-gate: "bad gate!" is not a condition type/],
      // A gate the admission policy would never let certshare set: the Pod could never be Ready.
      [
        asked({ [ANNOTATION.readinessGate]: 'example.com/tls' }),
        /"example\.com\/tls": certshare may set only the condition certshare\.io\/certificates .*certshare-own-pod-status/,
      ],
      [asked({ [ANNOTATION.socketVolume]: 'ts-sock' }), /certshare\.io\/socket-volume: the Pod has no volume "ts-sock"/],
      [asked({ [ANNOTATION.flags]: '--drain-delay 5s' }), /certshare\.io\/flags: "--drain-delay" is not --name=value/],
      [asked({ [ANNOTATION.flags]: '--no-such-flag=1' }), /certshare\.io\/flags: --no-such-flag is not a flag of "certshare run"/],
      [asked({ [ANNOTATION.flags]: '--mode=rw' }), /certshare\.io\/flags: --mode is set by certshare\.io\/mode, not here/],
      [asked({ [ANNOTATION.flags]: '--drain-delay=1s --drain-delay=2s' }), /--drain-delay given twice/],
      [asked({ [ANNOTATION.flags]: '--drain-delay=soon' }), /certshare\.io\/flags: --drain-delay=soon: must be a duration up to 60s/],
      // The drain and certshare's stop must end before the kubelet's SIGKILL (default grace: 30 s).
      [
        asked({ [ANNOTATION.flags]: '--drain-delay=30s' }),
        /--drain-delay \(the proxy's preStop sleep, 30s\) plus --shutdown-timeout \(certshare's own stop, 25s\) must fit the Pod's terminationGrace\w+ \(30\)/,
      ],
      [
        asked({ [ANNOTATION.flags]: '--drain-delay=5s --shutdown-timeout=26s' }),
        /--drain-delay \(the proxy's preStop sleep, 5s\) plus --shutdown-timeout \(certshare's own stop, 26s\) must fit the Pod's terminationGrace\w+ \(30\)/,
      ],
      [
        asked({ [ANNOTATION.flags]: '--drain-delay=4500ms --shutdown-timeout=25500ms' }),
        /preStop sleep, 5s\) plus --shutdown-timeout \(certshare's own stop, 25\.5s\)/,
      ],
      // Cross-field rules of the daemon, not only value syntax.
      [asked({ [ANNOTATION.flags]: '--routing-check=http://x/healthz', [ANNOTATION.readinessGate]: 'none' }), /--routing-check: needs --readiness-gate/],
    ];
    for (const [annotations, message] of cases) {
      const { answer } = admit(pod(annotations));
      assert.equal(answer.response.allowed, false, JSON.stringify(annotations));
      assert.equal(answer.response.patch, undefined);
      assert.equal(answer.response.status?.code, 400);
      assert.match(answer.response.status!.message, message);
      assert.match(answer.response.status!.message, /\[CERTSHARE_BAD_ANNOTATION\]$/);
    }
  });

  it("admits a drain and a shutdown that fit the Pod's grace period, the example's exactly", () => {
    const fits: Array<[string, number | undefined]> = [
      ['--drain-delay=5s --shutdown-timeout=25s', undefined],
      ['--drain-delay=5s --shutdown-timeout=25s', 30],
      ['--drain-delay=30s --shutdown-timeout=25s', 55],
      ['--drain-delay=0s --shutdown-timeout=10s', 10],
    ];
    for (const [flags, grace] of fits) {
      const { answer } = admit(pod(asked({ [ANNOTATION.flags]: flags }), grace === undefined ? {} : { terminationGracePeriodSeconds: grace }));
      assert.equal(answer.response.allowed, true, `${flags} in ${grace ?? 'the default'}: ${answer.response.status?.message}`);
    }
    const { answer } = admit(pod(asked({ [ANNOTATION.flags]: '--drain-delay=30s --shutdown-timeout=25s' }), { terminationGracePeriodSeconds: 54 }));
    assert.match(answer.response.status?.message ?? '', /30s\) plus --shutdown-timeout .*25s\) must fit the Pod's terminationGracePeriodSeconds \(54\)/);
    // The platform's --sidecar-flags count the same way as the Pod's own.
    const platform = admit(pod(asked()), { ...defaults, sidecarFlags: '--shutdown-timeout=26s' }).answer;
    assert.match(platform.response.status?.message ?? '', /5s\) plus --shutdown-timeout \(certshare's own stop, 26s\) must fit .*\(30\)/);
  });

  it('refuses a Pod that asks for injection and brings its own container named certshare; admits the one it made, as the apiserver stores it', () => {
    const injected = admit(pod(asked())).stored;
    const own = sidecarOf(injected)!;
    // As the apiserver stores it (its defaults filled in): a reinvocation, or a copy of a stored Pod.
    const stored = structuredClone(injected);
    const storedSidecar = sidecarOf(stored)!;
    Object.assign(storedSidecar, { terminationMessagePath: '/dev/termination-log', terminationMessagePolicy: 'File', imagePullPolicy: 'IfNotPresent' });
    Object.assign(storedSidecar.readinessProbe!, { timeoutSeconds: 1, successThreshold: 1 });
    Object.assign(storedSidecar.readinessProbe!.httpGet!, { scheme: 'HTTP' });
    storedSidecar.ports![0]!.protocol = 'TCP';
    for (const e of storedSidecar.env!) if (e.valueFrom?.fieldRef) e.valueFrom.fieldRef.apiVersion = 'v1';
    for (const p of [injected, stored]) {
      const again = admit(p);
      assert.equal(again.answer.response.allowed, true, again.answer.response.status?.message);
      assert.equal(again.answer.response.patch, undefined);
    }
    const variants: Array<[string, (c: V1Container) => void, RegExp]> = [
      ['another image', (c) => (c.image = 'attacker/certshare:latest'), /its image is not the injector's/],
      ['another command', (c) => (c.command = ['sh', '-c', 'cat /var/run/secrets/kubernetes.io/serviceaccount/token']), /its command\[0\] is not/],
      // The image's own entry (its start-up snapshot) is not the injector's command (DIST_COMMAND) either.
      ['no command', (c) => delete c.command, /its command is not/],
      ['args', (c) => (c.args = ['run', '--issuance-budget=0']), /its args is not/],
      ['a platform flag set by hand', (c) => c.env!.push({ name: 'CERTSHARE_ISSUANCE_BUDGET', value: '0' }), /its env is not/],
      ['a flag changed', (c) => (c.env!.find((e) => e.name === 'CERTSHARE_MODE')!.value = 'rw'), /its env\[\d+\]\.value is not/],
      ['a mount more', (c) => c.volumeMounts!.push({ name: 'tailscale-socket', mountPath: '/host' }), /its volumeMounts is not/],
      ['privileged', (c) => (c.securityContext = { ...c.securityContext, privileged: true }), /its securityContext\.privileged is not/],
      ['another pull policy default', (c) => (c.terminationMessagePath = '/var/run/secrets/x'), /terminationMessagePath is not/],
    ];
    for (const [what, change, message] of variants) {
      const p = structuredClone(injected);
      change(sidecarOf(p)!);
      const { answer } = admit(p);
      assert.equal(answer.response.allowed, false, what);
      assert.match(answer.response.status!.message, /brings its own container named certshare/, what);
      assert.match(answer.response.status!.message, message, what);
    }
    // Its own certshare, never injected: as a regular container, or as a native sidecar the Pod wrote.
    const regular = pod(asked(), { containers: [...pod(asked()).spec!.containers, { ...own, restartPolicy: undefined }] });
    assert.match(admit(regular).answer.response.status!.message, /brings its own container named certshare \(its restartPolicy is not/);
    const handWritten = pod(asked(), { initContainers: [{ name: 'certshare', image: defaults.image }] });
    assert.match(admit(handWritten).answer.response.status!.message, /brings its own container named certshare/);
    // A Pod that does not ask for injection is not the webhook's (the policy certshare-pods-injected is).
    assert.equal(admit(pod(undefined, { initContainers: [{ name: 'certshare', image: 'x' }] })).answer.response.allowed, true);
  });

  it('takes the ServiceAccount plugin token out of the other containers unless the Pod asked for automount', () => {
    const auto = { name: 'kube-api-access-x7k2p', projected: { sources: [] } };
    const autoMount = { name: 'kube-api-access-x7k2p', mountPath: TOKEN_DIR, readOnly: true };
    const withPluginToken = (automount?: boolean) =>
      pod(asked(), {
        ...(automount === undefined ? {} : { automountServiceAccountToken: automount }),
        containers: [{ name: 'proxy', image: 'nginx', volumeMounts: [autoMount] }],
        volumes: [{ name: 'tailscale-socket', emptyDir: {} }, auto],
      });
    const stored = admit(withPluginToken()).stored;
    assert.ok(!stored.spec!.volumes!.some((v) => v.name === auto.name));
    assert.deepEqual(stored.spec!.containers[0]!.volumeMounts, [{ name: 'certshare-certs', mountPath: '/certs', readOnly: true }]);
    const kept = admit(withPluginToken(true)).stored;
    assert.equal(kept.spec!.automountServiceAccountToken, true);
    assert.ok(kept.spec!.volumes!.some((v) => v.name === auto.name));
    assert.deepEqual(kept.spec!.containers[0]!.volumeMounts![0], autoMount);
  });

  it('shares a volume the proxy already mounts at the out-dir instead of adding one', () => {
    const stored = admit(
      pod(asked(), {
        containers: [{ name: 'proxy', image: 'nginx', volumeMounts: [{ name: 'certs', mountPath: '/certs', readOnly: true }] }],
        volumes: [
          { name: 'tailscale-socket', emptyDir: {} },
          { name: 'certs', emptyDir: {} },
        ],
      }),
    ).stored;
    assert.equal(sidecarOf(stored)!.volumeMounts![0]!.name, 'certs');
    assert.ok(!stored.spec!.volumes!.some((v) => v.name === 'certshare-certs'));
    assert.deepEqual(stored.spec!.containers[0]!.volumeMounts, [{ name: 'certs', mountPath: '/certs', readOnly: true }]);
  });

  it("takes from a Pod only the flags of its own rotation and logs, each bounded; the platform's from --sidecar-flags", () => {
    // What a Pod author in an opted-in namespace tried: the tailnet's quota, another group's Lease and Secrets,
    // a Lease held for a year, any Secret as TLS source, a program run next to the token.
    const platformFlags = [
      '--issuance-budget=0',
      '--group=other',
      '--lease-duration=8760h',
      '--tls=secret:any',
      '--reload-command=["node","-e","1"]',
      '--watch-scope=group',
      '--first-retry=1s',
      '--issuance-concurrency=64',
    ];
    for (const flag of platformFlags) {
      const { answer } = admit(pod(asked({ [ANNOTATION.flags]: flag })));
      assert.equal(answer.response.allowed, false, flag);
      assert.match(
        answer.response.status!.message,
        /belongs to the platform, not to a Pod: set it for every sidecar with the injector's --sidecar-flags/,
        flag,
      );
    }
    const bounds: [string, RegExp][] = [
      ['--drain-delay=2m', /--drain-delay=2m: must be a duration up to 60s/],
      ['--shutdown-timeout=1h', /up to 600s/],
      ['--readiness-lead=2h', /up to 3600s/],
      ['--routing-attempts=1000', /a whole number from 1 to 100/],
      ['--routing-check=file:///etc/passwd', /http:\/\/ or https:\/\/ URL without credentials/],
      ['--routing-check=http://user:pw@x/healthz', /without credentials/],
      ['--log-level=trace', /debug, info, warn or error/],
      [Array.from({ length: 5 }, (_, i) => `--routing-check=http://h${i}/healthz`).join(' '), /--routing-check: at most 4/],
      // The served check reaches the Pod's own proxy only: no other host becomes a target of certshare's handshakes.
      ['--served-check=10.0.0.7:443', /--served-check=10\.0\.0\.7:443: must be 127\.0\.0\.1:PORT or \[::1\]:PORT/],
      ['--served-check=localhost.evil.example:443', /must be 127\.0\.0\.1:PORT/],
      ['--advertise-services=svc:Web', /must be a Tailscale Service name, svc:<dns-label>/],
      [Array.from({ length: 5 }, (_, i) => `--advertise-services=svc:s${i}`).join(' '), /--advertise-services: at most 4/],
      ['--advertise-failover=5m', /up to 60s/],
    ];
    for (const [flags, message] of bounds) {
      const { answer } = admit(pod(asked({ [ANNOTATION.flags]: flags })));
      assert.equal(answer.response.allowed, false, flags);
      assert.match(answer.response.status!.message, message, flags);
    }
    const served = '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --advertise-failover=20s --shutdown-timeout=10s';
    const accepted = admit(pod(asked({ [ANNOTATION.flags]: served }))).answer;
    assert.equal(accepted.response.allowed, true, accepted.response.status?.message);
    // The platform's flags reach every sidecar; a Pod may still set its own drain delay over them.
    const platform = { ...defaults, sidecarFlags: '--issuance-budget=10/168h --drain-delay=2s --log-level=warn' };
    const answer = admissionReviewResponse(review(pod(asked({ [ANNOTATION.flags]: '--drain-delay=4s' }))), platform) as ReviewAnswer;
    const stored = applyJsonPatch(
      pod(asked({ [ANNOTATION.flags]: '--drain-delay=4s' })),
      JSON.parse(Buffer.from(answer.response.patch!, 'base64').toString()),
    ) as V1Pod;
    const env = envOf(stored);
    assert.deepEqual([env.CERTSHARE_ISSUANCE_BUDGET, env.CERTSHARE_DRAIN_DELAY, env.CERTSHARE_LOG_LEVEL], ['10/168h', '4s', 'warn']);
    const wrong = admissionReviewResponse(review(pod(asked())), { ...defaults, sidecarFlags: '--mode=rw' }) as ReviewAnswer;
    assert.match(wrong.response.status!.message, /--sidecar-flags: --mode is set by certshare\.io\/mode/);
  });

  it('sets the sidecar imagePullPolicy the injector was given, and none otherwise', () => {
    assert.equal(sidecarOf(admit(pod(asked())).stored)!.imagePullPolicy, undefined);
    const answer = admissionReviewResponse(review(pod(asked())), { ...defaults, imagePullPolicy: 'Never' }) as ReviewAnswer;
    const stored = applyJsonPatch(pod(asked()), JSON.parse(Buffer.from(answer.response.patch!, 'base64').toString())) as V1Pod;
    assert.equal(sidecarOf(stored)!.imagePullPolicy, 'Never');
  });

  it('keeps the proxy containers serving for the drain delay once the Pod is deleted: a preStop sleep where they have none', () => {
    const ownHook = { preStop: { exec: { command: ['/bin/drain'] } } };
    const spec = {
      containers: [
        { name: 'proxy', image: 'nginx', lifecycle: { postStart: { sleep: { seconds: 1 } } } },
        { name: 'tailscale', image: 'tailscale/tailscale', lifecycle: ownHook },
      ],
    };
    const stored = admit(pod(asked(), spec)).stored;
    assert.deepEqual(
      stored.spec!.containers[0]!.lifecycle,
      { postStart: { sleep: { seconds: 1 } }, preStop: { sleep: { seconds: 5 } } },
      'default --drain-delay',
    );
    assert.deepEqual(stored.spec!.containers[1]!.lifecycle, ownHook, "a container's own preStop is kept");
    assert.equal(sidecarOf(stored)!.lifecycle, undefined, 'certshare itself stops after the proxy');

    const longer = admit(pod(asked({ [ANNOTATION.flags]: '--drain-delay=1500ms' }), spec)).stored;
    assert.deepEqual(longer.spec!.containers[0]!.lifecycle!.preStop, { sleep: { seconds: 2 } }, 'rounded up to whole seconds');
    const none = admit(pod(asked({ [ANNOTATION.flags]: '--drain-delay=0s' }), spec)).stored;
    assert.equal(none.spec!.containers[0]!.lifecycle!.preStop, undefined, 'no drain, no hook');
  });

  it('never throws on any annotations or Pod shape, and answers every request it can identify', () => {
    const annotationValue = fc.oneof(fc.string(), fc.constantFrom('true', 'false', 'rw', 'ro', 'auto', 'none', DOMAIN, '/certs', 'a.b', '', '*.x.y'));
    const annotations = fc.dictionary(fc.constantFrom(...Object.values(ANNOTATION), 'other'), annotationValue);
    const shapes = fc.record({
      spec: fc.option(
        fc.constantFrom({}, { containers: [] }, { containers: [{ name: 'certshare' }] }, pod(undefined).spec, {
          ...pod(undefined).spec,
          containers: [
            {
              name: 'proxy',
              ports: [
                { name: 'https', containerPort: -1 },
                { name: 'https', containerPort: 'x' as unknown as number },
              ],
            },
          ],
        }),
        { nil: undefined },
      ),
    });
    fc.assert(
      fc.property(annotations, shapes, (a, shape) => {
        const p = { metadata: { annotations: a }, ...(shape.spec ? { spec: shape.spec } : {}) };
        const answer = admissionReviewResponse(review(p), defaults) as ReviewAnswer;
        assert.equal(answer.response.uid, 'uid-1');
        assert.equal(typeof answer.response.allowed, 'boolean');
        if (!answer.response.allowed) assert.match(answer.response.status!.message, /CERTSHARE_/);
      }),
      { numRuns: 500 },
    );
    assert.throws(() => admissionReviewResponse({ nonsense: true }, defaults), /no request\.uid/);
    assert.throws(() => admissionReviewResponse(null, defaults), /no request\.uid/);
  });
});

describe("the served check filled from the proxy's port (certshare.io/served-check)", () => {
  type Port = NonNullable<V1Container['ports']>[number];
  const proxy = (...ports: Port[]): V1Container => ({ name: 'proxy', image: 'nginx', ports });
  const tailscale: V1Container = {
    name: 'tailscale',
    image: 'tailscale/tailscale',
    volumeMounts: [{ name: 'tailscale-socket', mountPath: '/var/run/tailscale' }],
    ports: [{ name: 'https', containerPort: 443 }],
  };
  const withContainers = (annotations: Record<string, string>, ...containers: V1Container[]) => pod(annotations, { containers: [...containers, tailscale] });
  const servedCheckOf = (annotations: Record<string, string>, ...containers: V1Container[]) => {
    const { answer, stored } = admit(withContainers(annotations, ...containers));
    assert.equal(answer.response.allowed, true, answer.response.status?.message);
    return envOf(stored).CERTSHARE_SERVED_CHECK;
  };

  it("fills 127.0.0.1:<port> from the one TCP port named https; tailscaled's container (the socket volume's) does not count", () => {
    assert.equal(servedCheckOf(asked(), proxy({ name: 'https', containerPort: 8443 }, { name: 'metrics', containerPort: 9113 })), '127.0.0.1:8443');
    assert.equal(servedCheckOf(asked(), proxy({ name: 'https', containerPort: 443, protocol: 'TCP' })), '127.0.0.1:443');
    // In another container than the first, or in a proxy run as a native sidecar.
    assert.equal(servedCheckOf(asked(), { name: 'app', image: 'app' }, proxy({ name: 'https', containerPort: 9443 })), '127.0.0.1:9443');
    const native = pod(asked(), { initContainers: [{ ...proxy({ name: 'https', containerPort: 8443 }), restartPolicy: 'Always' }] });
    assert.equal(envOf(admit(native).stored).CERTSHARE_SERVED_CHECK, '127.0.0.1:8443');
    // The daemon's own settings take it: a Pod may now advertise a Service without writing the check.
    const advertising = admit(
      withContainers(asked({ [ANNOTATION.flags]: '--advertise-services=svc:proxy --shutdown-timeout=8s' }), proxy({ name: 'https', containerPort: 8443 })),
    );
    assert.equal(advertising.answer.response.allowed, true, advertising.answer.response.status?.message);
    assert.equal(envOf(advertising.stored).CERTSHARE_SERVED_CHECK, '127.0.0.1:8443');
  });

  it("an explicit --served-check wins: the Pod's certshare.io/flags, or the platform's --sidecar-flags", () => {
    const flags = { [ANNOTATION.flags]: '--served-check=127.0.0.1:9000' };
    assert.equal(servedCheckOf(asked(flags), proxy({ name: 'https', containerPort: 8443 })), '127.0.0.1:9000');
    const platform = admit(withContainers(asked(), proxy({ name: 'https', containerPort: 8443 })), {
      ...defaults,
      sidecarFlags: '--served-check=127.0.0.1:7443',
    });
    assert.equal(envOf(platform.stored).CERTSHARE_SERVED_CHECK, '127.0.0.1:7443');
    const both = admit(withContainers(asked(flags), proxy({ name: 'https', containerPort: 8443 })), {
      ...defaults,
      sidecarFlags: '--served-check=127.0.0.1:7443',
    });
    assert.equal(envOf(both.stored).CERTSHARE_SERVED_CHECK, '127.0.0.1:9000');
    assert.equal(sidecarOf(both.stored)!.env!.filter((e) => e.name === 'CERTSHARE_SERVED_CHECK').length, 1);
  });

  it('fills nothing, and changes nothing else, when the port is not certain', () => {
    const https = (containerPort: number): Port => ({ name: 'https', containerPort });
    const unsure: Array<[string, V1Container[]]> = [
      ['no port', [proxy()]],
      ['ports of other names only, even a single one', [proxy({ name: 'tls', containerPort: 8443 })]],
      ['a single unnamed port', [proxy({ containerPort: 443 })]],
      ['two containers with a port named https', [proxy(https(8443)), { name: 'admin', image: 'admin', ports: [https(9443)] }]],
      ['the same port named https in two containers', [proxy(https(8443)), { name: 'admin', image: 'admin', ports: [https(8443)] }]],
      ['https over UDP (QUIC) only', [proxy({ name: 'https', containerPort: 8443, protocol: 'UDP' })]],
      ['no port number', [proxy(https(0))]],
      ['a port number out of range', [proxy(https(70_000))]],
    ];
    const plain = admit(withContainers(asked(), proxy())).stored;
    for (const [what, containers] of unsure) {
      const { answer, stored } = admit(withContainers(asked(), ...containers));
      assert.equal(answer.response.allowed, true, `${what}: ${answer.response.status?.message}`);
      assert.equal(envOf(stored).CERTSHARE_SERVED_CHECK, undefined, what);
      assert.deepEqual(sidecarOf(stored), sidecarOf(plain), what);
    }
    // An init container that runs to completion serves nobody; certshare's own port is not the proxy's.
    const job = pod(asked(), { initContainers: [{ name: 'setup', image: 'setup', ports: [https(8443)] }] });
    assert.equal(envOf(admit(job).stored).CERTSHARE_SERVED_CHECK, undefined);
  });

  it('opts out with certshare.io/served-check: "off"; refuses another value, and "off" next to an explicit --served-check', () => {
    assert.equal(servedCheckOf(asked({ [ANNOTATION.servedCheck]: 'off' }), proxy({ name: 'https', containerPort: 8443 })), undefined);
    assert.equal(servedCheckOf(asked({ [ANNOTATION.servedCheck]: 'auto' }), proxy({ name: 'https', containerPort: 8443 })), '127.0.0.1:8443');
    const refused: Array<[Record<string, string>, RegExp]> = [
      [asked({ [ANNOTATION.servedCheck]: 'on' }), /certshare\.io\/served-check: "on" is neither "auto" nor "off"/],
      [asked({ [ANNOTATION.servedCheck]: '127.0.0.1:8443' }), /certshare\.io\/served-check: "127\.0\.0\.1:8443" is neither/],
      [
        asked({ [ANNOTATION.servedCheck]: 'off', [ANNOTATION.flags]: '--served-check=127.0.0.1:8443' }),
        /certshare\.io\/served-check: "off", while certshare\.io\/flags sets --served-check: keep one of the two/,
      ],
    ];
    for (const [annotations, message] of refused) {
      const { answer } = admit(withContainers(annotations, proxy({ name: 'https', containerPort: 8443 })));
      assert.equal(answer.response.allowed, false, JSON.stringify(annotations));
      assert.match(answer.response.status!.message, message);
      assert.match(answer.response.status!.message, /\[CERTSHARE_BAD_ANNOTATION\]$/);
    }
    // "off" does not take away what the platform set for every sidecar (a Pod may change its value, not drop it).
    const platform = admit(withContainers(asked({ [ANNOTATION.servedCheck]: 'off' }), proxy()), { ...defaults, sidecarFlags: '--served-check=127.0.0.1:7443' });
    assert.equal(envOf(platform.stored).CERTSHARE_SERVED_CHECK, '127.0.0.1:7443');
  });

  it('is idempotent: reinvoked on the Pod it filled, or after another webhook added or changed a port named https, the Pod is left as it is', () => {
    const once = admit(withContainers(asked(), proxy({ name: 'https', containerPort: 8443 }))).stored;
    assert.equal(envOf(once).CERTSHARE_SERVED_CHECK, '127.0.0.1:8443');
    const later = (change: (p: V1Pod) => void) => {
      const p = structuredClone(once);
      change(p);
      return p;
    };
    const reinvoked: Array<[string, V1Pod]> = [
      ['as stored', once],
      [
        'a second https container added',
        later((p) => p.spec!.containers.push({ name: 'mesh', image: 'mesh', ports: [{ name: 'https', containerPort: 15443 }] })),
      ],
      ['the port renumbered', later((p) => (p.spec!.containers[0]!.ports![0]!.containerPort = 9443))],
    ];
    for (const [what, p] of reinvoked) {
      const again = admit(p);
      assert.equal(again.answer.response.allowed, true, `${what}: ${again.answer.response.status?.message}`);
      assert.equal(again.answer.response.patch, undefined, what);
      assert.equal(injectionFor(p, defaults).kind, 'skip', what);
    }
    // Injected without a port named https, then given one by a later webhook: still left alone.
    const unfilled = admit(withContainers(asked(), proxy())).stored;
    unfilled.spec!.containers[0]!.ports = [{ name: 'https', containerPort: 8443 }];
    assert.equal(admit(unfilled).answer.response.patch, undefined);
    assert.equal(injectionFor(unfilled, defaults).kind, 'skip');
    // A certshare container the injector did not write: a served check it could not have filled is refused.
    for (const value of ['10.0.0.5:8443', '127.0.0.1:0', 'localhost:8443']) {
      const p = structuredClone(once);
      sidecarOf(p)!.env!.find((e) => e.name === 'CERTSHARE_SERVED_CHECK')!.value = value;
      const { answer } = admit(p);
      assert.equal(answer.response.allowed, false, value);
      assert.match(answer.response.status!.message, /brings its own container named certshare \(its env is not the injector's\)/, value);
    }
  });
});

describe('a reload signal the Pod asks for (nginx with a stock configuration)', () => {
  const tailscaleSidecar = {
    name: 'tailscale',
    image: 'tailscale/tailscale',
    restartPolicy: 'Always',
    volumeMounts: [{ name: 'tailscale-socket', mountPath: '/var/run/tailscale' }],
  };
  const nginxPod = (more: Record<string, string> = {}, spec: Partial<V1Pod['spec']> = {}) =>
    pod(asked({ [ANNOTATION.reloadSignal]: 'HUP', [ANNOTATION.reloadPidfile]: '/run/nginx/nginx.pid', ...more }), {
      containers: [{ name: 'proxy', image: 'nginx', volumeMounts: [{ name: 'nginx-run', mountPath: '/run/nginx' }] }],
      // tailscaled as a native sidecar: it must not wait for certshare's startup probe.
      initContainers: [tailscaleSidecar],
      volumes: [
        { name: 'tailscale-socket', emptyDir: {} },
        { name: 'nginx-run', emptyDir: {} },
      ],
      ...spec,
    });

  it('shares the process namespace, gives certshare the signal and the pid file, and mounts its volume read-only at the same path', () => {
    const { answer, stored } = admit(nginxPod());
    assert.equal(answer.response.allowed, true, answer.response.status?.message);
    assert.equal(stored.spec!.shareProcessNamespace, true);
    assert.equal(envOf(stored).CERTSHARE_RELOAD_SIGNAL, 'HUP');
    assert.equal(envOf(stored).CERTSHARE_RELOAD_PIDFILE, '/run/nginx/nginx.pid');
    assert.deepEqual(
      sidecarOf(stored)!.volumeMounts!.find((m) => m.name === 'nginx-run'),
      { name: 'nginx-run', mountPath: '/run/nginx', readOnly: true },
    );
    // The sidecar stays without any capability: the signal works by uid, not by CAP_KILL.
    assert.deepEqual(sidecarOf(stored)!.securityContext, SIDECAR_SECURITY_CONTEXT);
  });

  it('shares nothing when the Pod does not ask', () => {
    const { stored } = admit(pod(asked()));
    assert.equal(stored.spec!.shareProcessNamespace, undefined);
    assert.equal(envOf(stored).CERTSHARE_RELOAD_SIGNAL, undefined);
  });

  it('refuses a signal outside the allow list, a pid file without a volume, half a request, and an explicit no', () => {
    const cases: [V1Pod, RegExp][] = [
      [nginxPod({ [ANNOTATION.reloadSignal]: 'TERM' }), /certshare\.io\/reload-signal: must be one of HUP, USR1, USR2/],
      [nginxPod({ [ANNOTATION.reloadSignal]: 'KILL' }), /must be one of HUP, USR1, USR2/],
      [nginxPod({ [ANNOTATION.reloadPidfile]: '/tmp/nginx.pid' }), /"\/tmp\/nginx\.pid" lies in no volume a container of the Pod mounts/],
      [nginxPod({ [ANNOTATION.reloadPidfile]: '/run/nginx/../../etc/passwd' }), /not an absolute file path without "\.\."/],
      [nginxPod({ [ANNOTATION.reloadPidfile]: 'nginx.pid' }), /not an absolute file path/],
      [pod(asked({ [ANNOTATION.reloadSignal]: 'HUP' })), /certshare\.io\/reload-signal: needs certshare\.io\/reload-pidfile/],
      [pod(asked({ [ANNOTATION.reloadPidfile]: '/run/nginx/nginx.pid' })), /certshare\.io\/reload-pidfile: needs certshare\.io\/reload-signal/],
      [nginxPod({}, { shareProcessNamespace: false }), /shareProcessNamespace: false/],
      // Only the annotations set it, never the Pod's flags (which are an allow list).
      [pod(asked({ [ANNOTATION.flags]: '--reload-signal=HUP' })), /--reload-signal is set by certshare\.io\/reload-signal, not here/],
    ];
    for (const [p, message] of cases) {
      const { answer } = admit(p);
      assert.equal(answer.response.allowed, false, JSON.stringify(p.metadata?.annotations));
      assert.match(answer.response.status!.message, message);
    }
  });

  it('waits for the certificate before the proxy starts: a startup probe, only when the proxy reads it at start', () => {
    const probe = sidecarOf(admit(nginxPod()).stored)!.startupProbe;
    assert.deepEqual(probe?.httpGet, { path: '/healthz', port: 9002 });
    assert.equal(sidecarOf(admit(pod(asked())).stored)!.startupProbe, undefined, 'the per-handshake nginx starts without it');
  });

  it('HAProxy: the PEMs under the out-dir, the runtime API socket from its volume; nothing else opened', () => {
    const haproxyPod = pod(asked({ [ANNOTATION.haproxySocket]: '/run/haproxy/admin.sock' }), {
      containers: [{ name: 'proxy', image: 'haproxy', volumeMounts: [{ name: 'haproxy-run', mountPath: '/run/haproxy' }] }],
      initContainers: [tailscaleSidecar],
      volumes: [
        { name: 'tailscale-socket', emptyDir: {} },
        { name: 'haproxy-run', emptyDir: {} },
      ],
    });
    const { answer, stored } = admit(haproxyPod);
    assert.equal(answer.response.allowed, true, answer.response.status?.message);
    assert.equal(envOf(stored).CERTSHARE_HAPROXY_CRT_DIR, '/certs/haproxy');
    assert.equal(envOf(stored).CERTSHARE_HAPROXY_SOCKET, '/run/haproxy/admin.sock');
    assert.deepEqual(
      sidecarOf(stored)!.volumeMounts!.find((m) => m.name === 'haproxy-run'),
      { name: 'haproxy-run', mountPath: '/run/haproxy', readOnly: true },
    );
    assert.equal(stored.spec!.shareProcessNamespace, undefined, 'a socket needs no shared process namespace');
    assert.ok(sidecarOf(stored)!.startupProbe);
    for (const [annotations, message] of [
      [{ [ANNOTATION.haproxySocket]: 'admin.sock' }, /certshare\.io\/haproxy-socket: "admin\.sock" is not an absolute file path/],
      [{ [ANNOTATION.haproxySocket]: '/run/haproxy/admin.sock' }, /container "tailscale", which mounts tailscaled's socket volume .*native sidecar/],
      [{ [ANNOTATION.flags]: '--haproxy-socket=/run/haproxy/admin.sock' }, /--haproxy-socket is set by certshare\.io\/haproxy-socket/],
    ] as const) {
      const refused = admit(pod(asked(annotations))).answer;
      assert.equal(refused.response.allowed, false, JSON.stringify(annotations));
      assert.match(refused.response.status!.message, message);
    }
  });

  it("refuses it next to the platform's --reload-command, with the daemon's own message", () => {
    const { answer } = admit(nginxPod(), { ...defaults, sidecarFlags: '--reload-command=true' });
    assert.equal(answer.response.allowed, false);
    assert.match(answer.response.status!.message, /--reload-command: give it or --reload-signal, not both/);
  });
});

describe('the injected sidecar and the daemon', () => {
  it("configures certshare run through flags it accepts: the injected environment parses into the daemon's settings", async () => {
    const { envName, parseFlags } = await import('../../../src/flags/flags.ts');
    const { RUN_FLAGS, daemonConfigFrom } = await import('../../../src/config/run-options.ts');
    const flags = '--routing-check=http://a/healthz\n  --routing-check=http://b/healthz --drain-delay=2s';
    const { stored } = admit(pod(asked({ [ANNOTATION.domains]: `${DOMAIN},b.example.com`, [ANNOTATION.mode]: 'ro', [ANNOTATION.flags]: flags })));
    const env: NodeJS.ProcessEnv = { POD_NAME: 'proxy-0', POD_NAMESPACE: 'proxy', POD_IPS: '10.0.0.1' };
    for (const e of sidecarOf(stored)!.env!) if (e.value !== undefined) env[e.name] = e.value;
    // And the C library's settings, read by glibc as the process starts.
    const known = new Set(['POD_NAME', 'POD_NAMESPACE', 'POD_IPS', 'GLIBC_TUNABLES', ...RUN_FLAGS.map((f) => envName(f.name))]);
    for (const name of Object.keys(env)) assert.ok(known.has(name), `${name} is not read by certshare run`);
    const config = daemonConfigFrom(parseFlags(RUN_FLAGS, [], env), env);
    assert.deepEqual(
      [config.domains, config.mode, config.store, config.outDir, config.readinessGate, config.localapi, config.listen],
      [[DOMAIN, 'b.example.com'], 'ro', { kind: 'kube' }, '/certs', DEFAULT_READINESS_GATE, '/var/run/tailscale/tailscaled.sock', { host: '::', port: 9002 }],
    );
    // certshare.io/flags: in the order written, a repeated flag as its comma-separated variable.
    assert.deepEqual([config.routingChecks, config.drainDelayMs], [['http://a/healthz', 'http://b/healthz'], 2000]);
  });
});

describe("the platform's CA bundle for the sidecar (--sidecar-ca-configmap): a private ACME CA", () => {
  const withCa: InjectionDefaults = { ...defaults, caBundle: { configMap: 'acme-ca', key: 'root.pem' } };
  const CA_VOLUME = 'certshare-ca';
  const configMapVolumes = (p: V1Pod) => (p.spec!.volumes ?? []).filter((v) => v.configMap);
  /** A Pod with an init container of its own besides the proxies: none of them may see the bundle. */
  const withInit = (annotations: Record<string, string>) =>
    pod(annotations, { initContainers: [{ name: 'setup', image: 'busybox', volumeMounts: [{ name: 'tailscale-socket', mountPath: '/run' }] }] });

  it("mounts its one key read-only into certshare's container only, the file NODE_EXTRA_CA_CERTS names", () => {
    const { answer, stored } = admit(withInit(asked()), withCa);
    assert.equal(answer.response.allowed, true);
    assert.deepEqual(configMapVolumes(stored), [
      { name: CA_VOLUME, configMap: { name: 'acme-ca', items: [{ key: 'root.pem', path: 'ca.crt' }], optional: false } },
    ]);
    assert.equal(`${CA_DIR}/${configMapVolumes(stored)[0]!.configMap!.items![0]!.path}`, CA_FILE, 'the file the variable names is the projected key');
    const sidecar = sidecarOf(stored)!;
    assert.deepEqual(
      sidecar.volumeMounts!.find((m) => m.name === CA_VOLUME),
      { name: CA_VOLUME, mountPath: CA_DIR, readOnly: true },
    );
    assert.equal(envOf(stored).NODE_EXTRA_CA_CERTS, CA_FILE);
    const others = [...stored.spec!.containers, ...stored.spec!.initContainers!.filter((c) => c.name !== SIDECAR_NAME)];
    assert.deepEqual(
      others.map((c) => c.name),
      ['proxy', 'tailscale', 'setup'],
    );
    for (const c of others) {
      assert.ok(!c.volumeMounts?.some((m) => m.name === CA_VOLUME), `${c.name} does not mount the bundle`);
      assert.ok(!c.env?.some((e) => e.name === 'NODE_EXTRA_CA_CERTS'), `${c.name} is not told of it`);
    }
    // The rest of the sidecar is what it is without the bundle.
    const plain = admit(withInit(asked())).stored;
    assert.deepEqual(configMapVolumes(plain), []);
    assert.equal(envOf(plain).NODE_EXTRA_CA_CERTS, undefined);
    assert.deepEqual(
      {
        ...sidecar,
        env: sidecar.env!.filter((e) => e.name !== 'NODE_EXTRA_CA_CERTS'),
        volumeMounts: sidecar.volumeMounts!.filter((m) => m.name !== CA_VOLUME),
      },
      sidecarOf(plain),
    );
  });

  it("is the platform's alone: no annotation or flag of a Pod names, changes or drops it", () => {
    for (const flag of ['--sidecar-ca-configmap=mine', '--node-extra-ca-certs=/var/run/tailscale/ca.pem', '--ca-configmap=mine']) {
      const { answer } = admit(pod(asked({ [ANNOTATION.flags]: flag })), withCa);
      assert.equal(answer.response.allowed, false, flag);
      assert.match(answer.response.status!.message, /is not a flag of "certshare run"/, flag);
      // Nor through the platform's own --sidecar-flags: the injector flag is the one way in.
      assert.throws(() => checkSidecarFlags(flag), /is not a flag of "certshare run"/);
    }
    // Annotations the injector does not know change nothing.
    const guesses = { 'certshare.io/sidecar-ca-configmap': 'mine', 'certshare.io/ca-configmap': 'mine', 'certshare.io/node-extra-ca-certs': '/x' };
    assert.deepEqual(configMapVolumes(admit(pod(asked(guesses))).stored), []);
    assert.deepEqual(
      configMapVolumes(admit(pod(asked(guesses)), withCa).stored).map((v) => v.configMap),
      [{ name: 'acme-ca', items: [{ key: 'root.pem', path: 'ca.crt' }], optional: false }],
    );
    // Whatever a Pod's annotations say, an injected sidecar trusts exactly what the platform set: the
    // platform's bundle or none, and it is the one ConfigMap volume the injector adds.
    const token = fc.constantFrom('--sidecar-ca-configmap=mine', '--log-level=debug', '--drain-delay=1s', '--acme-directory=https://evil.example/dir');
    const annotations = fc.record(
      {
        [ANNOTATION.flags]: fc.array(token, { maxLength: 3 }).map((t) => t.join(' ')),
        [ANNOTATION.outDir]: fc.constantFrom('/certs', '/tls', CA_DIR, '/etc/certshare'),
        'certshare.io/sidecar-ca-configmap': fc.constantFrom('mine', 'acme-ca:other'),
      },
      { requiredKeys: [] },
    );
    fc.assert(
      fc.property(annotations, fc.boolean(), (more, platform) => {
        const { answer, stored } = admit(pod(asked(more)), platform ? withCa : defaults);
        if (!answer.response.allowed) return;
        assert.equal(envOf(stored).NODE_EXTRA_CA_CERTS, platform ? CA_FILE : undefined);
        assert.deepEqual(
          configMapVolumes(stored).map((v) => v.configMap!.name),
          platform ? ['acme-ca'] : [],
        );
      }),
      { numRuns: 200 },
    );
  });

  it("refuses an out-dir on, above or below a directory certshare's container mounts for itself", () => {
    for (const outDir of [CA_DIR, `${CA_DIR}/`, '/etc/certshare', `${CA_DIR}/certs`, '/etc', '/', '/var/run/tailscale', '/var/run', TOKEN_DIR]) {
      const { answer } = admit(pod(asked({ [ANNOTATION.outDir]: outDir })), withCa);
      assert.equal(answer.response.allowed, false, outDir);
      assert.match(answer.response.status!.message, /certshare\.io\/out-dir: ".*" overlaps \/\S+, which certshare's container mounts for itself/, outDir);
    }
    for (const outDir of ['/certs', '/etc/certshare-certs', '/etc/tls', '/var/run/certs'])
      assert.equal(admit(pod(asked({ [ANNOTATION.outDir]: outDir })), withCa).answer.response.allowed, true, outDir);
    // Without the bundle its directory is free.
    assert.equal(admit(pod(asked({ [ANNOTATION.outDir]: CA_DIR }))).answer.response.allowed, true);
  });

  it('reads NAME[:KEY] when the injector starts (key ca.crt by default), from the flag or its variable', () => {
    const read = (args: string[], env: NodeJS.ProcessEnv = {}) => injectorConfigFrom(parseFlags(INJECTOR_FLAGS, args, env), {}).defaults.caBundle;
    assert.equal(read([]), undefined);
    assert.deepEqual(read(['--sidecar-ca-configmap', 'acme-ca']), { configMap: 'acme-ca', key: 'ca.crt' });
    assert.deepEqual(read(['--sidecar-ca-configmap', 'trust.example.com:bundle.pem']), { configMap: 'trust.example.com', key: 'bundle.pem' });
    assert.deepEqual(read([], { CERTSHARE_SIDECAR_CA_CONFIGMAP: 'acme-ca:Root_CA-2.crt' }), { configMap: 'acme-ca', key: 'Root_CA-2.crt' });
    const refused: [string, RegExp][] = [
      ['Acme', /must be NAME or NAME:KEY with NAME a ConfigMap name .*got "Acme"/],
      ['acme_ca', /got "acme_ca"/],
      ['-acme', /got "-acme"/],
      ['acme.', /got "acme\."/],
      [':ca.crt', /got ":ca\.crt"/],
      ['a'.repeat(254), /must be NAME or NAME:KEY/],
      ['acme:ca.crt:x', /got "acme:ca\.crt:x"/],
      ['acme:', /"" is not a ConfigMap key/],
      ['acme:../ca.crt', /"\.\.\/ca\.crt" is not a ConfigMap key/],
      ['acme:certs/ca.crt', /is not a ConfigMap key/],
      ['acme:..ca', /is not a ConfigMap key/],
      ['acme:.', /is not a ConfigMap key/],
      [`acme:${'k'.repeat(254)}`, /is not a ConfigMap key/],
    ];
    for (const [value, message] of refused) {
      assert.throws(() => read([`--sidecar-ca-configmap=${value}`]), { code: 'CERTSHARE_BAD_FLAG', message }, value);
    }
  });

  it('refuses at start injector defaults that would refuse every Pod: an out-dir over the bundle, or over the socket', () => {
    const start = (args: string[]) => {
      const config = injectorConfigFrom(parseFlags(INJECTOR_FLAGS, args, {}), {});
      checkDefaults(config.defaults);
      return config;
    };
    const cases: [string[], RegExp][] = [
      [['--sidecar-ca-configmap', 'acme-ca', '--default-out-dir', '/etc/certshare'], /"\/etc\/certshare" overlaps \/etc\/certshare\/ca/],
      [['--default-out-dir', '/var/run/tailscale'], /"\/var\/run\/tailscale" overlaps \/var\/run\/tailscale/],
      [['--default-out-dir', 'certs'], /"certs" is not an absolute path/],
    ];
    for (const [args, message] of cases) {
      assert.throws(
        () => start(args),
        { code: 'CERTSHARE_BAD_FLAG', message: /^the injector's defaults \(--default-\*, --sidecar-\*\): would refuse every Pod/ },
        args.join(' '),
      );
      assert.throws(() => start(args), { message }, args.join(' '));
    }
    // What a Pod may still change is not held against the defaults: a drain only a Pod's own grace period allows.
    assert.equal(start(['--sidecar-flags=--drain-delay=45s', '--sidecar-ca-configmap', 'acme-ca']).defaults.outDir, '/certs');
  });

  it('stops `certshare injector` at start on a bad value: exit 2, the reason on stderr, before any connection', async () => {
    const main = fileURLToPath(new URL('../../../src/cli/main.ts', import.meta.url));
    // No kubeconfig at all: a start that got past the flags would fail on the credentials instead (exit 1).
    const child = spawn(process.execPath, [main, 'injector', '--sidecar-ca-configmap', 'Trust_Bundle'], {
      env: { PATH: process.env.PATH, HOME: '/nonexistent' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    const [code] = (await once(child, 'close')) as [number | null];
    assert.equal(code, 2, stderr);
    assert.match(stderr, /--sidecar-ca-configmap: must be NAME or NAME:KEY .*got "Trust_Bundle" \[CERTSHARE_BAD_FLAG\]/);
  });
});
