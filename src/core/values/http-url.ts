/** True for an absolute http:// or https:// URL (a flag's value, an ACME directory's field, a CA's link). */
export function isHttpUrl(text: string): boolean {
  try {
    const url = new URL(text);
    return url.protocol === 'http:' || url.protocol === 'https:';
  } catch {
    return false;
  }
}
