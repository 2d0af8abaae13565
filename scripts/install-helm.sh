#!/usr/bin/env bash
# Installs helm (for the Helm chart's tests, crates/qos-agent/tests/all/helm_chart.rs) into /usr/local/bin with
# `go install` through the Go module proxy, when there is none on PATH. Needs a Go toolchain (go on PATH or
# /usr/local/go/bin/go; helm v3.22 needs Go >= 1.25). Measured on the 2-core CI machine kind: several minutes
# (downloading and compiling ~200 modules), so scripts/test.sh runs it in the background at idle CPU priority.
set -euo pipefail
HELM_VERSION=v3.22.0
if command -v helm >/dev/null 2>&1; then
  echo "install-helm: $(command -v helm) is there: $(helm version --short 2>/dev/null)"
  exit 0
fi
GO=$(command -v go || echo /usr/local/go/bin/go)
[ -x "$GO" ] || { echo "install-helm: no Go toolchain (go on PATH or /usr/local/go/bin/go) to build helm" >&2; exit 1; }
start=$(date +%s)
GOBIN=${GOBIN:-/usr/local/bin} GOFLAGS=-modcacherw "$GO" install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
echo "install-helm: helm $HELM_VERSION built with $("$GO" version | cut -d' ' -f3) in $(( $(date +%s) - start )) s"
