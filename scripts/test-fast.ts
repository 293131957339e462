// `npm run test:fast`: the unit and integration tiers (test/unit, test/integration), the tests that need no
// real dependency (no kube-apiserver, no tailscaled, no cluster, no Go build), for the edit-test loop.
// `npm test` runs every tier. test/repo/tiers.test.ts keeps a real dependency out of these two folders.
import { spawnSync } from 'node:child_process';

const TIERS = ['test/unit/**/*.test.ts', 'test/integration/**/*.test.ts'];
// Property tests that read CERTSHARE_PROPERTY_RUNS run 50 cases each here; `npm test` keeps their full
// counts (150, 300 and 100 in issuance-properties, renewal-info-properties, issuance-budget).
const env = { CERTSHARE_PROPERTY_RUNS: '50', ...process.env };
// Four files at once on two CPUs: the slowest ones mostly wait on real seconds (certificates that live
// seconds) with the CPU idle.
const result = spawnSync(process.execPath, ['--test', '--test-concurrency=4', ...TIERS, ...process.argv.slice(2)], { stdio: 'inherit', env });
process.exit(result.status ?? 1);
