// V8's memory-saving heap mode, switched on when a daemon manages enough domains for it to pay.
import { Buffer } from 'node:buffer';
import { setFlagsFromString } from 'node:v8';

/**
 * From this many managed domains on, the heap runs as when memory is short: large groups hold far less
 * with it, while a small daemon would pay in /healthz throughput for almost no saving (docs/performance.md,
 * `npm run bench -- --domains 500`). 50 is not tuned: well above a proxy's usual handful of domains, below
 * the 100 where the bench's scale table starts.
 */
const HEAP_SAVING_DOMAINS = 50;

/**
 * `--optimize-for-size` (Heap::ShouldOptimizeForMemoryUsage: the old generation grows by small steps, full
 * collections give memory back) set at run time: V8 reads it at each heap-sizing decision, and Node leaves
 * V8's flags writable after start. On the command line it would tax every small daemon's /healthz for a
 * saving only large groups see. Once on, it stays on (a group that shrank keeps its habits: no flapping).
 * Returns whether this call switched it on.
 */
export function heapSavingSwitch(threshold = HEAP_SAVING_DOMAINS, setFlags: (flags: string) => void = setFlagsFromString): (managedDomains: number) => boolean {
  let on = false;
  return (managedDomains) => {
    if (on || managedDomains < threshold) return false;
    setFlags('--optimize-for-size');
    on = true;
    return true;
  };
}

/**
 * V8 without its optimizing compilers (Sparkplug, Maglev, TurboFan): every function stays bytecode, and the
 * heap of a small process without a hot path is what it keeps. For the injector, whose admissions are a few
 * milliseconds of JavaScript each: the compilers' machine code and working memory never come, at the same
 * admission latency (docs/performance.md). Not for `run`: /healthz would cost several times the CPU per
 * response. Set at run time before the command's code loads (Node leaves V8's flags writable), so the image
 * keeps one ENTRYPOINT for every command; on the command line they would also cover the pages Node's own
 * start-up compiles before any flag can be set here.
 */
export function withoutOptimizingCompilers(setFlags: (flags: string) => void = setFlagsFromString): void {
  for (const flag of ['--no-sparkplug', '--no-maglev', '--no-turbofan', '--optimize-for-size']) setFlags(flag);
}

/**
 * Node's pool of small Buffers at 8 KiB instead of Node 24's 64 KiB, for the injector: an admission takes a
 * few small Buffers from the pool, a pool lives on until its last slice is collected, and an idle injector
 * seldom collects, so with 64 KiB pools it stays resident with the pools of the admissions before
 * (docs/performance.md). A Buffer over half the pool gets one of its own size.
 */
export function smallBufferPool(buffer: { poolSize: number } = Buffer): void {
  buffer.poolSize = 8 * 1024;
}

/**
 * Maglev and TurboFan off while the daemon starts, back on from the returned function's call (once it has
 * started). A start runs its code once, yet module resolution (a path normalized a few hundred times for the
 * bundle's chunks) gets hot enough for TurboFan, and the first TurboFan compilation pages in its compiler:
 * about 5 MB more RSS in an idle replica for code that never runs again (docs/performance.md). From the call
 * on, V8 tiers up as it always does: whatever is hot later (/healthz under load) is optimized as before.
 */
export function optimizingCompilersAfterStart(
  setFlags: (flags: string) => void = setFlagsFromString,
  nodeFlags: string[] = [...process.execArgv, ...(process.env.NODE_OPTIONS ?? '').split(/\s+/)],
): () => void {
  // Tiers the command line chose itself (--jitless, --no-opt...) are left as they are: turning a compiler
  // on in a process started without a JIT crashes it.
  if (nodeFlags.some((flag) => TIER_FLAGS.test(flag))) return () => {};
  setFlags('--no-maglev');
  setFlags('--no-turbofan');
  let on = false;
  return () => {
    if (on) return;
    on = true;
    setFlags('--maglev');
    setFlags('--turbofan');
  };
}

/** Node flags that choose V8's compiler tiers. */
const TIER_FLAGS = /^--(no[-_])?(jitless|lite[-_]mode|opt|turbofan|maglev|sparkplug|max[-_]opt)\b/;
