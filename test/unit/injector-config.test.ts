// The injector's configuration: the syntax of each value where it is parsed, every other rule in one table
// (validateInjectorConfig), the first broken one a CERTSHARE_BAD_FLAG before anything starts; and the
// injection's check of the defaults (checkDefaults), which the injector runs first at its start.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseFlags } from '../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom, validateInjectorConfig } from '../../src/config/injector-options.ts';
import { checkDefaults } from '../../src/injector/injector.ts';

const config = (args: string[]) => injectorConfigFrom(parseFlags(INJECTOR_FLAGS, args, {}), {});

describe("the injector's configuration: one validation table", () => {
  it('accepts its defaults', () => {
    assert.equal(validateInjectorConfig(config([])), undefined);
    checkDefaults(config([]).defaults);
  });

  const refused: Array<[string, string[], RegExp]> = [
    ['a CA rotated after it expires', ['--ca-rotate-before', '9000h'], /^--ca-lifetime, --ca-rotate-before, .*: /],
    ['another mode', ['--default-mode', 'writer'], /--default-mode: must be rw, ro or auto, got "writer"/],
    ['another log level', ['--log-level', 'loud'], /--log-level: must be debug, info, warn, error/],
    ['no resync', ['--resync', '0s'], /--resync, --kube-timeout: must be positive/],
    ['no API timeout', ['--kube-timeout', '0s'], /--resync, --kube-timeout: must be positive/],
    ['a Lease shorter than a second', ['--lease-duration', '500ms'], /--lease-duration: must be at least 1s/],
    [
      'resources the apiserver refuses',
      ['--sidecar-resources', '{"requests":{"memory":"1Gi"},"limits":{"memory":"1Mi"}}'],
      /--sidecar-resources: requests\.memory/,
    ],
  ];
  for (const [what, args, message] of refused) {
    it(`refuses ${what} with CERTSHARE_BAD_FLAG`, () => {
      assert.throws(
        () => config(args),
        (err: Error & { code?: string }) => err.code === 'CERTSHARE_BAD_FLAG' && message.test(err.message),
      );
    });
  }

  const refusedAtStart: Array<[string, string[], RegExp]> = [
    [
      'defaults that refuse every Pod',
      ['--default-out-dir', '/var/run/tailscale'],
      /the injector's defaults .* would refuse every Pod that asks for certshare: .*overlaps \/var\/run\/tailscale/,
    ],
    ['a platform flag the daemon refuses', ['--sidecar-flags=--renew-fraction=2'], /would refuse every Pod .*--renew-fraction: must be between 0 and 1/],
    ['a platform flag a Pod sets', ['--sidecar-flags=--mode=ro'], /^--sidecar-flags: --mode is set by certshare\.io\/mode/],
  ];
  for (const [what, args, message] of refusedAtStart) {
    it(`refuses at the injector's start ${what} with CERTSHARE_BAD_FLAG`, () => {
      assert.throws(
        () => checkDefaults(config(args).defaults),
        (err: Error & { code?: string }) => err.code === 'CERTSHARE_BAD_FLAG' && message.test(err.message),
      );
    });
  }

  it('reports the first broken rule of the table, in its order', () => {
    const c = config([]);
    assert.match(validateInjectorConfig({ ...c, logLevel: 'loud', resyncMs: 0 })?.flag ?? '', /--log-level/);
    assert.match(validateInjectorConfig({ ...c, resyncMs: 0, leaseDurationMs: 1 })?.flag ?? '', /--resync/);
  });
});
