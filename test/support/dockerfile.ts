// A small Dockerfile reader and a replay of its COPY/RUN steps on the host, for the image test: no
// Docker engine is needed to check that what the image would contain really starts.
import { spawn } from 'node:child_process';
import { cp, mkdir, readFile, stat } from 'node:fs/promises';
import { basename, dirname, join, posix, relative } from 'node:path';

export interface Instruction {
  keyword: string;
  args: string;
  line: number;
}

export interface Stage {
  index: number;
  image: string;
  name: string | undefined;
  instructions: Instruction[];
}

/** Stages with their instructions; continuation lines joined, comments dropped. */
export function parseDockerfile(text: string): Stage[] {
  const logical: Array<{ text: string; line: number }> = [];
  let buffer = '';
  let start = 0;
  text.split('\n').forEach((raw, i) => {
    const line = raw.trimEnd();
    if (line.trimStart().startsWith('#') || (buffer === '' && line.trim() === '')) return;
    if (buffer === '') start = i + 1;
    if (line.endsWith('\\')) {
      buffer += `${line.slice(0, -1)} `;
      return;
    }
    logical.push({ text: (buffer + line).trim(), line: start });
    buffer = '';
  });
  if (buffer !== '') throw new Error('Dockerfile ends inside a continued line');

  const stages: Stage[] = [];
  for (const { text: entry, line } of logical) {
    const m = /^(\S+)\s*(.*)$/s.exec(entry)!;
    const keyword = m[1]!.toUpperCase();
    const args = m[2]!.trim();
    if (keyword === 'FROM') {
      const from = /^(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$/i.exec(args);
      if (!from) throw new Error(`line ${line}: cannot read FROM ${args}`);
      stages.push({ index: stages.length, image: from[1]!, name: from[2], instructions: [] });
    } else {
      const stage = stages.at(-1);
      if (!stage) throw new Error(`line ${line}: ${keyword} before FROM`);
      stage.instructions.push({ keyword, args, line });
    }
  }
  return stages;
}

/** The JSON array of an exec-form instruction (ENTRYPOINT/CMD/RUN), or undefined for the shell form. */
export function execForm(args: string): string[] | undefined {
  if (!args.startsWith('[')) return undefined;
  const parsed = JSON.parse(args) as unknown;
  if (!Array.isArray(parsed) || !parsed.every((a) => typeof a === 'string')) throw new Error(`not an exec form: ${args}`);
  return parsed as string[];
}

export function instructions(stage: Stage, keyword: string): Instruction[] {
  return stage.instructions.filter((i) => i.keyword === keyword);
}

/** ENV K=V [K2=V2 ...] or the legacy ENV K V; quotes are not supported (none needed here). */
export function envOf(stage: Stage): Record<string, string> {
  const env: Record<string, string> = {};
  for (const { args, line } of instructions(stage, 'ENV')) {
    if (/["']/.test(args)) throw new Error(`line ${line}: quoted ENV values are not supported by this reader`);
    if (!args.includes('=')) {
      const [key, ...rest] = args.split(/\s+/);
      env[key!] = rest.join(' ');
      continue;
    }
    for (const pair of args.split(/\s+/)) {
      const eq = pair.indexOf('=');
      if (eq <= 0) throw new Error(`line ${line}: cannot read ENV ${args}`);
      env[pair.slice(0, eq)] = pair.slice(eq + 1);
    }
  }
  return env;
}

// -------------------------------------------------------------------------------------------------
// .dockerignore

interface IgnoreRule {
  negate: boolean;
  pattern: RegExp;
}

function globToRegExp(glob: string): RegExp {
  let re = '';
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]!;
    if (c === '*' && glob[i + 1] === '*') {
      re += '.*';
      i++;
      if (glob[i + 1] === '/') i++;
    } else if (c === '*') re += '[^/]*';
    else if (c === '?') re += '[^/]';
    else re += c.replace(/[.+^${}()|[\]\\]/g, '\\$&');
  }
  return new RegExp(`^${re}$`);
}

/** Docker's rules: patterns relative to the context root, the last match wins, `!` re-includes. */
export function parseDockerignore(text: string): (relPath: string) => boolean {
  const rules: IgnoreRule[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const negate = line.startsWith('!');
    const pattern = posix
      .normalize((negate ? line.slice(1) : line).trim())
      .replace(/^\/+/, '')
      .replace(/\/+$/, '');
    rules.push({ negate, pattern: globToRegExp(pattern) });
  }
  return (relPath: string): boolean => {
    const parts = relPath.split('/');
    const candidates = parts.map((_, i) => parts.slice(0, i + 1).join('/'));
    let ignored = false;
    for (const rule of rules) {
      // A rule matching the path or one of its parent directories applies to it.
      if (candidates.some((c) => rule.pattern.test(c))) ignored = !rule.negate;
    }
    return ignored;
  };
}

// -------------------------------------------------------------------------------------------------
// Replay

/** Stages on a distroless image: there is no shell in them, so a RUN there is an error. */
export function isDistroless(stage: Stage): boolean {
  return stage.image.startsWith('gcr.io/distroless/');
}

/**
 * The environment for replayed RUN steps: the Node 24 in nodeBinDir first on PATH; npm's own variables
 * from an enclosing `npm test` dropped, so that they do not steer the nested npm (prefix, cache, omit...).
 */
export function replayRunEnv(nodeBinDir: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) if (!/^npm_/i.test(key) && key !== 'INIT_CWD' && key !== 'NODE_ENV') env[key] = value;
  env.PATH = `${nodeBinDir}:${process.env.PATH ?? '/usr/bin:/bin'}`;
  return env;
}

