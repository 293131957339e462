// The injector's grant of tailscaled's operator right to a sidecar that advertises Tailscale Services: what
// tailscaled's container gets (a passwd entry, --operator through containerboot's TS_EXTRA_ARGS), and every
// Pod it refuses rather than guess. That the grant works is checked on the real cluster (test/cluster/e2e).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1Container, V1Pod } from '../../../src/kube/transport/client-node.ts';
import { ANNOTATION, STOP_FITTED_ANNOTATION, admissionReviewResponse } from '../../../src/injector/mutate.ts';
import type { InjectionDefaults } from '../../../src/config/injection-defaults.ts';
import { ADVERTISE_AGENT_COMMAND } from '../../../src/injector/sidecar.ts';
import {
  ADVERTISE_OWNER_ANNOTATION,
  OPERATOR_ANNOTATION,
  OPERATOR_HOOK,
  PASSWD_ANNOTATION,
  PROXY_GROUP_SOCKET,
} from '../../../src/injector/tailscale-operator.ts';
import { TEST_INJECTION_DEFAULTS } from '../../support/injector-example.ts';
import { applyJsonPatch } from '../../support/json-patch.ts';
import { operatorProxyGroupPod, PROXY_GROUP_FLAGS } from '../../support/proxy-group-pod.ts';

const defaults = TEST_INJECTION_DEFAULTS;
const ADVERTISING = PROXY_GROUP_FLAGS;
const SOCKET_MOUNT = { name: 'tailscale-socket', mountPath: '/var/run/tailscale' };

function pod(flags: string | undefined, tailscale: Partial<V1Container> = {}, more: Record<string, string> = {}): V1Pod {
  return {
    metadata: {
      name: 'proxy-0',
      annotations: {
        [ANNOTATION.inject]: 'true',
        [ANNOTATION.domains]: 'proxy.tailnet-0000.ts.net',
        ...(flags ? { [ANNOTATION.flags]: flags } : {}),
        ...more,
      },
    },
    spec: {
      containers: [
        { name: 'proxy', image: 'nginx' },
        { name: 'tailscale', image: 'tailscale/tailscale', volumeMounts: [SOCKET_MOUNT], ...tailscale },
      ],
      volumes: [{ name: 'tailscale-socket', emptyDir: {} }],
    },
  };
}

function admit(p: V1Pod, injectorDefaults = defaults, namespace = 'default'): { allowed: boolean; message?: string; stored: V1Pod; patched: boolean } {
  const review = {
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: { uid: 'u', kind: { kind: 'Pod' }, operation: 'CREATE', namespace, object: p },
  };
  const { response } = admissionReviewResponse(review, injectorDefaults) as {
    response: { allowed: boolean; patch?: string; status?: { message: string } };
  };
  const patch = response.patch ? JSON.parse(Buffer.from(response.patch, 'base64').toString()) : [];
  return { allowed: response.allowed, message: response.status?.message, stored: applyJsonPatch(p, patch) as V1Pod, patched: patch.length > 0 };
}

const tailscaleOf = (p: V1Pod) => [...(p.spec!.initContainers ?? []), ...p.spec!.containers].find((c) => c.name === 'tailscale')!;
const extraArgs = (p: V1Pod) => tailscaleOf(p).env?.filter((e) => e.name.includes('EXTRA_ARGS'));

