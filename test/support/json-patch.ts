// Applies RFC 6902 add/replace/remove operations to a JSON value (a copy), as the apiserver does with a
// webhook's patch; enough to check the injector's patches without a dependency.
type Json = unknown;

function unescapeToken(token: string): string {
  return token.replaceAll('~1', '/').replaceAll('~0', '~');
}

export function applyJsonPatch(document: Json, ops: { op: string; path: string; value?: Json }[]): Json {
  const root = { doc: structuredClone(document) } as Record<string, Json>;
  for (const { op, path, value } of ops) {
    const tokens = ['doc', ...path.split('/').slice(1).map(unescapeToken)];
    const last = tokens.pop()!;
    let parent = root as Json;
    for (const t of tokens) {
      parent = (parent as Record<string, Json>)[t];
      if (parent === undefined || parent === null || typeof parent !== 'object') throw new Error(`${op} ${path}: no parent at "${t}"`);
    }
    if (Array.isArray(parent)) {
      const index = last === '-' ? parent.length : Number(last);
      if (!Number.isInteger(index) || index < 0 || index > parent.length) throw new Error(`${op} ${path}: bad index`);
      if (op === 'add') parent.splice(index, 0, structuredClone(value));
      else if (op === 'replace') parent[index] = structuredClone(value);
      else if (op === 'remove') parent.splice(index, 1);
      else throw new Error(`unsupported op ${op}`);
    } else {
      const object = parent as Record<string, Json>;
      if ((op === 'replace' || op === 'remove') && !(last in object)) throw new Error(`${op} ${path}: no member`);
      if (op === 'remove') delete object[last];
      else if (op === 'add' || op === 'replace') object[last] = structuredClone(value);
      else throw new Error(`unsupported op ${op}`);
    }
  }
  return root.doc;
}
