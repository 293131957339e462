// How a command that fails ends the process: one line on stderr with the error's code, and the code's exit status.
import { CertshareError, ERROR_CODES, type ErrorCode, errorMessage, errorText } from '../core/errors.ts';

/** Exits now, with the code's exit status: a fatal error must end the process, whatever handle (a socket, a timer) is still open. */
export function exitFatal(err: unknown): never {
  const code: ErrorCode = err instanceof CertshareError ? err.code : 'CERTSHARE_FATAL';
  const message = err instanceof CertshareError ? err.message : errorText('CERTSHARE_FATAL', { message: errorMessage(err) });
  console.error(`certshare: ${message} [${code}]`);
  process.exit(ERROR_CODES[code].exit);
}
