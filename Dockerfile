# syntax=docker/dockerfile:1
# certshare's image: the compiled daemon on distroless Node 24, running as nonroot (uid 65532).
#   make image      # docker build -t certshare:dev .
# Only package.json, the production node_modules and dist/ reach the final stage. It writes nothing
# outside its mounted volumes, so it runs with readOnlyRootFilesystem: true.
# test/manifests/image.test.ts replays the COPY and RUN steps of this file outside Docker and runs the
# result: keep to plain `FROM/WORKDIR/COPY/RUN/ENV/USER/EXPOSE/ENTRYPOINT/CMD` lines, one per line.

# Build stages on Debian (glibc), like the distroless runtime: a native addon compiled here would load
# there too, which is not true of Alpine (musl). Pin by digest for reproducible builds.
FROM node:24-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
# --ignore-scripts: the `node` devDependency (the pinned Node for the test suite) would otherwise
# download a second Node binary; this stage already runs Node 24.
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
# tsc -p tsconfig.build.json: src/**/*.ts -> dist/**/*.js (relative `.ts` imports rewritten to `.js`).
RUN npm run build

# Production dependencies only, in a clean folder: no typescript, no `node` package (~100 MB).
FROM node:24-bookworm-slim AS prod-deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund
# Not needed at run time: source maps and type declarations (about 18 MB, mostly @kubernetes/client-node).
RUN find node_modules -type f \( -name '*.map' -o -name '*.d.ts' -o -name '*.d.mts' -o -name '*.d.cts' \) -delete && rm -rf node_modules/@types

FROM gcr.io/distroless/nodejs24-debian13:nonroot
WORKDIR /app
ENV NODE_ENV=production
# package.json carries "type": "module": dist/ is ES modules.
COPY --from=prod-deps /app/package.json ./package.json
COPY --from=prod-deps /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
USER nonroot
EXPOSE 9002
# Node directly (never through npm): signals reach the daemon, which drains and exits within
# --shutdown-timeout. Arguments after the image name replace CMD, e.g. `run --help` or `emulator`.
ENTRYPOINT ["/nodejs/bin/node", "dist/cli/main.js"]
CMD ["run"]
