// `npm run check:exports` (part of `npm test` and `npm run lint`): every name a file of src/ exports is imported
// by another file, so dead code does not hide behind `export`. A name that only tests import says so with a
// `@forTests` tag in its doc comment; one without any importer, or imported by tests alone without the tag,
// fails. Imports are read as the compiler reads them: static, `export ... from`, and the
// names destructured from `await import(...)`; a namespace import counts for every name.
import { readFileSync } from 'node:fs';
import { glob } from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';

const ROOT = join(import.meta.dirname, '..');
const IMPORTERS = ['src', 'test', 'bench', 'scripts', 'bin'];
/** Modules the bundler puts in place of a package (scripts/build.ts `alias`): their exports are the package's. */
const STAND_INS = ['src/kube/transport/undici-unavailable.ts'];

export interface Export {
  file: string;
  name: string;
  forTests: boolean;
}

function isExported(node: ts.Node): boolean {
  return ts.canHaveModifiers(node) && (ts.getModifiers(node) ?? []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword);
}

function tagged(node: ts.Node): boolean {
  return ts.getJSDocTags(node).some((tag) => tag.tagName.text === 'forTests');
}

/** The names `file` exports (declarations and `export { ... }` lists; re-exports count as their source's). */
export function exportsOf(file: string, text: string): Export[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const found: Export[] = [];
  for (const statement of source.statements) {
    if (ts.isExportDeclaration(statement) && !statement.moduleSpecifier && statement.exportClause && ts.isNamedExports(statement.exportClause)) {
      for (const element of statement.exportClause.elements) found.push({ file, name: element.name.text, forTests: tagged(statement) });
      continue;
    }
    if (!isExported(statement)) continue;
    if (ts.isVariableStatement(statement)) {
      for (const declaration of statement.declarationList.declarations) {
        if (ts.isIdentifier(declaration.name)) found.push({ file, name: declaration.name.text, forTests: tagged(statement) });
      }
    } else if ('name' in statement && statement.name && ts.isIdentifier(statement.name as ts.Node)) {
      found.push({ file, name: (statement.name as ts.Identifier).text, forTests: tagged(statement) });
    }
  }
  return found;
}

/** `file:name` of every name imported from another file; `file:*` for a namespace or an unread dynamic import. */
export function importsOf(file: string, text: string, root = ROOT): string[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const used: string[] = [];
  const target = (specifier: string): string | undefined => (specifier.startsWith('.') ? relative(root, resolve(root, dirname(file), specifier)) : undefined);
  const visit = (node: ts.Node): void => {
    if ((ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
      const from = target(node.moduleSpecifier.text);
      if (from) used.push(...namesOf(node, from));
    } else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword) {
      const [argument] = node.arguments;
      const from = argument && ts.isStringLiteralLike(argument) ? target(argument.text) : undefined;
      if (from) used.push(...dynamicNames(node, from));
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return used;
}

function namesOf(node: ts.ImportDeclaration | ts.ExportDeclaration, from: string): string[] {
  if (ts.isExportDeclaration(node)) {
    if (!node.exportClause || !ts.isNamedExports(node.exportClause)) return [`${from}:*`];
    return node.exportClause.elements.map((e) => `${from}:${(e.propertyName ?? e.name).text}`);
  }
  const clause = node.importClause;
  if (!clause) return [];
  const names = clause.name ? [`${from}:default`] : [];
  const bindings = clause.namedBindings;
  if (bindings && ts.isNamespaceImport(bindings)) names.push(`${from}:*`);
  if (bindings && ts.isNamedImports(bindings)) names.push(...bindings.elements.map((e) => `${from}:${(e.propertyName ?? e.name).text}`));
  return names;
}

/** The names taken from `import(...)`: `const { a, b } = await import(...)`, `(await import(...)).a`, else all. */
function dynamicNames(call: ts.CallExpression, from: string): string[] {
  let node: ts.Node = call;
  while (ts.isAwaitExpression(node.parent) || ts.isParenthesizedExpression(node.parent)) node = node.parent;
  const parent = node.parent;
  if (ts.isVariableDeclaration(parent) && ts.isObjectBindingPattern(parent.name)) {
    return parent.name.elements.map((e) => `${from}:${((e.propertyName ?? e.name) as ts.Identifier).text}`);
  }
  if (ts.isPropertyAccessExpression(parent)) return [`${from}:${parent.name.text}`];
  return [`${from}:*`];
}

async function filesUnder(dirs: string[], root: string): Promise<string[]> {
  const files: string[] = [];
  for (const dir of dirs) for await (const file of glob(`${dir}/**/*.{ts,js}`, { cwd: root })) files.push(file);
  return files.filter((f) => !f.includes('node_modules')).sort();
}

/** Exports of src/ that nothing imports, and those only tests (test/) import without saying so. */
export async function unusedExports(root = ROOT): Promise<{ unused: Export[]; testOnlyUntagged: Export[] }> {
  const importers = await filesUnder(IMPORTERS, root);
  const bySrc = new Set<string>();
  const byAny = new Set<string>();
  for (const file of importers) {
    for (const key of importsOf(file, readFileSync(join(root, file), 'utf8'), root)) {
      if (key.startsWith(`${file}:`)) continue;
      byAny.add(key);
      if (!file.startsWith('test/')) bySrc.add(key);
    }
  }
  const unused: Export[] = [];
  const testOnlyUntagged: Export[] = [];
  for (const file of importers.filter((f) => f.startsWith('src/') && f.endsWith('.ts') && !STAND_INS.includes(f))) {
    for (const e of exportsOf(file, readFileSync(join(root, file), 'utf8'))) {
      const key = `${file}:${e.name}`;
      const all = `${file}:*`;
      if (bySrc.has(key) || bySrc.has(all)) continue;
      if (!byAny.has(key) && !byAny.has(all)) unused.push(e);
      else if (!e.forTests && !file.startsWith('src/cli/')) testOnlyUntagged.push(e);
    }
  }
  return { unused, testOnlyUntagged };
}

if (import.meta.main) {
  const { unused, testOnlyUntagged } = await unusedExports();
  for (const e of unused) console.error(`${e.file}: ${e.name} is exported and imported by nothing: remove it, or its export`);
  for (const e of testOnlyUntagged) console.error(`${e.file}: ${e.name} is imported by tests alone: tag its doc comment @forTests`);
  process.exit(unused.length + testOnlyUntagged.length > 0 ? 1 : 0);
}
