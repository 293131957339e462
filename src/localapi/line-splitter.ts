import { CertshareError } from '../core/errors.ts';

// Splits a byte stream into newline-delimited lines without re-copying the part already received:
// the pieces of the current line are kept as a list and joined once, when its newline arrives.
// Splitting on the byte 0x0A is safe for UTF-8 (it never occurs inside a multi-byte sequence).

const LF = 0x0a;
const CR = 0x0d;

const DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024;

/** The error for a line over the limit: which stream, and what to do about it. */
type LineTooLong = (maxLineBytes: number, length: number) => CertshareError;

const busLineTooLong: LineTooLong = (max, length) => new CertshareError('CERTSHARE_BUS_LINE_TOO_LONG', { max, length });

export class LineSplitter {
  readonly maxLineBytes: number;
  readonly #tooLong: LineTooLong;
  #pending: Buffer[] = [];
  #pendingBytes = 0;
  #error: CertshareError | undefined;

  constructor(maxLineBytes: number = DEFAULT_MAX_LINE_BYTES, tooLong: LineTooLong = busLineTooLong) {
    if (!(maxLineBytes > 0)) throw new RangeError(`maxLineBytes must be positive, got ${maxLineBytes}`);
    this.maxLineBytes = maxLineBytes;
    this.#tooLong = tooLong;
  }

  /** Bytes held for the current, unfinished line. */
  get pendingBytes(): number {
    return this.#pendingBytes;
  }

  /**
   * Set (CERTSHARE_BUS_LINE_TOO_LONG, or the caller's error) once a line exceeded the limit, even before its newline arrived.
   * The splitter then holds nothing and push()/end() throw this error.
   */
  get error(): CertshareError | undefined {
    return this.#error;
  }

  /**
   * Feeds one chunk; returns the lines it completed (without the newline and a trailing CR; empty lines
   * are skipped). When a line overflows, the lines completed before it are still returned, the rest of
   * the chunk is dropped and `error` is set: check it after consuming the returned lines.
   */
  push(chunk: Uint8Array): Buffer[] {
    if (this.#error) throw this.#error;
    const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const lines: Buffer[] = [];
    let start = 0;
    for (;;) {
      const nl = buf.indexOf(LF, start);
      if (nl === -1) break;
      const piece = buf.subarray(start, nl);
      start = nl + 1;
      if (this.#overflows(this.#pendingBytes + piece.length)) return lines;
      let line: Buffer;
      if (this.#pending.length === 0) {
        line = piece;
      } else {
        this.#pending.push(piece);
        line = Buffer.concat(this.#pending, this.#pendingBytes + piece.length);
        this.#pending = [];
        this.#pendingBytes = 0;
      }
      const trimmed = stripCr(line);
      if (trimmed.length > 0) lines.push(trimmed);
    }
    if (start < buf.length) {
      const rest = buf.subarray(start);
      if (this.#overflows(this.#pendingBytes + rest.length)) return lines;
      this.#pending.push(rest);
      this.#pendingBytes += rest.length;
    }
    return lines;
  }

  /** Returns the unterminated last line, if any (the stream ended without a final newline), and resets. */
  end(): Buffer | undefined {
    if (this.#error) throw this.#error;
    if (this.#pending.length === 0) return undefined;
    const line = stripCr(Buffer.concat(this.#pending, this.#pendingBytes));
    this.#pending = [];
    this.#pendingBytes = 0;
    return line.length > 0 ? line : undefined;
  }

  #overflows(length: number): boolean {
    if (length <= this.maxLineBytes) return false;
    this.#pending = [];
    this.#pendingBytes = 0;
    this.#error = this.#tooLong(this.maxLineBytes, length);
    return true;
  }
}

function stripCr(line: Buffer): Buffer {
  return line.length > 0 && line[line.length - 1] === CR ? line.subarray(0, line.length - 1) : line;
}
