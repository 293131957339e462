// One TLS handshake with the proxy's listener, with SNI, to read the leaf it serves for a name: the
// client's view of the certificate, whatever the proxy loaded (or failed to reload). Nothing is verified
// here (the proxy may serve something expired or self-signed: that is what the check looks for); no data
// is sent, the connection ends after the handshake.
import { connect, type TLSSocket } from 'node:tls';
import type { ServedProbe, ServedProbeFailure } from '../core/served/served-certificate.ts';

interface ServedTarget {
  host: string;
  port: number;
}

/** Errors that mean the port answered, but not with TLS (a plain HTTP server, another protocol). */
const NOT_TLS = /WRONG_VERSION_NUMBER|packet length too long|unknown protocol|record layer failure|UNEXPECTED_RECORD|HTTP_REQUEST/i;

/**
 * The proxy's TLS ended the handshake with an alert that every client gets too: nginx's internal error (its worker
 * cannot read or use the key), a name refused (`ssl_reject_handshake`). Not a handshake failure: a proxy that
 * requires client certificates over TLS 1.2 sends it to this probe, which has none, and not to its clients.
 */
const ALERT = /^ERR_SSL_TLSV1_(?:ALERT_INTERNAL_ERROR|UNRECOGNIZED_NAME)$/;

export function probeServed(target: ServedTarget, servername: string, timeoutMs: number, signal?: AbortSignal): Promise<ServedProbe> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    let socket: TLSSocket | undefined;
    const finish = (outcome: ServedProbe | { abort: unknown }): void => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      socket?.destroy();
      if ('abort' in outcome) reject(outcome.abort);
      else resolve(outcome);
    };
    const fail = (failure: ServedProbeFailure, detail: string): void => finish({ failure, detail });
    const onAbort = (): void => finish({ abort: signal?.reason });
    // A proxy that accepts and never finishes the handshake is a timeout, not a hang of the checker.
    const timer = setTimeout(() => fail('timeout', `no TLS handshake within ${timeoutMs} ms`), timeoutMs);
    signal?.addEventListener('abort', onAbort, { once: true });
    socket = connect({ host: target.host, port: target.port, servername, rejectUnauthorized: false });
    socket.once('secureConnect', () => {
      const leaf = socket?.getPeerX509Certificate();
      if (!leaf) return fail('not_tls', 'the TLS handshake sent no certificate');
      finish({
        leaf: {
          fingerprint256: leaf.fingerprint256,
          serial: leaf.serialNumber,
          notBefore: leaf.validFromDate.getTime(),
          notAfter: leaf.validToDate.getTime(),
          coversName: leaf.checkHost(servername) !== undefined,
        },
      });
    });
    socket.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'ECONNREFUSED') return fail('refused', `nothing listens at ${target.host}:${target.port}`);
      if (NOT_TLS.test(`${err.code ?? ''} ${err.message}`)) return fail('not_tls', `not a TLS listener: ${err.code ?? err.message}`);
      if (ALERT.test(err.code ?? '')) return fail('alert', `the handshake ended with an alert: ${err.code}`);
      fail('error', err.code ?? err.message);
    });
    // The server closed the connection before finishing the handshake.
    socket.once('close', () => fail('not_tls', 'the connection closed during the TLS handshake'));
  });
}