describe("the injector's tailscaled operator grant", () => {
  it('a Pod that advertises: tailscaled resolves the advertise agent by name (a passwd file from the downward API) and names it operator', () => {
    const { allowed, message, stored } = admit(pod(ADVERTISING));
    assert.equal(allowed, true, message);
    const passwd = stored.metadata!.annotations![PASSWD_ANNOTATION]!;
    assert.match(passwd, /^certshare-advertise:x:65533:65533:/m, "the advertise agent's uid is the operator");
    assert.doesNotMatch(passwd, /:65532:/, "certshare's uid is nobody tailscaled can name");
    assert.match(passwd, /^root:x:0:0:/m, 'root stays resolvable for containerboot and tailscaled');
    assert.deepEqual(extraArgs(stored), [{ name: 'TS_EXTRA_ARGS', value: '--operator=certshare-advertise' }]);
    const tailscale = tailscaleOf(stored);
    const mount = tailscale.volumeMounts!.find((m) => m.mountPath === '/etc/passwd');
    assert.deepEqual(mount, { name: 'certshare-tailscaled-passwd', mountPath: '/etc/passwd', subPath: 'passwd', readOnly: true });
    assert.deepEqual(stored.spec!.volumes!.find((v) => v.name === mount!.name)?.downwardAPI, {
      items: [{ path: 'passwd', fieldRef: { fieldPath: `metadata.annotations['${PASSWD_ANNOTATION}']` } }],
    });
    // Only tailscaled's container: the proxy's is as before (but for the preStop and the certs mount).
    const proxy = stored.spec!.containers.find((c) => c.name === 'proxy')!;
    assert.equal(proxy.env, undefined);
    assert.ok(!proxy.volumeMounts!.some((m) => m.mountPath === '/etc/passwd'));
    // Called again on the Pod it injected: nothing more.
    assert.equal(admit(stored).patched, false);
  });

  it("advertises through the agent's container (its own uid, no token, no port), never by certshare's own prefs edits", () => {
    for (const p of [pod(ADVERTISING), pod(ADVERTISING, {}, { [OPERATOR_ANNOTATION]: 'manual' })]) {
      const { allowed, message, stored } = admit(p);
      assert.equal(allowed, true, message);
      const agent = stored.spec!.containers.find((c) => c.name === 'certshare-advertise')!;
      const certshare = stored.spec!.initContainers!.find((c) => c.name === 'certshare')!;
      assert.deepEqual([agent.command, agent.args], [ADVERTISE_AGENT_COMMAND, undefined], "the agent's own script");
      assert.equal(agent.image, certshare.image);
      assert.deepEqual(agent.env, [
        { name: 'CERTSHARE_ADVERTISE_SERVICES', value: 'svc:proxy' },
        { name: 'CERTSHARE_EXCHANGE', value: '/run/certshare-advertise' },
        { name: 'CERTSHARE_LOCALAPI', value: '/var/run/tailscale/tailscaled.sock' },
      ]);
      assert.equal(agent.securityContext?.runAsUser, 65533);
      assert.equal(agent.securityContext?.readOnlyRootFilesystem, true);
      assert.deepEqual(agent.securityContext?.capabilities, { drop: ['ALL'] });
      assert.equal(agent.ports, undefined);
      assert.ok(!agent.volumeMounts!.some((m) => m.mountPath.startsWith('/var/run/secrets')), 'no token');
      assert.equal(agent.lifecycle?.preStop?.httpGet?.path, '/leave-rotation', 'stays until certshare withdrew');
      const mode = (c: V1Container, name: string) => (c.volumeMounts!.find((m) => m.name === name)?.readOnly ? 'ro' : 'rw');
      assert.deepEqual(
        ['certshare-advertise-request', 'certshare-advertise-status'].map((v) => [mode(certshare, v), mode(agent, v)]),
        [
          ['rw', 'ro'],
          ['ro', 'rw'],
        ],
        'each side writes its own volume only',
      );
      assert.ok(certshare.env!.some((e) => e.name === 'CERTSHARE_ADVERTISE_AGENT' && e.value === '/run/certshare-advertise'));
      assert.equal(admit(stored).patched, false, 'called again: nothing more');
    }
    assert.ok(!admit(pod(undefined)).stored.spec!.containers.some((c) => c.name === 'certshare-advertise'), 'no agent without Services');
  });

  it('a Pod that does not advertise, says manual, or whose platform says manual: nothing of the kind', () => {
    const cases: Array<[V1Pod, InjectionDefaults]> = [
      [pod(undefined), defaults],
      [pod(ADVERTISING, {}, { [OPERATOR_ANNOTATION]: 'manual' }), defaults],
      [pod(ADVERTISING), { ...defaults, grantTailscaleOperator: false }],
    ];
    for (const [p, d] of cases) {
      const { allowed, message, stored } = admit(p, d);
      assert.equal(allowed, true, message);
      assert.equal(stored.metadata!.annotations![PASSWD_ANNOTATION], undefined);
      assert.deepEqual(extraArgs(stored) ?? [], []);
      assert.ok(!stored.spec!.volumes!.some((v) => v.downwardAPI));
    }
  });

  it("TS_EXTRA_ARGS keeps what it held: a value is extended, a Secret's or ConfigMap's is referenced under another name", () => {
    const literal = admit(pod(ADVERTISING, { env: [{ name: 'TS_EXTRA_ARGS', value: '--login-server=https://hs.example' }] })).stored;
    assert.deepEqual(extraArgs(literal), [{ name: 'TS_EXTRA_ARGS', value: '--login-server=https://hs.example --operator=certshare-advertise' }]);
    const already = admit(pod(ADVERTISING, { env: [{ name: 'TS_EXTRA_ARGS', value: '--operator=certshare-advertise' }] })).stored;
    assert.deepEqual(extraArgs(already), [{ name: 'TS_EXTRA_ARGS', value: '--operator=certshare-advertise' }]);
    const valueFrom = { configMapKeyRef: { name: 'tailscale', key: 'TS_EXTRA_ARGS' } };
    const referenced = admit(pod(ADVERTISING, { env: [{ name: 'TS_EXTRA_ARGS', valueFrom }], envFrom: [{ configMapRef: { name: 'tailscale' } }] })).stored;
    // The kubelet expands $(NAME) from the variables before it.
    assert.deepEqual(extraArgs(referenced), [
      { name: 'TS_EXTRA_ARGS_BEFORE_OPERATOR', valueFrom },
      { name: 'TS_EXTRA_ARGS', value: '$(TS_EXTRA_ARGS_BEFORE_OPERATOR) --operator=certshare-advertise' },
    ]);
  });

  it('tailscaled as a native sidecar (an init container) is granted the same way', () => {
    const p = pod(ADVERTISING);
    const tailscale = p.spec!.containers.pop()!;
    p.spec!.initContainers = [{ ...tailscale, restartPolicy: 'Always' }];
    const { allowed, message, stored } = admit(p);
    assert.equal(allowed, true, message);
    assert.deepEqual(extraArgs(stored), [{ name: 'TS_EXTRA_ARGS', value: '--operator=certshare-advertise' }]);
  });

  it('refuses, naming the way out, what it cannot grant without losing something', () => {
    const twoMounting = pod(ADVERTISING);
    twoMounting.spec!.containers[0]!.volumeMounts = [SOCKET_MOUNT];
    const cases: Array<[V1Pod, RegExp]> = [
      [
        pod(ADVERTISING, { envFrom: [{ configMapRef: { name: 'tailscale' } }] }),
        /takes variables from envFrom, which may hold TS_EXTRA_ARGS: declare TS_EXTRA_ARGS in its env/,
      ],
      [pod(ADVERTISING, { env: [{ name: 'TS_EXTRA_ARGS', value: '--operator=alice' }] }), /names another operator \("--operator=alice"\)/],
      [pod(ADVERTISING, { env: [{ name: 'TS_EXTRA_ARGS', value: '--operator bob' }] }), /names another operator/],
      [pod(ADVERTISING, { volumeMounts: [SOCKET_MOUNT, { name: 'etc', mountPath: '/etc/passwd', subPath: 'passwd' }] }), /mounts its own \/etc\/passwd/],
      [twoMounting, /the one that mounts the socket volume "tailscale-socket", and 2 do \(proxy, tailscale\)/],
      [pod(ADVERTISING, {}, { [OPERATOR_ANNOTATION]: 'yes' }), /"yes" is neither "grant" nor "manual"/],
    ];
    for (const [p, problem] of cases) {
      const { allowed, message } = admit(p);
      assert.equal(allowed, false);
      assert.match(message!, problem);
      if (!/neither/.test(problem.source)) assert.match(message!, /certshare\.io\/tailscale-operator: manual/);
    }
  });

  it("tailscaled from a config file (containerboot's TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR): no advertisement, the file's owner advertises", () => {
    const configDir = { env: [{ name: 'TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR', value: '/etc/tsconfig/proxy-0' }] };
    const bootstrapping = { ...defaults, sidecarFlags: `${defaults.sidecarFlags ?? ''} --advertise-bootstrap=true`.trim() };
    for (const [p, platform] of [
      [pod(ADVERTISING, configDir), defaults],
      [pod(`${ADVERTISING} --advertise-failover=20s`, configDir), bootstrapping],
    ] as const) {
      const { allowed, message, stored } = admit(p, platform);
      assert.equal(allowed, true, message);
      const certshare = stored.spec!.initContainers!.find((c) => c.name === 'certshare')!;
      assert.deepEqual(
        certshare.env!.filter((e) => e.name.startsWith('CERTSHARE_ADVERTISE') || e.name === 'CERTSHARE_LEAVE_TOKEN'),
        [{ name: 'CERTSHARE_ADVERTISE_LEFT_TO_FILE', value: 'svc:proxy' }],
        'certshare is not told to advertise, only which Services the file owns, to say so',
      );
      assert.ok(
        certshare.env!.some((e) => e.name === 'CERTSHARE_SERVED_CHECK' && e.value === '127.0.0.1:8443'),
        'it still checks what the proxy serves',
      );
      assert.equal(
        stored.spec!.containers.find((c) => c.name === 'certshare-advertise'),
        undefined,
        'no advertise agent',
      );
      // containerboot refuses TS_EXTRA_ARGS beside a config dir: the grant would stop tailscaled from starting.
      assert.deepEqual(tailscaleOf(stored).env, configDir.env, "tailscaled's container unchanged");
      assert.equal(stored.metadata!.annotations![PASSWD_ANNOTATION], undefined);
      assert.equal(stored.metadata!.annotations![ADVERTISE_OWNER_ANNOTATION], 'config-file: container tailscale sets TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR');
      assert.equal(admit(stored, platform).patched, false, 'called again: nothing more');
    }
    // Without the variable, the same Pod gets the agent.
    assert.ok(admit(pod(ADVERTISING)).stored.spec!.containers.some((c) => c.name === 'certshare-advertise'));
  });

  // Tailscale's operator runs a ProxyGroup replica's tailscaled from its config file, as root, and names no operator:
  // only a hook in tailscaled's own container can name one. The platform lists the namespaces where the operator alone
  // creates Pods; labels are only the shape a tenant can copy.
  const PROXY_GROUP = { 'tailscale.com/managed': 'true', 'tailscale.com/parent-resource-type': 'proxygroup', 'tailscale.com/parent-resource': 'ingress' };
  const configDir = { env: [{ name: 'TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR', value: '/etc/tsconfig/proxy-0' }] };
  const optedIn = { ...defaults, proxyGroupNamespaces: ['tailscale'] };
  const proxyGroupPod = (tailscale: Partial<V1Container> = configDir): V1Pod => {
    const p = pod(ADVERTISING, tailscale);
    return { ...p, metadata: { ...p.metadata, labels: PROXY_GROUP } };
  };

  it("an operator's ProxyGroup Pod the platform opted in: the agent, made tailscaled's operator by a postStart hook in tailscaled's container", () => {
    const { allowed, message, stored } = admit(proxyGroupPod(), optedIn, 'tailscale');
    assert.equal(allowed, true, message);
    const certshare = stored.spec!.initContainers!.find((c) => c.name === 'certshare')!;
    const advertising = certshare.env!.filter((e) => e.name.startsWith('CERTSHARE_ADVERTISE')).map((e) => e.name);
    assert.ok(advertising.includes('CERTSHARE_ADVERTISE_SERVICES') && advertising.includes('CERTSHARE_ADVERTISE_AGENT'), advertising.join());
    assert.ok(!advertising.includes('CERTSHARE_ADVERTISE_LEFT_TO_FILE'));
    const agent = stored.spec!.containers.find((c) => c.name === 'certshare-advertise')!;
    assert.equal(agent.securityContext?.runAsUser, 65533, 'the agent keeps its own uid: no root container');
    assert.equal(agent.securityContext?.runAsNonRoot, true);
    const tailscale = tailscaleOf(stored);
    assert.deepEqual(extraArgs(stored), [], 'no TS_EXTRA_ARGS (containerboot refuses it beside a config dir)');
    assert.deepEqual(tailscale.lifecycle?.postStart, { exec: { command: OPERATOR_HOOK } });
    assert.match(OPERATOR_HOOK.join(' '), /tailscale --socket="\$\{TS_SOCKET:-\/tmp\/tailscaled.sock\}" set --operator=certshare-advertise/);
    assert.ok(
      tailscale.volumeMounts!.some((m) => m.mountPath === '/etc/passwd'),
      'tailscaled resolves the operator by name',
    );
    assert.match(stored.metadata!.annotations![ADVERTISE_OWNER_ANNOTATION]!, /the advertise agent only withdraws$/);
    for (const c of [...stored.spec!.initContainers!, ...stored.spec!.containers].filter((c) => c.name !== 'tailscale' && c.name !== 'proxy'))
      assert.notEqual(c.securityContext?.runAsUser, 0, `${c.name} runs as root`);
    assert.equal(admit(stored, optedIn, 'tailscale').patched, false, 'called again: nothing more');
    // A hook of the Pod's own is kept, the Pod refused rather than lose it.
    const hooked = admit(proxyGroupPod({ ...configDir, lifecycle: { postStart: { exec: { command: ['true'] } } } }), optedIn, 'tailscale');
    assert.equal(hooked.allowed, false);
    assert.match(hooked.message!, /postStart hook of its own/);
  });

  it("the same Pod anywhere else, or without the operator's labels, gets no hook and no agent: its labels and annotations are a tenant's to write", () => {
    for (const [p, platform, namespace] of [
      [proxyGroupPod(), optedIn, 'tenant'], // a tenant's copy of a ProxyGroup Pod
      [proxyGroupPod(), defaults, 'tailscale'], // the platform did not opt in
      [pod(ADVERTISING, configDir), optedIn, 'tailscale'], // not labelled as a ProxyGroup's
      [
        {
          ...proxyGroupPod(),
          metadata: { ...proxyGroupPod().metadata, annotations: { ...proxyGroupPod().metadata!.annotations, [OPERATOR_ANNOTATION]: 'grant' } },
        },
        optedIn,
        'tenant',
      ],
    ] as const) {
      const { allowed, message, stored } = admit(p, platform, namespace);
      assert.equal(allowed, true, message);
      assert.equal(tailscaleOf(stored).lifecycle?.postStart, undefined, `${namespace}: no hook`);
      assert.equal(
        stored.spec!.containers.find((c) => c.name === 'certshare-advertise'),
        undefined,
        `${namespace}: no agent`,
      );
      const certshare = stored.spec!.initContainers!.find((c) => c.name === 'certshare')!;
      assert.ok(
        certshare.env!.some((e) => e.name === 'CERTSHARE_ADVERTISE_LEFT_TO_FILE'),
        `${namespace}: left to the file's owner`,
      );
    }
  });
});

