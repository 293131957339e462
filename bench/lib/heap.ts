// V8 heap snapshots (.heapsnapshot JSON) summed up for the memory tools.

/** Self size (bytes) per `type:constructor` of a .heapsnapshot. */
export function heapByConstructor(snapshot: {
  snapshot: { meta: { node_fields: string[]; node_types: [string[], ...unknown[]] } };
  nodes: number[];
  strings: string[];
}): Map<string, number> {
  const fields = snapshot.snapshot.meta.node_fields;
  const types = snapshot.snapshot.meta.node_types[0];
  const [iType, iName, iSize] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f)) as [number, number, number];
  const byKey = new Map<string, number>();
  for (let i = 0; i < snapshot.nodes.length; i += fields.length) {
    const type = types[snapshot.nodes[i + iType]!]!;
    // Strings, code and V8 internals by type; objects and closures by constructor / function name.
    const name = type === 'object' || type === 'closure' || type === 'native' ? snapshot.strings[snapshot.nodes[i + iName]!]! : '';
    const key = `${type}${name ? `:${name.slice(0, 60)}` : ''}`;
    byKey.set(key, (byKey.get(key) ?? 0) + snapshot.nodes[i + iSize]!);
  }
  return byKey;
}
