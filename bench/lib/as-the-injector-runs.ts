// Imported first by bench/injector-packages.ts: V8 without its optimizing compilers and Node's small Buffer
// pool from here on, as `certshare injector` runs (src/cli/main.ts), before the packages load.
import { smallBufferPool, withoutOptimizingCompilers } from '../../src/http/heap-saving.ts';

withoutOptimizingCompilers();
smallBufferPool();
