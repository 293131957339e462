// `certshare renew <domain>`: its flags and their validation (the command is src/cli/renew.ts).
import { normalizeDomain } from '../core/certificates/domain.ts';
import { CertshareError } from '../core/errors.ts';
import { isObjectName } from '../core/values/kube-names.ts';
import { type CommandHelp, duration, type FlagSpec, type FlagValues } from '../flags/flags.ts';

export const RENEW_FLAGS: FlagSpec[] = [
  {
    name: 'store',
    group: 'where the request goes',
    placeholder: 'kube|dir:PATH',
    default: 'kube',
    help: "Where the domain's certificate lives: kube (its Secret) or the standalone daemon's directory.",
    detail: 'With dir:PATH the request is a file in .state/ of that directory.',
  },
  {
    name: 'namespace',
    group: 'where the request goes',
    placeholder: 'NS',
    help: "The namespace of the domain's Secret.",
    detail: "Default: POD_NAMESPACE, else the kubeconfig context's namespace, else default.",
    aliasesEnv: ['POD_NAMESPACE'],
  },
  {
    name: 'wait',
    group: 'the answer',
    placeholder: 'DURATION',
    default: '0s',
    help: 'Wait this long for the writer to answer; 0s: only ask.',
    detail: 'Exit 0: a new certificate; 1: refused, with the reason.',
  },
];

const RENEW_SUMMARY =
  "certshare renew <domain> [flags]: asks the group's writer for exactly one new certificate with a new key for <domain>, " +
  "by the annotation certshare.io/renew-requested on the domain's Secret (KUBECONFIG, or the Pod's account), " +
  'or standalone by the file .state/<domain>.renew of the store directory. ' +
  'A request already pending stands (one request, not two). The minimum interval and the issuance budget may refuse it. ' +
  'Needs patch on that Secret only (docs/renew.md).';

export interface RenewOptions {
  domain: string;
  store: { kind: 'kube' } | { kind: 'dir'; path: string };
  namespace: string | undefined;
  waitMs: number;
}

/** The positional domain and the flags; CERTSHARE_BAD_FLAG or CERTSHARE_BAD_DOMAIN naming what is wrong. */
export function renewOptionsFrom(domainArg: string | undefined, values: FlagValues): RenewOptions {
  if (domainArg === undefined || domainArg.startsWith('-')) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: 'certshare renew', rule: 'needs the domain first: certshare renew <domain> [flags]' });
  }
  const namespace = values.namespace === undefined ? undefined : String(values.namespace);
  if (namespace !== undefined && !isObjectName(namespace))
    throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--namespace', rule: `"${namespace}" is not a namespace name` });
  const waitMs = duration(values, 'wait');
  if (waitMs < 0 || waitMs > 3_600_000) throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--wait', rule: 'from 0s to 1h' });
  const storeText = String(values.store);
  let store: RenewOptions['store'];
  if (storeText === 'kube') store = { kind: 'kube' };
  else if (storeText.startsWith('dir:') && storeText.length > 4) store = { kind: 'dir', path: storeText.slice(4) };
  else throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--store', rule: `must be kube or dir:PATH, got "${storeText}"` });
  if (store.kind === 'dir' && namespace !== undefined) throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--namespace', rule: 'needs --store kube' });
  return { domain: normalizeDomain(domainArg), store, namespace, waitMs };
}

/** `certshare renew --help` and its part of docs/configuration.md. */
export const RENEW_HELP: CommandHelp = {
  command: 'renew <domain>',
  summary: RENEW_SUMMARY,
  flags: RENEW_FLAGS,
  example: 'certshare renew web.tailnet-1234.ts.net --namespace proxy --wait 5m',
};
