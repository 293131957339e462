// npm puts node_modules/.bin (the pinned `node` package) first on PATH; fail loudly if it did not.
const major = Number(process.versions.node.split('.')[0]);
if (major !== 24) {
  console.error(`certshare needs Node 24 (found ${process.version}); run "npm ci" so the pinned node is used`);
  process.exit(1);
}
