// Time is injected everywhere so renewals and backoff can be tested in seconds, not days.
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
  /**
   * This clock's reading at an instant another machine stamped by its wall clock (an apiserver's
   * creationTimestamp). Absent: the wall clock's time as is (this clock is the wall clock).
   */
  atWallTime?(wallMs: number): number;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      // setTimeout's limit is 2^31-1 ms (24.8 days); a longer wait is clamped and the caller re-checks.
      const timer = setTimeout(done, Math.min(Math.max(0, ms), 2 ** 31 - 1));
      function done(): void {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }
      function onAbort(): void {
        clearTimeout(timer);
        reject(signal!.reason);
      }
      signal?.addEventListener('abort', onAbort, { once: true });
    }),
};

const DAY_MS = 86_400_000;
/** The times iso() writes itself: years 0000 to 9999, as toISOString writes them without a sign. */
const FIRST_ISO_MS = -62_167_219_200_000;
const LAST_ISO_MS = 253_402_300_799_999;

/**
 * A time as log lines and messages give it: ISO 8601, UTC, the text Date's toISOString gives. Written here
 * from the number: V8's toISOString looks up the host's time zone through ICU on its first call, which
 * pages ICU's time zone data into every process that logs (docs/performance.md), and a UTC text needs none
 * of it. Times outside years 0-9999 (and NaN) go to toISOString, which writes or refuses them.
 */
export function iso(ms: number): string {
  const t = Math.trunc(ms);
  if (!(t >= FIRST_ISO_MS && t <= LAST_ISO_MS)) return new Date(ms).toISOString();
  const days = Math.floor(t / DAY_MS);
  const inDay = t - days * DAY_MS;
  // The civil date of a day count (days from 1970-01-01), in 400-year eras of March-based years.
  const shifted = days + 719_468;
  const era = Math.floor(shifted / 146_097);
  const dayOfEra = shifted - era * 146_097;
  const yearOfEra = Math.floor((dayOfEra - Math.floor(dayOfEra / 1460) + Math.floor(dayOfEra / 36_524) - Math.floor(dayOfEra / 146_096)) / 365);
  const dayOfYear = dayOfEra - (365 * yearOfEra + Math.floor(yearOfEra / 4) - Math.floor(yearOfEra / 100));
  const monthFromMarch = Math.floor((5 * dayOfYear + 2) / 153);
  const day = dayOfYear - Math.floor((153 * monthFromMarch + 2) / 5) + 1;
  const month = monthFromMarch < 10 ? monthFromMarch + 3 : monthFromMarch - 9;
  const year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0);
  const pad = (n: number, width = 2): string => String(n).padStart(width, '0');
  const time = `${pad(Math.floor(inDay / 3_600_000))}:${pad(Math.floor(inDay / 60_000) % 60)}:${pad(Math.floor(inDay / 1000) % 60)}.${pad(inDay % 1000, 3)}`;
  return `${pad(year, 4)}-${pad(month)}-${pad(day)}T${time}Z`;
}

const WEEKDAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

/** An HTTP Date header's text (RFC 9110 IMF-fixdate), the one Date's toUTCString gives, from iso() for the same reason. */
export function httpDate(ms: number): string {
  const t = Math.trunc(ms);
  if (!(t >= 0 && t <= LAST_ISO_MS)) return new Date(ms).toUTCString();
  const [date, time] = iso(t).split('T') as [string, string];
  const [year, month, day] = date.split('-');
  // 1970-01-01 was a Thursday.
  return `${WEEKDAYS[(Math.floor(t / DAY_MS) + 4) % 7]}, ${day} ${MONTHS[Number(month) - 1]} ${year} ${time.slice(0, 8)} GMT`;
}
