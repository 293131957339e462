SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c

.PHONY: cluster image

IMAGE ?= certshare:dev

# etcd + kube-apiserver on 127.0.0.1 in the foreground (Ctrl-C stops); writes .cluster/kubeconfig
# and .cluster/bin/kubectl. The first run builds the binaries from Go modules (slow, cached).
cluster:
	npm run cluster

# The container image (see Dockerfile); needs a Docker engine. IMAGE=... to name it otherwise.
image:
	docker build -t $(IMAGE) .
