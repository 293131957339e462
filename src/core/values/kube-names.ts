// The apiserver's own rules for the names certshare puts into objects it does not create itself (a Secret
// a flag names, a ConfigMap the injector mounts): checked when the flag is read, so a typo stops the start
// with a message instead of failing every Pod, or every call, later.

/** An object name: a DNS-1123 subdomain (lower-case letters, digits, inner '-' and '.'), at most 253 characters. */
const OBJECT_NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

export function isObjectName(text: string): boolean {
  return text.length <= 253 && OBJECT_NAME.test(text);
}

/** A ConfigMap or Secret data key (the apiserver's IsConfigMapKey): letters, digits, '-', '_', '.'; not '.' nor '..' nor '..'-prefixed. */
export function isConfigMapKey(text: string): boolean {
  return text.length <= 253 && /^[-._a-zA-Z0-9]+$/.test(text) && text !== '.' && !text.startsWith('..');
}
