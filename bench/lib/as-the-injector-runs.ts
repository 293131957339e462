// Imported first by bench/injector-packages.ts: V8 without its optimizing compilers from here on, as
// `certshare injector` runs (src/cli/main.ts), before the packages load.
import { withoutOptimizingCompilers } from '../../src/http/heap-saving.ts';

withoutOptimizingCompilers();
