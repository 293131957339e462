// `npm run check:width` (part of `npm test` and `npm run lint`): no source line wider than Biome's
// formatter.lineWidth. Biome formats to that width but never breaks a string, template or regex
// literal, so a long one passes `biome check` while overrunning the width; this finds those.
import { readFileSync } from 'node:fs';
import { glob } from 'node:fs/promises';
import { join } from 'node:path';

const ROOT = join(import.meta.dirname, '..');
const DIRS = ['src', 'test', 'bench', 'scripts', 'bin'];

function configuredWidth(): number {
  const config = JSON.parse(readFileSync(join(ROOT, 'biome.json'), 'utf8')) as { formatter?: { lineWidth?: unknown } };
  const width = config.formatter?.lineWidth;
  if (typeof width !== 'number' || !Number.isInteger(width) || width <= 0) {
    throw new Error(`biome.json: formatter.lineWidth is ${JSON.stringify(width)}, expected a positive integer`);
  }
  return width;
}

const width = configuredWidth();
const files: string[] = [];
for (const dir of DIRS) for await (const file of glob(`${dir}/**/*.{ts,js}`, { cwd: ROOT })) files.push(file);
files.sort();

let over = 0;
for (const file of files) {
  const lines = readFileSync(join(ROOT, file), 'utf8').split(/\r?\n/);
  for (const [i, line] of lines.entries()) {
    // Code points, not UTF-16 units: a character outside the BMP is one column.
    const length = [...line].length;
    if (length > width) {
      console.log(`${file}:${i + 1}: ${length} characters`);
      over++;
    }
  }
}
if (over > 0) {
  console.error(`${over} line(s) wider than ${width} characters (biome.json formatter.lineWidth); split long strings with +`);
  process.exit(1);
}
