// Where certshare and its advertise agent exchange files, under the directory both are given: a module of its
// own so that the injector (which mounts the two volumes) loads none of the exchange's code.

/** certshare's request volume, read-only to the agent. */
export const REQUEST_DIR = 'request';
/** The agent's status volume, read-only to certshare. */
export const STATUS_DIR = 'status';
