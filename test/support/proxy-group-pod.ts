// The unit tier's stand-in for a ProxyGroup replica's Pod of Tailscale's operator, checked against the real operator.
import type { V1Pod } from '../../src/kube/transport/client-node.ts';
import { ANNOTATION } from '../../src/injector/mutate.ts';

/** The flags a ProxyClass gives the replicas' certshare: it checks its proxy and advertises svc:proxy. */
export const PROXY_GROUP_FLAGS = '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --shutdown-timeout=8s';

/**
 * A replica's Pod as Tailscale's operator 1.102.5 builds it for an Ingress ProxyGroup "ingress" of two replicas
 * (cmd/k8s-operator proxygroup_specs.go pgStatefulSet on deploy/manifests/proxy.yaml, pgLabels), with what a ProxyClass
 * adds (the Pod's annotations): no volume holds tailscaled's socket, which containerboot makes at /tmp/tailscaled.sock.
 * The template of the StatefulSet the real operator writes is this Pod, field for field once the apiserver has
 * defaulted both (test/tailscaled/proxy-group-operator.test.ts); what the StatefulSet controller adds is not here.
 */
export function operatorProxyGroupPod(): V1Pod {
  const fieldRef = (fieldPath: string) => ({ valueFrom: { fieldRef: { fieldPath } } });
  return {
    metadata: {
      name: 'ingress-0',
      labels: { 'tailscale.com/managed': 'true', 'tailscale.com/parent-resource-type': 'proxygroup', 'tailscale.com/parent-resource': 'ingress' },
      annotations: { [ANNOTATION.inject]: 'true', [ANNOTATION.domains]: 'proxy.tailnet-0000.ts.net', [ANNOTATION.flags]: PROXY_GROUP_FLAGS },
    },
    spec: {
      serviceAccountName: 'ingress',
      initContainers: [
        {
          name: 'sysctler',
          image: 'tailscale/tailscale:v1.102.5',
          securityContext: { privileged: true },
          command: ['/bin/sh', '-c'],
          args: ['sysctl -w net.ipv4.ip_forward=1 && if sysctl net.ipv6.conf.all.forwarding; then sysctl -w net.ipv6.conf.all.forwarding=1; fi'],
        },
      ],
      containers: [
        {
          name: 'tailscale',
          image: 'tailscale/tailscale:v1.102.5',
          imagePullPolicy: 'Always',
          resources: { requests: { cpu: '1m', memory: '1Mi' } },
          securityContext: { privileged: true },
          env: [
            { name: 'TS_USERSPACE', value: 'false' },
            { name: 'POD_IP', ...fieldRef('status.podIP') },
            { name: 'POD_NAME', ...fieldRef('metadata.name') },
            { name: 'POD_UID', ...fieldRef('metadata.uid') },
            { name: 'POD_IPS', ...fieldRef('status.podIPs') },
            { name: 'TS_KUBE_SECRET', value: '$(POD_NAME)' },
            { name: 'TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT', value: 'false' },
            { name: 'TS_STATE', value: 'kube:$(POD_NAME)' },
            { name: 'TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR', value: '/etc/tsconfig/$(POD_NAME)' },
            { name: 'TS_DEBUG_ACME_FORCE_RENEWAL', value: 'true' },
            { name: 'TS_INTERNAL_APP', value: 'k8s-operator-proxygroup-ingress' },
            { name: 'TS_INGRESS_PROXIES_CONFIG_PATH', value: '/etc/proxies/ingress-config.json' },
            { name: 'TS_SERVE_CONFIG', value: '/etc/proxies/serve-config.json' },
            { name: 'TS_EXPERIMENTAL_CERT_SHARE', value: 'true' },
          ],
          volumeMounts: [
            { name: 'tailscaledconfig-0', readOnly: true, mountPath: '/etc/tsconfig/ingress-0' },
            { name: 'tailscaledconfig-1', readOnly: true, mountPath: '/etc/tsconfig/ingress-1' },
            { name: 'ingress-ingress-config', mountPath: '/etc/proxies', readOnly: true },
          ],
        },
      ],
      volumes: [
        { name: 'tailscaledconfig-0', secret: { secretName: 'ingress-0-config' } },
        { name: 'tailscaledconfig-1', secret: { secretName: 'ingress-1-config' } },
        { name: 'ingress-ingress-config', configMap: { name: 'ingress-ingress-config' } },
      ],
    },
  };
}