const AUTO = 'TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT';
const autoOf = (p: V1Pod) => tailscaleOf(p).env?.filter((e) => e.name === AUTO);

// containerboot advertises its serve config's Services at every netmap change unless told not to (cmd/containerboot
// in tailscale.com 1.102.5); a withdrawal of certshare's would last until the next one. What that costs a client is
// shown on the real cluster (test/cluster/e2e/proxies.test.ts, the tailnet client through the Service's VIP).
describe("containerboot's own advertisement, in a Pod whose certshare advertises", () => {
  it("is turned off in tailscaled's container, the grant or not; left alone in a Pod that does not advertise", () => {
    for (const p of [pod(ADVERTISING), pod(ADVERTISING, {}, { [OPERATOR_ANNOTATION]: 'manual' })]) {
      const { allowed, message, stored } = admit(p);
      assert.equal(allowed, true, message);
      assert.deepEqual(autoOf(stored), [{ name: AUTO, value: 'false' }]);
      assert.ok(!stored.spec!.containers.some((c) => c.name !== 'tailscale' && c.env?.some((e) => e.name === AUTO)), "only tailscaled's container");
      assert.equal(admit(stored).patched, false, 'called again: nothing more');
    }
    assert.deepEqual(autoOf(admit(pod(undefined)).stored) ?? [], []);
  });

  it('keeps a false the Pod gives itself and refuses any other value rather than override it', () => {
    for (const value of ['false', '0', 'False']) {
      const { allowed, stored } = admit(pod(ADVERTISING, { env: [{ name: AUTO, value }] }));
      assert.equal(allowed, true);
      assert.deepEqual(autoOf(stored), [{ name: AUTO, value }]);
    }
    const valueFrom = { configMapKeyRef: { name: 'tailscale', key: AUTO } };
    for (const entry of [
      { name: AUTO, value: 'true' },
      { name: AUTO, value: '' },
      { name: AUTO, valueFrom },
    ]) {
      const { allowed, message } = admit(pod(ADVERTISING, { env: [entry] }));
      assert.equal(allowed, false, JSON.stringify(entry));
      assert.match(message ?? '', /container "tailscale" sets TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT .*undoing certshare's withdrawals/);
    }
  });
});

describe("Tailscale's operator's own ProxyGroup Pods (no socket volume of theirs)", () => {
  const optedIn = { ...defaults, proxyGroupNamespaces: ['tailscale'] };
  const socketEnv = (c: V1Container) => c.env?.filter((e) => e.name === 'TS_SOCKET');

  it('in the allow list: one emptyDir holds the socket, mounted by tailscaled (TS_SOCKET there), certshare and the agent; the hook uses it', () => {
    const { allowed, message, stored } = admit(operatorProxyGroupPod(), optedIn, 'tailscale');
    assert.equal(allowed, true, message);
    assert.deepEqual(
      stored.spec!.volumes!.find((v) => v.name === 'tailscale-socket'),
      { name: 'tailscale-socket', emptyDir: {} },
    );
    const tailscale = tailscaleOf(stored);
    assert.deepEqual(socketEnv(tailscale), [{ name: 'TS_SOCKET', value: PROXY_GROUP_SOCKET }]);
    assert.equal(PROXY_GROUP_SOCKET, '/var/run/tailscale/tailscaled.sock', "the CLI's default: the hook and kubectl exec find it");
    const certshare = stored.spec!.initContainers!.find((c) => c.name === 'certshare')!;
    const agent = stored.spec!.containers.find((c) => c.name === 'certshare-advertise')!;
    for (const c of [tailscale, certshare, agent])
      assert.ok(
        c.volumeMounts!.some((m) => m.name === 'tailscale-socket' && m.mountPath === '/var/run/tailscale'),
        `${c.name} mounts the socket`,
      );
    for (const c of [certshare, agent])
      assert.ok(
        c.env!.some((e) => e.name === 'CERTSHARE_LOCALAPI' && e.value === PROXY_GROUP_SOCKET),
        c.name,
      );
    assert.deepEqual(tailscale.lifecycle?.postStart, { exec: { command: OPERATOR_HOOK } }, 'the hook, through TS_SOCKET');
    assert.match(stored.metadata!.annotations![ADVERTISE_OWNER_ANNOTATION]!, /the advertise agent only withdraws$/);
    assert.deepEqual(extraArgs(stored), [], 'no TS_EXTRA_ARGS beside the config dir');
    assert.equal(stored.spec!.initContainers![0]!.name, 'sysctler', "the operator's init container is untouched and first");
    assert.equal(stored.spec!.initContainers![0]!.volumeMounts, undefined);
    assert.equal(admit(stored, optedIn, 'tailscale').patched, false, 'called again: nothing more');
    // A TS_SOCKET of its own at that path is kept.
    const own = operatorProxyGroupPod();
    own.spec!.containers[0]!.env!.push({ name: 'TS_SOCKET', value: PROXY_GROUP_SOCKET });
    const kept = admit(own, optedIn, 'tailscale');
    assert.equal(kept.allowed, true, kept.message);
    assert.deepEqual(socketEnv(tailscaleOf(kept.stored)), [{ name: 'TS_SOCKET', value: PROXY_GROUP_SOCKET }]);
  });

  it("on certshare's defaults (no --shutdown-timeout) in the operator's 30 s grace: injected, certshare's stop fitted after the failover", () => {
    const flagsOf = (p: V1Pod, flags: string) => {
      p.metadata!.annotations![ANNOTATION.flags] = flags;
      return p;
    };
    const shutdownOf = (p: V1Pod) => p.spec!.initContainers!.find((c) => c.name === 'certshare')!.env!.filter((e) => e.name === 'CERTSHARE_SHUTDOWN_TIMEOUT');
    const onDefaults = flagsOf(operatorProxyGroupPod(), '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy');
    assert.equal(onDefaults.spec!.terminationGracePeriodSeconds, undefined, 'the operator sets none: the default 30 s');
    const { allowed, message, stored } = admit(onDefaults, optedIn, 'tailscale');
    assert.equal(allowed, true, message);
    // 30 s less the preStop call's 20 s (--advertise-failover's default), written so the daemon and the stored Pod agree.
    assert.deepEqual(shutdownOf(stored), [{ name: 'CERTSHARE_SHUTDOWN_TIMEOUT', value: '10s' }]);
    assert.equal(
      stored.metadata!.annotations![STOP_FITTED_ANNOTATION],
      '--shutdown-timeout=10s: terminationGracePeriodSeconds 30 less 20s of --advertise-failover, the default 25s not fitting',
    );
    // Called again, and its stored copy created again: the same stop expected, nothing more.
    const again = admit(stored, optedIn, 'tailscale');
    assert.deepEqual([again.allowed, again.patched], [true, false], again.message);
    const copy = structuredClone(stored);
    copy.metadata!.name = 'ingress-copy';
    assert.deepEqual(admit(copy, optedIn, 'tailscale').allowed, true);
    // A longer --advertise-failover leaves less; below the 5 s certshare's stop needs, the Pod is refused, saying so.
    const short = admit(
      flagsOf(operatorProxyGroupPod(), '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --advertise-failover=24s'),
      optedIn,
      'tailscale',
    );
    assert.equal(short.allowed, true, short.message);
    assert.deepEqual(shutdownOf(short.stored), [{ name: 'CERTSHARE_SHUTDOWN_TIMEOUT', value: '6s' }]);
    const tooShort = admit(
      flagsOf(operatorProxyGroupPod(), '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --advertise-failover=26s'),
      optedIn,
      'tailscale',
    );
    assert.equal(tooShort.allowed, false);
    assert.match(tooShort.message!, /26s\) plus --shutdown-timeout \(certshare's own stop, 25s\) must fit .*\(30\).* fitted .* down to 5s only/);
  });

  it('an explicit --shutdown-timeout is checked as given: one too long for the grace refused, not shortened', () => {
    const p = operatorProxyGroupPod();
    p.metadata!.annotations![ANNOTATION.flags] = '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --shutdown-timeout=11s';
    const { allowed, message } = admit(p, optedIn, 'tailscale');
    assert.equal(allowed, false);
    assert.match(message!, /--advertise-failover \(the wait of the proxy's preStop call to certshare, 20s\) plus --shutdown-timeout \(.* own stop, 11s\)/);
    assert.match(message!, /must fit the Pod's terminationGracePeriodSeconds \(30\): the kubelet kills what still runs then \[/, 'nothing said of fitting');
    // Where it is not given, the same Pod is admitted, its stop fitted.
    p.metadata!.annotations![ANNOTATION.flags] = '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy';
    assert.equal(admit(p, optedIn, 'tailscale').allowed, true);
    const platform = admit(operatorProxyGroupPod(), { ...optedIn, sidecarFlags: '--shutdown-timeout=11s' }, 'tailscale');
    assert.equal(platform.allowed, true, "the Pod's own 8s over the platform's");
    const platformOnly = admit(p, { ...optedIn, sidecarFlags: '--shutdown-timeout=11s' }, 'tailscale');
    assert.equal(platformOnly.allowed, false, "the platform's value is given too: not fitted");
    assert.match(platformOnly.message!, /certshare's own stop, 11s\) must fit/);
  });

  it('a grace long enough for the default: the default kept, nothing written; a second shorter, the stop fitted', () => {
    const admitted = (graceSeconds: number) => {
      const p = operatorProxyGroupPod();
      p.metadata!.annotations![ANNOTATION.flags] = '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy';
      p.spec!.terminationGracePeriodSeconds = graceSeconds;
      const { allowed, message, stored } = admit(p, optedIn, 'tailscale');
      assert.equal(allowed, true, message);
      const env = stored.spec!.initContainers!.find((c) => c.name === 'certshare')!.env!;
      return [env.find((e) => e.name === 'CERTSHARE_SHUTDOWN_TIMEOUT')?.value, stored.metadata!.annotations![STOP_FITTED_ANNOTATION]];
    };
    assert.deepEqual(admitted(45), [undefined, undefined], '20 s + 25 s fit 45 s');
    assert.deepEqual(admitted(44), [
      '24s',
      '--shutdown-timeout=24s: terminationGracePeriodSeconds 44 less 20s of --advertise-failover, the default 25s not fitting',
    ]);
  });

  it('refuses, saying why, a Pod whose socket would go elsewhere than its own settings say', () => {
    const cases: Array<[(p: V1Pod) => void, RegExp]> = [
      [
        (p) => p.spec!.containers[0]!.env!.push({ name: 'TS_SOCKET', value: '/tmp/tailscaled.sock' }),
        /sets TS_SOCKET \("\/tmp\/tailscaled.sock"\), not \/var\/run\/tailscale\/tailscaled.sock/,
      ],
      [
        (p) => p.spec!.containers[0]!.env!.push({ name: 'TS_SOCKET', valueFrom: { configMapKeyRef: { name: 'ts', key: 'socket' } } }),
        /sets TS_SOCKET \(from a Secret or ConfigMap\)/,
      ],
      [
        (p) => p.spec!.containers[0]!.volumeMounts!.push({ name: 'run', mountPath: '/var/run' }),
        /mounts volume "run" at \/var\/run: name it with certshare.io\/socket-volume/,
      ],
      [
        (p) => p.spec!.volumes!.push({ name: 'tailscale-socket', emptyDir: {} }),
        /a volume "tailscale-socket" that container "tailscale" \(tailscaled\) does not mount/,
      ],
    ];
    for (const [change, problem] of cases) {
      const p = operatorProxyGroupPod();
      change(p);
      const { allowed, message } = admit(p, optedIn, 'tailscale');
      assert.equal(allowed, false, problem.source);
      assert.match(message!, problem);
    }
  });

  it('outside the allow list, whatever its labels: no socket added, the Pod refused for lack of one as any other', () => {
    const unlabelled = operatorProxyGroupPod();
    unlabelled.metadata!.labels = { 'tailscale.com/parent-resource': 'ingress' };
    for (const [p, platform, namespace] of [
      [operatorProxyGroupPod(), optedIn, 'tenant'],
      [operatorProxyGroupPod(), defaults, 'tailscale'],
      [unlabelled, optedIn, 'tailscale'],
    ] as const) {
      const { allowed, message } = admit(p, platform, namespace);
      assert.equal(allowed, false, namespace);
      assert.match(message!, /the Pod has no volume "tailscale-socket" for tailscaled's socket/);
    }
  });
});
