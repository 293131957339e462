#!/bin/bash
cd /work/main
N=node_modules/node/bin/node
for round in 1 2 3; do
for v in fresh existing; do
  port=$((20000 + RANDOM % 1000))
  [ $v = fresh ] && rm -rf /tmp/bx/certs
  taskset -c 0 $N dist/cli/main.js run --localapi /tmp/bx/ts.sock --domain a.tailnet-0000.ts.net --store dir:/tmp/bx/certs --listen 127.0.0.1:$port > /dev/null & P=$!
  sleep 3
  taskset -c 1 $N node_modules/autocannon/autocannon.js -c 10 -d 2 http://127.0.0.1:$port/healthz > /dev/null 2>&1
  R=$(taskset -c 1 $N node_modules/autocannon/autocannon.js -c 10 -d 4 --json http://127.0.0.1:$port/healthz 2>/dev/null | python3 -c "import json,sys;d=json.load(sys.stdin);print(int(d['2xx']/d['duration']), d['non2xx'])")
  echo "round $round [$v] $R"
  kill $P; wait $P 2>/dev/null
done; done