export interface ReplayedStage {
  stage: Stage;
  /** Host directory standing for the stage's filesystem root. */
  root: string;
  /** WORKDIR at the end of the stage (a container path). */
  workdir: string;
  env: Record<string, string>;
}

export interface ReplayOptions {
  /** Build context (the repository). */
  context: string;
  /** Empty host directory for the stage roots. */
  workDir: string;
  /** Environment for RUN steps (PATH with Node 24 first, npm cache...). */
  runEnv: NodeJS.ProcessEnv;
  /** Stages whose image has no shell (distroless): RUN there is an error, but for an exec form of `imageCommands`. */
  shellless: (stage: Stage) => boolean;
  /** Binaries a shell-less image has (its path there -> the host binary standing in): /nodejs/bin/node. */
  imageCommands?: Record<string, string>;
  log?: (line: string) => void;
}

function run(command: string[], cwd: string, env: NodeJS.ProcessEnv, log: (line: string) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command[0]!, command.slice(1), { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.setEncoding('utf8').on('data', (c: string) => (output += c));
    child.stderr.setEncoding('utf8').on('data', (c: string) => (output += c));
    child.on('error', reject);
    child.on('close', (code) => {
      log(output);
      if (code === 0) resolve();
      else reject(new Error(`${command.join(' ')} exited ${code}:\n${output.slice(-4000)}`));
    });
  });
}

/**
 * Replays every stage's WORKDIR/ENV/COPY/RUN on the host, each stage in its own directory: COPY from the
 * context honours .dockerignore, COPY --from takes the named stage's files, RUN runs in WORKDIR. Anything
 * else this reader does not know fails, so the Dockerfile cannot drift past the test unnoticed.
 */
