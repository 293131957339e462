// GET /leave-rotation: how a preStop hook asks the sidecar to leave rotation before the Pod's containers
// stop. A module of its own so that the injector (which writes the hook) does not load the HTTP server.

/** The header carrying --leave-token. */
export const LEAVE_TOKEN_HEADER = 'certshare-leave-token';
export const LEAVE_ROTATION_PATH = '/leave-rotation';
