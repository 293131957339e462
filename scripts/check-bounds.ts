// `npm run check:bounds` (part of `npm test` and `npm run lint`): no function over 50 lines in src/core (the
// rules a reader checks line by line), none over 80 anywhere in src, no class over 350 lines. Lines are
// counted from a function's first line to its last, signature and comments inside included; a function
// nested in another counts for both. `--report` prints the longest of each kind instead of checking.
import { readFileSync } from 'node:fs';
import { glob } from 'node:fs/promises';
import { join, relative } from 'node:path';
import ts from 'typescript';

const ROOT = join(import.meta.dirname, '..');
const CORE_FUNCTION_LINES = 50;
const FUNCTION_LINES = 80;
const CLASS_LINES = 350;

/** `file:name` of the functions allowed over the bound, each with why; remove an entry once it holds. */
const EXEMPT: Record<string, string> = {};

export interface Span {
  file: string;
  name: string;
  kind: 'function' | 'class';
  lines: number;
}

function nameOf(node: ts.Node, source: ts.SourceFile): string {
  const named = node as { name?: ts.Node };
  if (ts.isConstructorDeclaration(node)) return `${nameOf(node.parent, source)}.constructor`;
  if (named.name) {
    const own = named.name.getText(source);
    return ts.isClassLike(node.parent) ? `${nameOf(node.parent, source)}.${own}` : own;
  }
  const parent = node.parent;
  if (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent) || ts.isPropertyDeclaration(parent)) return nameOf(parent, source);
  return `(anonymous at line ${source.getLineAndCharacterOfPosition(node.getStart(source)).line + 1})`;
}

export function spansOf(file: string, text: string): Span[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const spans: Span[] = [];
  const visit = (node: ts.Node): void => {
    const isFunction = ts.isFunctionLike(node) && 'body' in node && node.body !== undefined;
    if (isFunction || ts.isClassLike(node)) {
      const first = source.getLineAndCharacterOfPosition(node.getStart(source)).line;
      const last = source.getLineAndCharacterOfPosition(node.getEnd()).line;
      spans.push({ file, name: nameOf(node, source), kind: isFunction ? 'function' : 'class', lines: last - first + 1 });
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return spans;
}

export function boundOf(span: Span): number {
  if (span.kind === 'class') return CLASS_LINES;
  return span.file.startsWith('src/core/') ? CORE_FUNCTION_LINES : FUNCTION_LINES;
}

export async function allSpans(root = ROOT): Promise<Span[]> {
  const spans: Span[] = [];
  for await (const file of glob('src/**/*.ts', { cwd: root })) {
    spans.push(...spansOf(relative(root, join(root, file)), readFileSync(join(root, file), 'utf8')));
  }
  return spans.sort((a, b) => b.lines - a.lines);
}

if (import.meta.main) {
  const root = process.argv.find((a) => a.startsWith('--root='))?.slice(7) ?? ROOT;
  const spans = await allSpans(root);
  if (process.argv.includes('--report')) {
    const longest = (filter: (s: Span) => boolean) => spans.find(filter);
    const show = (s: Span | undefined) => (s ? `${s.file} ${s.name}: ${s.lines} lines` : 'none');
    console.log(`longest function in src/core: ${show(longest((s) => s.kind === 'function' && s.file.startsWith('src/core/')))}`);
    console.log(`longest function in src: ${show(longest((s) => s.kind === 'function'))}`);
    console.log(`largest class: ${show(longest((s) => s.kind === 'class'))}`);
    const over = spans.filter((s) => s.lines > boundOf(s));
    console.log(`over the bounds (${over.length}):`);
    for (const s of over) console.log(`  ${s.file} ${s.kind} ${s.name}: ${s.lines} > ${boundOf(s)}`);
    process.exit(0);
  }
  const over = spans.filter((s) => s.lines > boundOf(s) && !EXEMPT[`${s.file}:${s.name}`]);
  for (const s of over) console.error(`${s.file}: ${s.kind} ${s.name} is ${s.lines} lines, over ${boundOf(s)}: split it into named parts`);
  for (const key of Object.keys(EXEMPT)) {
    const [file, name] = key.split(':');
    const s = spans.find((x) => x.file === file && x.name === name);
    if (!s || s.lines <= boundOf(s)) console.error(`${key} is exempt but holds the bound (or is gone): remove it from EXEMPT in scripts/check-bounds.ts`);
  }
  const stale = Object.keys(EXEMPT).filter((key) => {
    const [file, name] = key.split(':');
    const s = spans.find((x) => x.file === file && x.name === name);
    return !s || s.lines <= boundOf(s);
  });
  process.exit(over.length + stale.length > 0 ? 1 : 0);
}