export async function replayDockerfile(stages: Stage[], options: ReplayOptions): Promise<ReplayedStage[]> {
  const log = options.log ?? (() => {});
  const ignoreFile = await readFile(join(options.context, '.dockerignore'), 'utf8').catch(() => '');
  const ignored = parseDockerignore(ignoreFile);
  const done: ReplayedStage[] = [];
  for (const stage of stages) {
    if (stage.image !== 'scratch' && done.some((d) => d.stage.name === stage.image)) throw new Error('FROM <earlier stage> is not supported by this replay');
    const root = join(options.workDir, `stage-${stage.index}${stage.name ? `-${stage.name}` : ''}`);
    await mkdir(root, { recursive: true });
    const state: ReplayedStage = { stage, root, workdir: '/', env: {} };
    const host = (containerPath: string): string => join(root, posix.resolve(state.workdir, containerPath));
    for (const ins of stage.instructions) {
      switch (ins.keyword) {
        case 'WORKDIR':
          state.workdir = posix.resolve(state.workdir, ins.args);
          await mkdir(host('.'), { recursive: true });
          break;
        case 'ENV':
          Object.assign(state.env, envOf({ ...stage, instructions: [ins] }));
          break;
        case 'COPY': {
          const tokens = ins.args.split(/\s+/);
          let from: string | undefined;
          while (tokens[0]?.startsWith('--')) {
            const flag = tokens.shift()!;
            if (flag.startsWith('--from=')) from = flag.slice('--from='.length);
            else if (!/^--(chown|chmod)=/.test(flag)) throw new Error(`line ${ins.line}: COPY ${flag} is not supported by this replay`);
          }
          if (tokens.length < 2 || execForm(ins.args)) throw new Error(`line ${ins.line}: cannot read COPY ${ins.args}`);
          const dest = tokens.pop()!;
          const source = from === undefined ? undefined : done.find((d) => d.stage.name === from || String(d.stage.index) === from);
          if (from !== undefined && !source) throw new Error(`line ${ins.line}: COPY --from=${from}: no such earlier stage`);
          const intoDir = dest.endsWith('/') || tokens.length > 1;
          for (const src of tokens) {
            if (/[*?[]/.test(src)) throw new Error(`line ${ins.line}: wildcards in COPY are not supported by this replay`);
            let srcPath: string;
            if (source) srcPath = join(source.root, posix.resolve(source.workdir, src));
            else {
              const rel = posix
                .normalize(src)
                .replace(/^\.?\/+/, '')
                .replace(/\/+$/, '');
              if (rel.startsWith('..')) throw new Error(`line ${ins.line}: COPY ${src} is outside the context`);
              if (ignored(rel)) throw new Error(`line ${ins.line}: COPY ${src}: excluded by .dockerignore`);
              srcPath = join(options.context, rel);
            }
            const isDir = (await stat(srcPath)).isDirectory();
            const target = host(dest);
            const to = !isDir && intoDir ? join(target, basename(srcPath)) : target;
            await mkdir(isDir ? to : dirname(to), { recursive: true });
            await cp(srcPath, to, {
              recursive: true,
              verbatimSymlinks: true,
              filter: source ? undefined : (path: string) => !ignored(relative(options.context, path).split('\\').join('/')),
            });
          }
          break;
        }
        case 'RUN': {
          let command = execForm(ins.args) ?? ['/bin/sh', '-c', ins.args];
          if (options.shellless(stage)) {
            const standIn = execForm(ins.args) && options.imageCommands?.[command[0]!];
            if (!standIn) throw new Error(`line ${ins.line}: RUN ${ins.args} in ${stage.image}, which has no shell and no such binary here`);
            command = [standIn, ...command.slice(1)];
          }
          log(`[${stage.name ?? stage.index}] RUN ${ins.args}`);
          await run(command, host('.'), { ...options.runEnv, ...state.env }, log);
          break;
        }
        case 'USER':
        case 'EXPOSE':
        case 'ENTRYPOINT':
        case 'CMD':
        case 'LABEL':
          break;
        default:
          throw new Error(`line ${ins.line}: ${ins.keyword} is not supported by this replay`);
      }
    }
    done.push(state);
  }
  return done;
}

/**
 * The Node flags between the node binary and what it starts in the Dockerfile's ENTRYPOINT (exec form): the
 * start-up snapshot (`--snapshot-blob BLOB`) or dist/cli/main.js. What the image runs with, so that every
 * measured daemon runs with the same.
 */
export function imageNodeFlags(dockerfile: string): string[] {
  return imageEntrypoint(dockerfile).flags;
}

/** The Dockerfile's ENTRYPOINT (exec form) read as the node binary, its flags, and the blob or script it starts. */
export function imageEntrypoint(dockerfile: string): { node: string; flags: string[]; blob?: string; script?: string } {
  const args = instructions(parseDockerfile(dockerfile).at(-1)!, 'ENTRYPOINT').at(-1)?.args;
  const argv = args === undefined ? undefined : execForm(args);
  if (!argv) throw new Error('Dockerfile: no ENTRYPOINT in exec form');
  const blob = argv.indexOf('--snapshot-blob');
  if (blob >= 1 && blob === argv.length - 2) return { node: argv[0]!, flags: argv.slice(1, blob), blob: argv[blob + 1]! };
  const main = argv.indexOf('dist/cli/main.js');
  if (main < 1) throw new Error(`Dockerfile: ENTRYPOINT ${args} runs neither dist/cli/main.js nor a --snapshot-blob`);
  return { node: argv[0]!, flags: argv.slice(1, main), script: argv[main]! };
}

/** The arguments of the stage's last `keyword` instruction (the one that takes effect), if any. */
export function lastArgs(stage: Stage, keyword: string): string | undefined {
  return instructions(stage, keyword).at(-1)?.args;
}

/** The distroless image's nonroot user and group, numeric (the kubelet checks runAsNonRoot against a number). */
export const NONROOT_UID = 65532;
