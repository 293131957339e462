// --tls secret:NAME: a kubernetes.io/tls Secret of the Pod's namespace, read once at start and followed
// with the daemon's SecretWatch, for a listener that serves it (src/tls/pair-source.ts).
import type { V1Secret } from './transport/client-node.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { LastPair, checkedPair, type PairSource, type PairSourceOptions, type ServingPair } from '../tls/serving-pair.ts';
import { apiErrorText, connectKube, type KubeConnection } from './connection.ts';
import { withSignal } from './transport/https-transport.ts';
import { SecretWatch } from './secret-watch.ts';

const pairOf = (secret: V1Secret): ServingPair => ({
  certPem: Buffer.from(secret.data?.['tls.crt'] ?? '', 'base64').toString('utf8'),
  keyPem: Buffer.from(secret.data?.['tls.key'] ?? '', 'base64').toString('utf8'),
});

export class TlsSecret implements PairSource {
  readonly #name: string;
  readonly #o: PairSourceOptions;
  /** The flag that chose this source, for messages. */
  readonly #flag: string;
  readonly #abort = new AbortController();
  #connection: KubeConnection | undefined;
  #watch: SecretWatch | undefined;
  readonly #last = new LastPair();
  #reading: Promise<void> = Promise.resolve();

  constructor(name: string, options: PairSourceOptions) {
    this.#name = name;
    this.#o = options;
    this.#flag = `--${options.flag ?? 'tls'}`;
  }

  async #read(): Promise<ServingPair> {
    const { core, namespace } = this.#connection!;
    // The transport bounds the call (--kube-timeout); this adds the stop signal.
    return pairOf(await core.readNamespacedSecret({ name: this.#name, namespace }, withSignal(this.#abort.signal)));
  }

  async start(): Promise<ServingPair> {
    this.#connection = await connectKube(this.#o.env);
    let pair: ServingPair;
    try {
      pair = await this.#read();
    } catch (err) {
      throw new CertshareError(
        'CERTSHARE_BAD_CONFIG',
        { source: `${this.#flag} secret:${this.#name}`, reason: `cannot read the Secret: ${apiErrorText(err)}` },
        { cause: err },
      );
    }
    checkedPair(pair);
    this.#last.changed(pair);
    this.#watch = new SecretWatch({
      connection: this.#connection,
      name: this.#name,
      clock: this.#o.clock,
      logger: this.#o.logger,
      onChange: () => {
        this.#reading = this.#reading.then(() => this.#again());
      },
    });
    this.#watch.start();
    return pair;
  }

  async #again(): Promise<void> {
    if (this.#abort.signal.aborted) return;
    try {
      const pair = await this.#read();
      if (this.#last.changed(pair)) this.#o.onPair(pair);
    } catch (err) {
      if (!this.#abort.signal.aborted)
        this.#o.logger.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, `${this.#flag} Secret unreadable; keeping the pair served`);
    }
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    await this.#watch?.stop();
    await this.#reading;
    // Its own connection (one more HTTP/2 session to the API server than the store's): closed with it.
    this.#connection?.close();
  }
}
