// V8's memory-saving heap mode, switched on when a daemon manages enough domains for it to pay.
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
