// A CA joining the rotation state's bundle, as the injector's controller records it by reading its CA
// Secret back (src/injector/controller.ts): the tests that drive decideRotation by hand record it here.
import type { CaRecord, RotationState } from '../../src/core/injector-ca/ca-rotation.ts';

export function withCa(s: RotationState, ca: CaRecord): RotationState {
  return { ...s, bundle: [...s.bundle, ca] };
}
