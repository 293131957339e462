// The objects whose caBundle the injector keeps (--inject-ca-into): their kinds, the API each lives in, and the
// flag's KIND/NAME. Declared beside the CA's rotation so that the configuration (src/config/injector-options.ts)
// and the controller (src/injector/controller.ts) both name them without depending on each other.
import { CertshareError } from '../errors.ts';

export type TargetKind = 'mutatingwebhookconfiguration' | 'validatingwebhookconfiguration' | 'customresourcedefinition' | 'apiservice';

export const TARGET_API: Record<TargetKind, { group: string; version: string; plural: string }> = {
  mutatingwebhookconfiguration: { group: 'admissionregistration.k8s.io', version: 'v1', plural: 'mutatingwebhookconfigurations' },
  validatingwebhookconfiguration: { group: 'admissionregistration.k8s.io', version: 'v1', plural: 'validatingwebhookconfigurations' },
  customresourcedefinition: { group: 'apiextensions.k8s.io', version: 'v1', plural: 'customresourcedefinitions' },
  apiservice: { group: 'apiregistration.k8s.io', version: 'v1', plural: 'apiservices' },
};

export interface Target {
  kind: TargetKind;
  name: string;
}

/** "mutatingwebhookconfiguration/NAME" (also the short forms mwc, vwc, crd). */
export function parseTarget(text: string): Target {
  const short: Record<string, TargetKind> = { mwc: 'mutatingwebhookconfiguration', vwc: 'validatingwebhookconfiguration', crd: 'customresourcedefinition' };
  const [kindText, name, ...rest] = text.trim().split('/');
  const kind = (short[kindText?.toLowerCase() ?? ''] ?? kindText?.toLowerCase()) as TargetKind;
  if (!(kind in TARGET_API) || !name || rest.length > 0) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', {
      flag: '--inject-ca-into',
      rule: `"${text}" is not KIND/NAME with KIND one of ${Object.keys(TARGET_API).join(', ')}`,
    });
  }
  return { kind, name };
}
