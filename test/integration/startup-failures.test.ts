import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { tempDir } from '../support/standalone.ts';
import { portInUse, runStartupCase, STARTUP_FAILURES } from '../support/startup-failures.ts';

const BIN = fileURLToPath(new URL('../../bin/certshare.js', import.meta.url));
// A start-up failure exits in well under a second (how fast: node bench/startup-failures.ts, not a test: a
// loaded machine once took 9.9 s for what takes 0.3); the cap turns a process that never exits into a failure.
const CAP_MS = 15_000;

describe('every start-up failure ends the process, with nothing left listening and no loop started', () => {
  for (const c of STARTUP_FAILURES) {
    it(`${c.name}: exit ${c.exitCode}`, async () => {
      const dir = await tempDir();
      try {
        const run = await runStartupCase([process.execPath, BIN, 'run'], c, dir.path, CAP_MS);
        assert.equal(run.killed, false, `still running after ${CAP_MS} ms; stderr: ${run.stderr}`);
        assert.equal(run.code, c.exitCode, `exit code; stderr: ${run.stderr}`);
        assert.match(run.stderr, c.stderr);
        assert.equal(run.stderr.trim().split('\n').length, 1, `one line: ${run.stderr}`);
        assert.equal(await portInUse(run.port), false, 'the listen port is free');
        assert.doesNotMatch(run.stdout, /"msg":"(certshare started|managing domain)"/, 'no loop started');
      } finally {
        await dir.remove();
      }
    });
  }
});
