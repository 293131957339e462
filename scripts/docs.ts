// `npm run docs`: writes docs/configuration.md from the flag definitions (scripts/lib/configuration-page.ts).
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { configurationPage } from './lib/configuration-page.ts';

const page = join(import.meta.dirname, '..', 'docs', 'configuration.md');
writeFileSync(page, configurationPage());
process.stdout.write(`wrote ${page}\n`);
