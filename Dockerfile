# syntax=docker/dockerfile:1
# certshare's image: the bundled daemon on distroless Node 24, running as nonroot (uid 65532).
#   make image      # docker build -t certshare:dev .
# Only dist/ reaches the final stage: `npm run build` (scripts/build.ts) bundles our code with the
# production dependencies, exactly those `npm ci --omit=dev` would install (devDependencies are kept
# out), into dist/cli/main.js and chunks loaded on demand. One bundle instead of ~1,000 module files
# saves ~40 MB of RSS per replica (npm run bench). It writes nothing outside its mounted volumes, so it
# runs with readOnlyRootFilesystem: true.
# test/repo/image.test.ts replays the COPY and RUN steps of this file outside Docker and runs the
# result: keep to plain `FROM/WORKDIR/COPY/RUN/ENV/USER/EXPOSE/ENTRYPOINT/CMD` lines, one per line.

# The build stage on Debian (glibc), like the distroless runtime. Pin by digest for reproducible builds.
FROM node:24-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
# --ignore-scripts: the `node` devDependency (the pinned Node for the test suite) would otherwise
# download a second Node binary; this stage already runs Node 24. esbuild finds its binary in its
# platform package (@esbuild/linux-*) without its install script.
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json ./
COPY scripts/build.ts ./scripts/build.ts
COPY src ./src
RUN npm run build
# `npm run build` also fills dist/compile-cache and builds the start-up snapshot's blob for this stage's Node
# (and root), which the image never runs: the final stage makes its own (below), so these stay behind.
RUN rm -rf dist/compile-cache dist/snapshot/certshare-run.blob

FROM gcr.io/distroless/nodejs24-debian13:nonroot
WORKDIR /app
ENV NODE_ENV=production
# dist/package.json says "type": "module"; no node_modules: the bundle holds the dependencies.
COPY --from=build /app/dist ./dist
# Node's compile cache for the Node this image ships and the account it runs as (Node keeps one per uid;
# src/cli/compile-cache.ts): every start reads V8's code for the bundle instead of compiling it (~25-35 ms
# of a ~300 ms start on the bench's machine). Exec form: no shell here. The entries end up root's and
# readable by all: the daemon reads them and writes nothing (readOnlyRootFilesystem holds).
RUN ["/nodejs/bin/node", "dist/cli/fill-compile-cache.js", "65532"]
# The standalone daemon's V8 startup snapshot, built by the Node this image ships (a blob from another Node is
# refused at start) and started once: a blob that cannot start fails the build, CERTSHARE_SNAPSHOT_UNUSABLE
# (src/cli/snapshot-blob.ts). Root's, readable by all, like the compile cache.
RUN ["/nodejs/bin/node", "dist/cli/build-snapshot.js"]
# Numeric, not `nonroot`: the kubelet can check runAsNonRoot only against a number, and a Pod with
# runAsNonRoot: true and no runAsUser (a common Pod Security setup) otherwise does not start ("image has
# non-numeric user (nonroot), cannot verify user is non-root"; seen on the real-cluster tier, test/cluster/e2e).
USER 65532:65532
EXPOSE 9002
# Node directly (never through npm): signals reach the daemon, which drains and exits within
# --shutdown-timeout. Arguments after the image name replace CMD, e.g. `run --help` or `emulator`.
# The default entry starts from the start-up snapshot: `run` with a directory store begins with its modules
# evaluated, in less CPU and memory than dist/cli/main.js (docs/performance.md, Start-up); any other command is handed to dist/cli/main.js and keeps the snapshot's heap unused, so Kubernetes
# workloads (the injected sidecar, the injector) name `node --max-semi-space-size=1 dist/cli/main.js` as
# their command instead (src/injector/sidecar.ts DIST_COMMAND; test/repo/entry-commands.test.ts).
# V8 sizes its young generation from the memory it sees (3 x 32 MB semi-spaces on a large node), and
# keeps what a start-up or a mass renewal grew it to: 115 MB of RSS per replica at 300 domains. 1 MB
# semi-spaces keep it at 3 MB (npm run bench -- --domains; the bench runs these same flags).
# Not --optimize-for-size here: the daemon sets it itself once it manages 50 domains or more
# (src/http/heap-saving.ts). On the command line it cost every small daemon ~20% of its /healthz
# throughput for ~0.3 MB; a large group keeps its saving (npm run bench -- --domains 500).
ENTRYPOINT ["/nodejs/bin/node", "--max-semi-space-size=1", "--snapshot-blob", "dist/snapshot/certshare-run.blob"]
CMD ["run"]
